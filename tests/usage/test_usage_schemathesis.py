"""schemathesis against the app's own OpenAPI document, served by gunicorn: no server errors,
no status, header, content-type or schema violations, for valid and invalid inputs."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, date, datetime, timedelta

import hypothesis
import schemathesis
from support.fuzz import fuzz
from support.redis_server import RedisServer
from support.sidecar import Gunicorn

from sidecars.usage.resources import MAX_HISTORY_DAYS

from .test_usage_gunicorn import account
from .usage_helpers import bearer


def valid_as_a_whole(case: schemathesis.Case) -> None:
    """Make a schema-valid case valid as a whole, where the API has rules a schema cannot
    state (positive cases must be accepted; refusals are checked in negative mode and by
    their own tests): a history range has `from` <= `to` and at most 400 days, and an
    Idempotency-Key names one request (generated keys repeat across cases, so each case's
    key gets a unique suffix)."""
    headers = case.headers or {}
    if "Idempotency-Key" in headers:
        headers["Idempotency-Key"] = headers["Idempotency-Key"][:200] + "-" + uuid.uuid4().hex
    if case.operation.path.endswith("/history") and case.query is not None:
        last = _date(case.query.get("to")) or datetime.now(UTC).date()
        first = _date(case.query.get("from")) or last - timedelta(days=29)
        if first > last:
            first, last = last, first
        first = max(first, last - timedelta(days=MAX_HISTORY_DAYS - 1))
        case.query.update({"from": first.isoformat(), "to": last.isoformat()})


def _date(value: object) -> date | None:
    try:
        return date.fromisoformat(str(value)) if value is not None else None
    except ValueError:
        return None


def test_schemathesis_finds_no_violations(sidecar: Gunicorn, redis_server: RedisServer) -> None:
    _, token, _ = account(redis_server.url, "pro")
    schema = schemathesis.openapi.from_url(sidecar.base + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {
        "GET /api/v2/user/usage",
        "HEAD /api/v2/user/usage",
        "OPTIONS /api/v2/user/usage",
        "GET /api/v2/user/usage/history",
        "HEAD /api/v2/user/usage/history",
        "OPTIONS /api/v2/user/usage/history",
        "GET /health",
    }
    seen: Counter[tuple[str, int]] = Counter()
    for operation in operations:
        # Valid inputs carry the valid token; invalid ones are sent as generated (their
        # Authorization header may be missing or mangled on purpose).
        fuzz(
            operation,
            schemathesis.GenerationMode.POSITIVE,
            seen,
            bearer(token),
            prepare=valid_as_a_whole,
        )
        try:
            fuzz(operation, schemathesis.GenerationMode.NEGATIVE, seen)
        except hypothesis.errors.Unsatisfiable:
            # Nothing to make invalid (no parameters, no security): no negative cases.
            assert not operation.definition.raw.get("parameters")
    # Both accepted and refused inputs were exercised.
    assert seen[("GET /api/v2/user/usage", 200)] > 0
    # Invalid inputs are sent without the token, so they are refused 401 before their
    # parameters are looked at (the parameters' 400s have tests of their own).
    assert seen[("GET /api/v2/user/usage", 401)] > 0, seen
    assert seen[("GET /api/v2/user/usage/history", 200)] > 0, seen
    assert seen[("GET /api/v2/user/usage/history", 400)] > 0, seen
