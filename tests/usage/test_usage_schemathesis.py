"""schemathesis against the app's own OpenAPI document, served by gunicorn: no server errors,
no status, header, content-type or schema violations, for valid and invalid inputs."""

from __future__ import annotations

from collections import Counter
from typing import Any

import hypothesis
import schemathesis
from hypothesis import HealthCheck, Phase
from support.redis_server import RedisServer
from support.sidecar import Gunicorn

from .test_usage_gunicorn import account
from .usage_helpers import bearer

MAX_EXAMPLES = 20


def fuzz(
    operation: Any,
    mode: schemathesis.GenerationMode,
    headers: dict[str, str] | None,
    seen: Counter[tuple[str, int]],
) -> None:
    """Generate and check up to MAX_EXAMPLES cases of one operation in one mode."""

    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def run(case: schemathesis.Case) -> None:
        response = case.call_and_validate(headers=headers)
        seen[(case.operation.label, response.status_code)] += 1

    run()


def test_schemathesis_finds_no_violations(sidecar: Gunicorn, redis_server: RedisServer) -> None:
    _, token, _ = account(redis_server.url, "pro")
    schema = schemathesis.openapi.from_url(sidecar.base + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {
        "GET /api/v2/user/usage",
        "HEAD /api/v2/user/usage",
        "OPTIONS /api/v2/user/usage",
        "GET /health",
    }
    seen: Counter[tuple[str, int]] = Counter()
    for operation in operations:
        # Valid inputs carry the valid token; invalid ones are sent as generated (their
        # Authorization header may be missing or mangled on purpose).
        fuzz(operation, schemathesis.GenerationMode.POSITIVE, bearer(token), seen)
        try:
            fuzz(operation, schemathesis.GenerationMode.NEGATIVE, None, seen)
        except hypothesis.errors.Unsatisfiable:
            # Nothing to make invalid (no parameters, no security): no negative cases.
            assert not operation.definition.raw.get("parameters")
    # Both accepted and refused inputs were exercised.
    assert seen[("GET /api/v2/user/usage", 200)] > 0
    assert seen[("GET /api/v2/user/usage", 400)] > 0, seen
    assert seen[("GET /api/v2/user/usage", 401)] > 0, seen
