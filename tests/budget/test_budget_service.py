"""Token budgets through the service (plan, count, verdict), as a gRPC call is decided: the
answers, the statistics (the reserved gauge; the settle, release, expire counters), the
admin /counters and /explain, idempotent stream ends and expiry by the rule's policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
from support.budget import Budget, call
from support.core import Decider

from ratelimitd.config import UNIT_BY_NAME
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor, Request
from ratelimitd.stats.mapper import MetricMapper, default_mapping_config
from ratelimitd.stats.prometheus import PrometheusSink

CONFIG = """\
domain: llm
descriptors:
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: 10000}}
    budget: {{unsettled: {unsettled}, reservation_ttl: 30s}}
"""
SERIES = Budget.SERIES
HOUR = UNIT_BY_NAME["HOUR"]


class Policy(NamedTuple):
    """An `unsettled` policy and what it charges of a 700-token reservation ending unsettled:
    by a stream end with a success status (`served`), with an error status (`failed`), and
    by its TTL (`expired`)."""

    unsettled: str
    served: int
    failed: int
    expired: int


POLICIES = [
    Policy("release", served=0, failed=0, expired=0),
    Policy("charge", served=700, failed=700, expired=700),
    Policy("charge_served", served=700, failed=0, expired=700),
]


def memory_budget(harness: Callable[..., Decider], unsettled: str = "release") -> Budget:
    return Budget(harness(CONFIG.format(unsettled=unsettled)))


@pytest.fixture
def budget(harness: Callable[..., Decider]) -> Budget:
    return memory_budget(harness)


@pytest.fixture(params=POLICIES, ids=lambda policy: policy.unsettled)
def policy(request: pytest.FixtureRequest) -> Policy:
    """Each `unsettled` policy in turn."""
    return request.param


async def test_reserve_then_settle_answers_and_counts(budget: Budget) -> None:
    reserved = await budget.reserve("t1", 700)
    assert (reserved.overall_code, reserved.statuses[0].limit_remaining) == (OK, 9300)
    assert await budget.held() == (0, 700)
    s = budget.series()
    assert (s["budget_reserved"], s["total_hits"], s["within_limit"]) == (700, 700, 700)
    ended = await budget.end("t1", 500)
    assert [st.code for st in ended.statuses] == [OK, OK]
    assert ended.statuses[0].limit_remaining == 9500
    assert await budget.held() == (500, 0)
    s = budget.series()
    assert (s["budget_reserved"], s["budget_charged"], s["budget_settled"]) == (0, 500, 1)
    assert s["budget_released"] == 0  # the close after a settle changes nothing
    # The reserved amount is a gauge, the rest counters.
    assert SERIES + "budget_reserved" in budget.d.stats.gauge_names()
    assert SERIES + "budget_settled" not in budget.d.stats.gauge_names()


async def test_prometheus_shows_the_reserved_gauge_and_the_counters(budget: Budget) -> None:
    await budget.reserve("t1", 700)
    await budget.end("t1", 500)
    await budget.reserve("t2", 300)
    mapper = MetricMapper.from_config(default_mapping_config())
    text = PrometheusSink(budget.d.stats, mapper, addr=":0").render().decode()  # first scrape
    family = "ratelimit_service_rate_limit_budget_"
    assert f"# TYPE {family}reserved gauge" in text
    assert f'{family}reserved{{domain="llm",key1="user"}} 300' in text
    assert f"# TYPE {family}charged counter" in text
    assert f'{family}settled{{domain="llm",key1="user"}} 1' in text


async def test_the_transaction_id_is_in_no_key_and_no_series(budget: Budget) -> None:
    await budget.reserve("secret-txn", 10)
    assert not [k for k in budget.d.stats.snapshot() if "secret" in k]
    stored = [*budget.d.backend.budgets._budgets, *budget.d.backend._counters]
    assert stored and not [k for k in stored if "secret" in k]


async def test_reserved_away_refuses_with_what_remains_after_reservations(budget: Budget) -> None:
    assert (await budget.reserve("big", 8000)).overall_code == OK
    refused = await budget.reserve("next", 3000)
    status = refused.statuses[0]
    assert (refused.overall_code, status.limit_remaining) == (OVER_LIMIT, 0)
    assert 0 < status.duration_until_reset <= 3600
    # Its hits split as any limit's (the reference's): 1,000 over, 2,000 near it.
    assert (budget.series()["over_limit"], budget.series()["near_limit"]) == (1000, 2000)
    assert await budget.held() == (0, 8000)  # the refusal reserved nothing
    assert (await budget.reserve("fits", 2000)).statuses[0].limit_remaining == 0


async def test_a_duplicated_stream_end_changes_nothing(budget: Budget) -> None:
    await budget.reserve("t1", 700)
    await budget.end("t1", 500)
    before = budget.series()
    again = await budget.end("t1", 500)
    assert again.overall_code == OK
    assert await budget.held() == (500, 0)
    assert budget.series() == before


async def test_an_unknown_settle_charges_its_usage_once(budget: Budget) -> None:
    # Its reserve never reached the store (fail-open): the usage happened all the same.
    await budget.end("lost", 300)
    await budget.end("lost", 300)
    assert await budget.held() == (300, 0)
    s = budget.series()
    assert (s["budget_orphaned"], s["budget_charged"], s["budget_settled"]) == (1, 300, 0)


async def test_a_reused_transaction_id_is_refused(budget: Budget) -> None:
    await budget.reserve("t1", 100)
    again = await budget.reserve("t1", 100)
    assert again.overall_code == OVER_LIMIT
    assert budget.series()["budget_duplicate"] == 1
    await budget.end("t1", None)  # a close cannot end a contested reservation
    assert await budget.held() == (0, 100)
    await budget.end("t1", 60)  # its settle can
    assert await budget.held() == (60, 0)


async def test_a_stream_end_without_usage_ends_by_the_policy(
    harness: Callable[..., Decider], policy: Policy
) -> None:
    budget = memory_budget(harness, policy.unsettled)
    served, failed = policy.served, policy.failed
    await budget.reserve("t1", 700)
    await budget.end("t1", None, status=500)
    assert await budget.held() == (failed, 0)
    s = budget.series()
    assert (s["budget_released"], s["budget_charged"], s["budget_reserved"]) == (1, failed, 0)
    # A 429 (refused here or upstream) served nothing: released whatever the policy.
    await budget.reserve("t2", 400)
    await budget.end("t2", None, status=429)
    assert await budget.held() == (failed, 0)
    # A success without usage (a stream cut after it started): content may have flowed.
    await budget.reserve("t3", 700)
    await budget.end("t3", None, status=200)
    assert await budget.held() == (failed + served, 0)
    # A client gone before any answer (status 0) was served nothing.
    await budget.reserve("t4", 300)
    await budget.end("t4", None, status=0)
    gone = 300 if policy.unsettled == "charge" else 0
    assert await budget.held() == (failed + served + gone, 0)


async def test_reservations_expire_after_their_ttl_by_the_policy(
    harness: Callable[..., Decider], policy: Policy
) -> None:
    budget = memory_budget(harness, policy.unsettled)
    await budget.reserve("t1", 700)
    budget.d.clock.advance(29)
    assert await budget.held() == (0, 700)
    budget.d.clock.advance(2)  # past reservation_ttl: the next call on the budget ends it
    assert (await budget.reserve("t2", 10)).overall_code == OK
    assert await budget.held() == (policy.expired, 10)
    s = budget.series()
    counts = (s["budget_expired"], s["budget_charged"], s["budget_reserved"])
    assert counts == (1, policy.expired, 10)
    await budget.end("t1", 650)  # a late settle changes nothing
    assert await budget.held() == (policy.expired, 10)


async def test_explain_shows_what_a_reserve_would_do_and_writes_nothing(budget: Budget) -> None:
    await budget.reserve("t1", 6000)
    explained = await budget.admin.explain(Request("llm", [call("reserve", "t2", 5000)]))
    (entry,) = explained["descriptors"]
    assert explained["overall_code"] == entry["decision"] == "OVER_LIMIT"
    assert entry["rule"]["budget"] == {
        "phase_key": "phase",
        "transaction_key": "txn",
        "unsettled": "release",
        "reservation_ttl_seconds": 30.0,
    }
    shown: dict[str, Any] = entry["budget"]
    assert (shown["call"], shown["outcome"], shown["transaction"]) == ("reserve", "refused", "t2")
    (window,) = entry["windows"]
    assert (window["value"], window["reserved"], window["after"]) == (0, 6000, 11000)
    assert window["would_be"] == "OVER_LIMIT"
    fits = await budget.admin.explain(Request("llm", [call("reserve", "t2", 4000)]))
    assert fits["descriptors"][0]["budget"]["outcome"] == "admitted"
    assert await budget.held() == (0, 6000)  # neither dry run reserved
    assert budget.series()["budget_reserved"] == 6000


async def test_a_guard_reserves_in_place_of_a_reserve_envoy_dropped(budget: Budget) -> None:
    # With its reserve: the guard changes nothing.
    both = await budget.d.decide("llm", call("reserve", "t1", 300), call("guard", "t1", 4096))
    assert [st.code for st in both.statuses] == [OK, OK]
    assert await budget.held() == (0, 300)
    # Without it (an estimate Envoy could not format): the guard's hits are reserved.
    alone = await budget.d.decide("llm", call("guard", "t2", 4096))
    assert alone.overall_code == OK
    assert await budget.held() == (0, 4396)
    await budget.end("t2", 100)
    assert await budget.held() == (100, 300)
    # A guard of another transaction, or another user's budget, is no stand-in.
    other = await budget.d.decide(
        "llm", call("reserve", "t3", 10), call("guard", "t4", 20), call("guard", "t3", 30, "bo")
    )
    assert other.overall_code == OK
    assert await budget.held() == (100, 330)
    # And with no room a guard alone is refused: never served unreserved.
    await budget.reserve("big", 9000)
    refused = await budget.d.decide("llm", call("guard", "t5", 4096))
    assert refused.overall_code == OVER_LIMIT


async def test_reserves_of_one_transaction_are_one_reservation(budget: Budget) -> None:
    # The completion's max_tokens and the prompt's bound, sent as two reserve entries.
    got = await budget.d.decide("llm", call("reserve", "t1", 600), call("reserve", "t1", 250))
    assert got.overall_code == OK
    assert await budget.held() == (0, 850)
    assert budget.series()["budget_duplicate"] == 0
    await budget.end("t1", 700)
    assert await budget.held() == (700, 0)
    # Together they must fit: 700 + 9000 + 400 > 10,000.
    over = await budget.d.decide("llm", call("reserve", "t2", 9000), call("reserve", "t2", 400))
    assert over.overall_code == OVER_LIMIT
    assert await budget.held() == (700, 0)


async def test_extra_parts_add_to_the_reservation_and_never_satisfy_a_guard(
    budget: Budget,
) -> None:
    # max_tokens dropped by Envoy, the prompt's bound sent: the guard stands in for the
    # completion, the extra is added to it.
    got = await budget.d.decide("llm", call("extra", "t1", 250), call("guard", "t1", 4096))
    assert got.overall_code == OK
    assert await budget.held() == (0, 4346)
    both = await budget.d.decide(
        "llm", call("reserve", "t2", 600), call("extra", "t2", 250), call("guard", "t2", 4096)
    )
    assert both.overall_code == OK
    assert await budget.held() == (0, 5196)
    alone = await budget.d.decide("llm", call("extra", "t3", 40), call("extra", "t3", 60))
    assert alone.overall_code == OK
    assert await budget.held() == (0, 5296)


async def test_a_request_limit_overrides_a_budget_rule_per_tenant(budget: Budget) -> None:
    # One rule, each caller at the limit its request carries (Envoy Gateway's
    # limit.fromMetadata): ann at 1,000 an hour, bo at 3,000; the budget keys stay apart.
    def at(phase: str, txn: str, hits: int, user: str, limit: int) -> Descriptor:
        d = call(phase, txn, hits, user)
        return Descriptor(d.entries, limit=(limit, HOUR), hits_addend=hits)

    assert (await budget.d.decide("llm", at("reserve", "a1", 800, "ann", 1000))).overall_code == OK
    over = await budget.d.decide("llm", at("reserve", "a2", 300, "ann", 1000))
    assert over.overall_code == OVER_LIMIT
    assert over.statuses[0].rule.requests_per_unit == 1000
    for i in range(3):
        got = await budget.d.decide("llm", at("reserve", f"b{i}", 900, "bo", 3000))
        assert got.overall_code == OK
    assert (await budget.d.decide("llm", at("reserve", "b3", 900, "bo", 3000))).overall_code == (
        OVER_LIMIT
    )
    # The stream end with the same limit settles into the same windows.
    ended = await budget.d.decide(
        "llm", at("settle", "a1", 500, "ann", 1000), at("close", "a1", 200, "ann", 1000)
    )
    assert ended.overall_code == OK
    assert await budget.held() == (500, 0)
    assert (await budget.d.decide("llm", at("reserve", "a3", 450, "ann", 1000))).overall_code == OK


async def test_a_reserve_past_the_budgets_transactions_is_refused_and_counted(
    budget: Budget,
) -> None:
    """BUDGET_MAX_TRANSACTIONS: a new transaction on a budget holding its most is refused
    (OVER_LIMIT, nothing reserved) and counted in `budget_full`, shown once non-zero."""
    budget.d.backend.budgets.max_budget_txns = 2
    assert "budget_full" not in budget.series()
    for txn in ("t1", "t2"):
        assert (await budget.reserve(txn, 100)).overall_code == OK
    refused = await budget.reserve("t3", 100)
    assert (refused.overall_code, refused.statuses[0].code) == (OVER_LIMIT, OVER_LIMIT)
    assert await budget.held() == (0, 200)
    s = budget.series()
    assert (s["budget_full"], s["budget_reserved"], s["over_limit"]) == (1, 200, 100)
    mapper = MetricMapper.from_config(default_mapping_config())
    text = PrometheusSink(budget.d.stats, mapper, addr=":0").render().decode()
    assert 'ratelimit_service_rate_limit_budget_full{domain="llm",key1="user"} 1' in text
    explained = await budget.admin.explain(Request("llm", [call("reserve", "t4", 1)]))
    (entry,) = explained["descriptors"]
    assert (entry["decision"], entry["budget"]["outcome"]) == ("OVER_LIMIT", "full")
    assert entry["windows"][0]["would_be"] == "OVER_LIMIT"
