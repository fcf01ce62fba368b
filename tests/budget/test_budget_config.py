"""The `budget:` block of a rule, and how a budget call is recognised in a descriptor."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ratelimitd.budget.calls import recognise
from ratelimitd.config.budget_store import RELEASE, RESERVE, SETTLE
from ratelimitd.config.budgets import BudgetSpec, budget_spec, domain_keys
from ratelimitd.config.errors import ConfigError


def spec(text: str) -> BudgetSpec:
    return budget_spec("llm.yaml", "llm.user", yaml.safe_load(text), line=7)


def test_defaults() -> None:
    assert spec("{}") == spec("null") == BudgetSpec("phase", "txn", "charge_served", 600_000)


def test_every_field() -> None:
    got = spec("{phase_key: stage, transaction_key: id, unsettled: charge, reservation_ttl: 5m30s}")
    assert got == BudgetSpec("stage", "id", "charge", 330_000)
    assert spec("{outbox: 'settled:tokens'}").outbox == "settled:tokens"


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (
            "reserve",
            "expected a mapping of phase_key, transaction_key, unsettled, "
            "reservation_ttl, outbox, got 'reserve'",
        ),
        ("{ttl: 5m}", "unknown field 'ttl'"),
        ("{phase_key: ''}", "phase_key must be a non-empty descriptor key, got ''"),
        ("{transaction_key: 3}", "transaction_key must be a non-empty descriptor key, got 3"),
        ("{phase_key: k, transaction_key: k}", "phase_key and transaction_key are both 'k'"),
        (
            "{unsettled: refund}",
            "unsettled must be one of charge_served, release, charge, got 'refund'",
        ),
        ("{reservation_ttl: 10}", "reservation_ttl must be a duration from 1s to 24h"),
        ("{reservation_ttl: 500ms}", "reservation_ttl must be a duration from 1s to 24h"),
        ("{reservation_ttl: 25h}", "reservation_ttl must be a duration from 1s to 24h"),
        ("{reservation_ttl: soon}", "it must exceed the route timeout"),
        ("{outbox: [a]}", "outbox must be a Redis stream key, got ['a']"),
    ],
)
def test_errors_name_the_rule_and_the_field(block: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        spec(block)
    assert str(err.value).startswith("llm.yaml: line 7: budget of 'llm.user': ")
    assert message in str(err.value)


def test_a_domain_recognises_budget_calls_by_one_pair_of_keys() -> None:
    same = {"llm.user": BudgetSpec(), "llm.team": BudgetSpec(ttl_ms=1000)}
    assert domain_keys("llm.yaml", same) == ("phase", "txn")
    assert domain_keys("llm.yaml", {}) is None
    with pytest.raises(
        ConfigError, match=r"'llm\.team' is recognised by stage/txn but 'llm\.user'"
    ):
        domain_keys("llm.yaml", {"llm.user": BudgetSpec(), "llm.team": BudgetSpec("stage")})


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        # What the example Envoy config sends: phase first, txn last.
        ([("phase", "reserve"), ("user", "u"), ("txn", "id1")], (RESERVE, "id1", [("user", "u")])),
        ([("phase", "settle"), ("user", "u"), ("txn", "id1")], (SETTLE, "id1", [("user", "u")])),
        ([("phase", "close"), ("user", "u"), ("txn", "id1")], (RELEASE, "id1", [("user", "u")])),
        # Any order; the other entries keep theirs.
        (
            [("txn", "x"), ("team", "t"), ("phase", "reserve"), ("user", "u")],
            (RESERVE, "x", [("team", "t"), ("user", "u")]),
        ),
        # Not a budget call: decided as sent.
        ([("phase", "reserve"), ("user", "u")], None),
        ([("user", "u"), ("txn", "id1")], None),
        ([("phase", "commit"), ("txn", "id1")], None),
        ([("phase", "reserve"), ("txn", "")], None),
        ([("phase", "reserve"), ("phase", "settle"), ("txn", "a")], None),
        ([("phase", "reserve"), ("txn", "a"), ("txn", "b")], None),
    ],
)
def test_recognise(entries: list[tuple[str, str]], expected: Any) -> None:
    got = recognise(entries, "phase", "txn")
    if expected is None:
        assert got is None
    else:
        assert got == (expected[0], expected[1], tuple(expected[2]))


def test_an_outbox_needs_the_redis_backend() -> None:
    from ratelimitd.config import ConfigFile, load_ruleset
    from ratelimitd.config.windows import FIXED_WINDOW, SLIDING_WINDOW

    text = (
        "domain: llm\ndescriptors:\n  - key: user\n"
        "    rate_limit: {unit: hour, requests_per_unit: 100}\n"
        "    budget: {outbox: settled}\n"
    )
    kept = frozenset({FIXED_WINDOW, SLIDING_WINDOW})
    with pytest.raises(ConfigError, match="outbox needs the redis backend, not memory"):
        load_ruleset([ConfigFile("llm.yaml", text)], backend=("memory", kept, kept))
    load_ruleset([ConfigFile("llm.yaml", text)], backend=("redis", kept, kept))
