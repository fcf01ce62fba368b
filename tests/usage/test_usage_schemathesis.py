"""schemathesis against the app's own OpenAPI document, served by gunicorn: no server errors,
no status, header, content-type or schema violations, for valid and invalid inputs."""

from __future__ import annotations

from collections import Counter

import hypothesis
import schemathesis
from support.fuzz import fuzz
from support.redis_server import RedisServer
from support.sidecar import Gunicorn

from .test_usage_gunicorn import account
from .usage_helpers import bearer


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
        fuzz(operation, schemathesis.GenerationMode.POSITIVE, seen, bearer(token))
        try:
            fuzz(operation, schemathesis.GenerationMode.NEGATIVE, seen)
        except hypothesis.errors.Unsatisfiable:
            # Nothing to make invalid (no parameters, no security): no negative cases.
            assert not operation.definition.raw.get("parameters")
    # Both accepted and refused inputs were exercised.
    assert seen[("GET /api/v2/user/usage", 200)] > 0
    assert seen[("GET /api/v2/user/usage", 400)] > 0, seen
    assert seen[("GET /api/v2/user/usage", 401)] > 0, seen
