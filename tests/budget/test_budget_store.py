"""The budget primitives, on the memory twin and on Redis alike: reserve, settle, release
(close), count, peek, expiry, idempotency, and the keys."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.budget import Scripted
from support.settings_env import error, load

from ratelimitd.backends import budget_txns
from ratelimitd.backends.memory_budget import MemoryBudgets
from ratelimitd.backends.redis.instances import key_slot
from ratelimitd.budget.calls import budget_key, transaction_id
from ratelimitd.config import budget_store as outcome
from ratelimitd.config.budget_store import (
    COUNT,
    PEEK,
    RELEASE,
    RESERVE,
    SETTLE,
    Call,
    Result,
    Window,
    budget_keys,
    fixed,
    sliding,
)

HOUR = 3_600_000
# 10 minutes into an hour, at the start of a minute: an hour window resets in 3000 s.
T0 = 1_699_999_200_000 + 600_000
TTL = 600_000


def is_claims(store: Any) -> bool:
    """Whether `store` keeps a budget of fixed windows in plain commands (`claims`)."""
    return hasattr(store, "server") and not isinstance(store, Scripted)


class Budget:
    """One budget on a store, with its own clock (ms): the calls as methods."""

    def __init__(
        self,
        store: Any,
        windows: tuple[Window, ...] = (fixed(3600, 100),),
        ttl: int = TTL,
        charge: bool = False,
        user: str = "alice",
    ) -> None:
        self.store = store
        self.windows = windows
        self.ttl = ttl
        self.charge = charge
        self.key, self.due = budget_keys("", "llm", [("user", user)])
        self.now = T0

    async def call(self, kind: int, txn: str = "", amount: int = 0, **kw: Any) -> Result:
        options = {"ttl": self.ttl, "charge": self.charge, **kw}
        call = Call(kind, self.key, self.windows, self.now, txn, amount, **options)
        return (await self.store.run([call]))[0]  # type: ignore[no-any-return]

    async def reserve(self, txn: str, estimate: int, **kw: Any) -> Result:
        return await self.call(RESERVE, txn, estimate, **kw)

    async def settle(self, txn: str, actual: int) -> Result:
        return await self.call(SETTLE, txn, actual)

    async def release(self, txn: str, **kw: Any) -> Result:
        return await self.call(RELEASE, txn, **kw)

    async def count(self, hits: int) -> Result:
        return await self.call(COUNT, "", hits)

    async def level(self) -> int:
        """Usage + reservations of the first window now (a peek of 0)."""
        return (await self.call(PEEK, "peek", 0)).levels[0][0]


async def test_reserve_admits_while_used_plus_reserved_plus_estimate_fits(store: Any) -> None:
    b = Budget(store)
    assert (await b.reserve("t1", 40)).levels == ((40, 3000),)
    assert (await b.reserve("t2", 60)).outcome == outcome.ADMITTED  # exactly the limit
    refused = await b.reserve("t3", 1)
    assert (refused.outcome, refused.levels) == (outcome.REFUSED, ((101, 3000),))
    assert await b.level() == 100  # the refused reserve holds nothing


async def test_settle_charges_the_actual_usage_and_frees_the_estimate(store: Any) -> None:
    b = Budget(store)
    await b.reserve("t1", 80)
    assert (await b.reserve("t2", 30)).outcome == outcome.REFUSED
    b.now += 5_000
    settled = await b.settle("t1", 12)
    assert (settled.outcome, settled.estimate, settled.charged) == (outcome.SETTLED, 80, 12)
    assert settled.levels == ((12, 2995),)
    assert (await b.reserve("t2", 88)).outcome == outcome.ADMITTED


async def test_a_second_settle_changes_nothing(store: Any) -> None:
    b = Budget(store)
    await b.reserve("t1", 50)
    await b.settle("t1", 20)
    again = await b.settle("t1", 20)
    assert (again.outcome, again.estimate, again.charged) == (outcome.FINISHED, 0, 0)
    assert (await b.release("t1")).outcome == outcome.FINISHED  # the close after it, too
    assert await b.level() == 20


async def test_a_settle_without_reservation_charges_its_usage_once(store: Any) -> None:
    # The reserve never reached the store (fail-open, or Envoy dropped its descriptor): the
    # usage still happened, so it is charged, and only once.
    b = Budget(store)
    orphan = await b.settle("lost", 30)
    assert (orphan.outcome, orphan.charged) == (outcome.ORPHAN, 30)
    assert (await b.settle("lost", 30)).outcome == outcome.FINISHED
    assert await b.level() == 30


async def test_release_frees_or_charges_the_estimate_by_policy(store: Any) -> None:
    b = Budget(store)
    await b.reserve("t1", 40)
    released = await b.release("t1")
    assert (released.outcome, released.estimate, released.charged) == (outcome.SETTLED, 40, 0)
    assert await b.level() == 0

    await b.reserve("t2", 40)
    charged = await b.release("t2", charge=True)
    assert (charged.outcome, charged.charged) == (outcome.SETTLED, 40)
    assert await b.level() == 40
    assert (await b.release("never")).outcome == outcome.UNKNOWN_ID  # e.g. the close after a 429


async def test_a_reused_transaction_id_is_refused_and_cannot_end_the_first(store: Any) -> None:
    b = Budget(store)
    await b.reserve("t1", 40)
    dup = await b.reserve("t1", 10)
    assert (dup.outcome, dup.levels) == (outcome.DUPLICATE, ((50, 3000),))
    assert await b.level() == 40  # nothing more reserved
    # The refused request's close must not free the first one's reservation...
    assert (await b.release("t1")).outcome == outcome.CONTESTED
    assert await b.level() == 40
    # ...while the first one's settle still ends it.
    assert (await b.settle("t1", 25)).outcome == outcome.SETTLED
    assert await b.level() == 25
    assert (await b.reserve("t1", 5)).outcome == outcome.DUPLICATE  # finished ids too, for a TTL


async def test_peek_answers_as_reserve_and_writes_nothing(store: Any) -> None:
    b = Budget(store)
    await b.reserve("t1", 70)
    peek = await b.call(PEEK, "t2", 40)
    assert (peek.outcome, peek.levels) == (outcome.REFUSED, ((110, 3000),))
    assert (await b.call(PEEK, "t2", 30)).outcome == outcome.ADMITTED
    assert (await b.reserve("t2", 30)).outcome == outcome.ADMITTED  # the peek reserved nothing


async def test_count_is_a_plain_call_against_usage_plus_reservations(store: Any) -> None:
    b = Budget(store)
    await b.reserve("t1", 90)
    assert (await b.count(0)).levels == ((90, 3000),)  # hits 0: a check
    assert (await b.count(10)).outcome == outcome.ADMITTED
    over = await b.count(5)  # a fixed window counts every hit, as the reference does
    assert (over.outcome, over.levels) == (outcome.REFUSED, ((105, 3000),))
    assert await b.level() == 105


async def test_expired_reservations_end_by_policy_and_late_settles_change_nothing(
    store: Any,
) -> None:
    b = Budget(store)
    await b.reserve("t1", 30)
    await b.reserve("t2", 20)
    b.now += TTL  # the deadline is inclusive
    swept = await b.reserve("t3", 1)
    assert (swept.expired, swept.expired_estimate, swept.expired_charged) == (2, 50, 0)
    assert swept.levels == ((1, 2400),)
    assert (await b.settle("t1", 30)).outcome == outcome.FINISHED  # expired is final

    c = Budget(store, charge=True, user="bob")
    await c.reserve("t1", 30)
    c.now += TTL + 1
    assert (await c.count(0)).expired_charged == 30
    assert await c.level() == 30
    # A tombstone lives one more TTL; then the id is free again.
    c.now += TTL + 1
    assert (await c.reserve("t1", 5)).outcome == outcome.ADMITTED


async def test_settle_goes_to_the_fixed_window_the_reservation_was_made_in(store: Any) -> None:
    b = Budget(store)
    b.now += 2_900_000  # 100 s before the hour ends
    await b.reserve("t1", 60)
    b.now += 200_000  # the next hour: its budget is fresh
    assert await b.level() == 0
    settled = await b.settle("t1", 50)  # charged to the hour before, not to this one
    assert (settled.outcome, settled.estimate, settled.charged) == (outcome.SETTLED, 60, 50)
    assert await b.level() == 0


async def test_sliding_window_weighs_the_window_before_with_its_reservations(
    store: Any,
) -> None:
    b = Budget(store, windows=(sliding(60, 100),))
    b.now += 10_000  # 10 s into a minute
    await b.reserve("t1", 60)
    b.now += 60_000  # the next minute, 10 s in: 50 s of its 60 left
    # p + q = 60 weighs ceil(60 x 50/60) = 50.
    assert await b.level() == 50
    refused = await b.reserve("t2", 51)
    assert (refused.outcome, refused.levels[0][0]) == (outcome.REFUSED, 101)
    settled = await b.settle("t1", 12)  # into the window before: p = 12
    assert settled.levels[0][0] == 10
    assert (await b.reserve("t2", 90)).outcome == outcome.ADMITTED


async def test_sliding_reset_says_when_room_is_certain(store: Any) -> None:
    b = Budget(store, windows=(sliding(60, 100),))
    b.now += 10_000  # 50 s of the minute left
    await b.reserve("t1", 100)
    # Room for 1 when this window's 100 weigh 99 in the next: 60 s - 59.4 s after it ends.
    refused = await b.reserve("t2", 1)
    assert refused.levels == ((101, 50_000 + 600),)
    ok = await b.reserve("t3", 0)
    assert ok.levels == ((100, 110_000),)  # holds something until the end of the next


async def test_every_window_must_have_room_and_a_refusal_reserves_in_none(store: Any) -> None:
    b = Budget(store, windows=(fixed(60, 50), fixed(3600, 1000)))
    await b.reserve("t1", 40)
    refused = await b.reserve("t2", 20)
    assert refused.outcome == outcome.REFUSED
    assert refused.levels == ((60, 60), (60, 3000))
    assert [after for after, _ in (await b.count(0)).levels] == [40, 40]
    await b.settle("t1", 10)
    assert [after for after, _ in (await b.count(0)).levels] == [10, 10]


async def test_force_reserves_past_the_limit(store: Any) -> None:
    # Shadow mode: the answer is OK anyway, so the reservation must be held to stay exact.
    b = Budget(store)
    forced = await b.reserve("t1", 150, force=True)
    assert forced.outcome == outcome.REFUSED
    assert await b.level() == 150
    await b.settle("t1", 120)
    assert await b.level() == 120


async def test_a_budget_is_forgotten_when_nothing_in_it_can_matter(store: Any) -> None:
    b = Budget(store)
    await b.reserve("t1", 10)
    await b.settle("t1", 10)
    b.now += 3 * HOUR
    assert await b.level() == 0
    assert (await b.settle("t1", 10)).outcome == outcome.ORPHAN  # the tombstone went with it


async def test_redis_keys_share_a_slot_and_expire(store: Any) -> None:
    b = Budget(store)
    await b.reserve("t1", 10)
    server = getattr(store, "server", None)
    if server is None:
        assert store.state(b.key, b.now)["txns"]["t1"][0] == "o"
        return
    client = server.client()
    if is_claims(store):
        table, counter, sweep = b.key + "_t", b.key + "_3600s_1699999200", b.key + "_s"
        assert sorted(client.keys()) == sorted(k.encode() for k in (counter, table, sweep))
        slots = {key_slot(k.encode()) for k in (table, counter, sweep, b.key)}
        assert len(slots) == 1
        # The first call swept the budget: no other process need for half a TTL.
        assert client.get(sweep).startswith(b"%d:" % (T0 + TTL // 2))
        assert 0 < client.pttl(sweep) <= TTL
        fields = client.hgetall(table)
        assert int(fields[b"t1"]) == 10 + (T0 % 2**28) * 2**32
        assert len(fields[b"~"]) == 65 and int(fields[b"~"][:20]) == T0 + 3_000_000 + TTL
        assert client.object("encoding", table) == b"hashtable"
        assert client.get(counter) == b"10"
        # The records until the hour ends + the TTL; the counter until the hour ends.
        assert 3_590_000 < client.pttl(table) <= 3_000_000 + TTL
        assert 2_990_000 < client.pttl(counter) <= 3_001_000
        return
    assert sorted(client.keys()) == [b.key.encode(), b.due.encode()]
    fields = client.hgetall(b.key)
    assert fields[b"t:t1"] == b"o 10 3600s=1699999200"
    assert (fields[b"3600s.r"], fields[b"3600s.u"]) == (b"10", b"0")
    # Until the hour ends (3000 s) + the TTL: every deadline the hour sets is before that.
    assert 3_590_000 < client.pttl(b.key) <= 3_000_000 + TTL
    assert client.zscore(b.due, "t1") == T0 + TTL


@pytest.mark.parametrize(
    "value",
    ["alice", "a{b}c", "}{", "{", "}", "x{}y", "{{tag}}"],
)
def test_budget_keys_share_one_slot_whatever_the_values(value: str) -> None:
    for prefix in ("", "rl:", "{rl}", "rl{", "a}b"):
        state, due = budget_keys(prefix, "llm", [("user", value), ("model", "gpt")])
        assert due == state + "_due"
        assert key_slot(state.encode()) == key_slot(due.encode())
        assert state.startswith(prefix)
        assert state.endswith(f"llm_user_{value}_model_gpt_budget")


@given(
    st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=4),
    st.none() | st.lists(st.sampled_from(["", "a*", "b*"]), max_size=5),
    st.sampled_from(["", "rl:", "{rl}", "a}b"]),
)
def test_the_service_spells_budget_keys_as_the_model(
    entries: list[tuple[str, str]], share: list[str] | None, prefix: str
) -> None:
    # The service's key comes from the counters' compiled key maths.
    state, _ = budget_keys(prefix, "llm", entries, share)
    assert budget_key(prefix, "llm", entries, share) == state


def test_budget_keys_refuse_a_prefix_with_an_empty_tag() -> None:
    with pytest.raises(ValueError, match="empty Redis hash tag"):
        budget_keys("rl{}", "llm", [("user", "a")])


def test_share_threshold_patterns_replace_values() -> None:
    state, _ = budget_keys("", "llm", [("user", "alice")], share=["a*"])
    assert state.endswith("llm_user_a*_budget")


def test_long_transaction_ids_are_stored_as_a_digest() -> None:
    assert transaction_id("0f8e3c3a-7c7b-4f3e-9d8e-1f2a3b4c5d6e") == (
        "0f8e3c3a-7c7b-4f3e-9d8e-1f2a3b4c5d6e"
    )
    long = transaction_id("x" * 65)
    assert long.startswith("#") and len(long) == 33
    assert transaction_id("#abc") != "#abc"  # a digest's shape cannot be claimed
    assert transaction_id("x" * 65) == long


async def test_a_dry_run_applies_calls_in_order_writes_nothing_and_tells_what_is_held(
    store: Any,
) -> None:
    b = Budget(store)
    await b.reserve("t1", 70)
    await b.count(5)
    settle = Call(SETTLE, b.key, b.windows, b.now, "t1", 30, TTL)
    again = Call(SETTLE, b.key, b.windows, b.now, "t1", 30, TTL)
    dry = store.dry_run([settle, again])  # the twin's is synchronous, Redis' awaited
    if not isinstance(dry, list):
        dry = await dry
    assert [(r.outcome, r.levels, r.held) for r in dry] == [
        (outcome.SETTLED, ((35, 3000),), ((5, 70),)),
        (outcome.FINISHED, ((35, 3000),), ((35, 0),)),  # the second sees the first
    ]
    assert await b.level() == 75  # nothing written
    assert (await b.settle("t1", 30)).outcome == outcome.SETTLED
    assert (await b.reserve("t2", 25)).held == ()  # only a dry run tells


async def test_a_remembered_refusal_makes_its_stream_end_charge_nothing(store: Any) -> None:
    # Quota mode: the refused request is served elsewhere; its settle is not this budget's.
    b = Budget(store)
    await b.reserve("t1", 90)
    assert (await b.reserve("t2", 20, remember=True)).outcome == outcome.REFUSED
    assert (await b.settle("t2", 15)).outcome == outcome.FINISHED
    assert await b.level() == 90
    # Without it, a refused reserve leaves nothing: its settle is an unknown transaction.
    assert (await b.reserve("t3", 20)).outcome == outcome.REFUSED
    assert (await b.settle("t3", 15)).outcome == outcome.ORPHAN
    assert await b.level() == 105
    # A remembered refusal asked again is decided afresh.
    await b.reserve("t4", 20, remember=True)
    assert (await b.release("t4")).outcome == outcome.FINISHED
    await b.settle("t1", 0)
    assert (await b.reserve("t4", 20, remember=True)).outcome == outcome.ADMITTED


async def test_clock_skew_between_daemons_never_frees_room(store: Any) -> None:
    # Daemon `ahead` is 2 minutes ahead of `behind`, across the hour's end: `ahead`
    # reserves in the next hour; `behind` still in the hour before reads that window at its
    # start (not as a fresh one), and its settle goes to the window of the reservation.
    behind = Budget(store)
    behind.now += 3_000_000 - 60_000  # a minute before the hour ends
    ahead = Budget(store)
    ahead.now = behind.now + 120_000
    assert (await ahead.reserve("t1", 60)).outcome == outcome.ADMITTED
    if is_claims(store):
        # A counter per window start: `behind` counts in its own hour, as a plain fixed
        # window does (docs/budgets.md, "Store"); its settle still goes to t1's hour.
        assert await behind.level() == 0
        assert (await behind.reserve("t2", 50)).outcome == outcome.ADMITTED
        settled = await behind.settle("t1", 30)
        assert (settled.outcome, settled.charged) == (outcome.SETTLED, 30)
        assert (await ahead.level(), await behind.level()) == (30, 50)
        return
    assert await behind.level() == 60
    assert (await behind.reserve("t2", 50)).outcome == outcome.REFUSED
    settled = await behind.settle("t1", 30)
    assert (settled.outcome, settled.charged) == (outcome.SETTLED, 30)
    assert await ahead.level() == await behind.level() == 30


async def test_settles_append_to_the_outbox_exactly_once(redis_servers: Any) -> None:
    """A budget with an outbox: each settle that charges usage (a reservation's, or an
    unknown transaction's) and each close that charges its estimate appends one entry in
    the same script; a repeated settle, a reserve, a release and a refused reserve append
    nothing."""
    from support.budget import redis_budgets

    from ratelimitd.budget.outbox import event, parse

    server = redis_servers()
    backend, store = await redis_budgets(server.address)
    try:
        b = Budget(store)
        entries = [("user", "alice"), ("model", "gpt-4o")]
        reserve = b.reserve

        async def reserve_(txn: str, estimate: int) -> Result:  # every call names the outbox
            return await reserve(txn, estimate, outbox="settled")

        b.reserve = reserve_  # type: ignore[method-assign]

        async def settle(txn: str, actual: int) -> Result:
            call = Call(SETTLE, b.key, b.windows, b.now, txn, actual, ttl=TTL,
                        outbox="settled", event=event(entries))  # fmt: skip
            return (await store.run([call]))[0]  # type: ignore[no-any-return]

        await b.reserve("t1", 40)
        assert (await settle("t1", 25)).outcome == outcome.SETTLED
        assert (await settle("t1", 25)).outcome == outcome.FINISHED  # repeated: nothing
        assert (await settle("t9", 7)).outcome == outcome.ORPHAN  # charged at once
        await b.reserve("t2", 30)
        await b.release("t2", outbox="settled", event=event(entries))  # released: nothing
        assert (await b.reserve("t3", 1000)).outcome == outcome.REFUSED
        # A close that charges its estimate (a stream cut after it started) is billed usage.
        await b.reserve("t4", 20)
        charged = await b.release("t4", charge=True, outbox="settled", event=event(entries))
        assert charged.outcome == outcome.SETTLED
        client = server.client()
        got = [parse(fields) for _, fields in client.xrange("settled")]
        assert [(s.txn, s.tokens, s.at_ms) for s in got] == [
            ("t1", 25, T0),
            ("t9", 7, T0),
            ("t4", 20, T0),
        ]
        assert got[0].entries == tuple(entries) and got[0].value("model") == "gpt-4o"
        level = (await b.call(PEEK, "peek", 0, outbox="settled")).levels[0][0]
        assert level == 52  # the usage the outbox reports, charged once
    finally:
        await backend.close()


def bound(store: Any, most: int) -> None:
    """The transactions one budget of `store` may hold (BUDGET_MAX_TRANSACTIONS)."""
    if hasattr(store, "max_budget_txns"):  # either memory twin, compiled or not
        store.max_budget_txns = most
    else:
        store.instance.budget_max_transactions = most


async def test_a_budget_holds_at_most_its_transactions(store: Any) -> None:
    """Open ones and tombstones count; past the bound a new id is refused (FULL) and an
    unknown settle charges without a tombstone; another budget is not concerned; room
    comes back as tombstones expire. (250,880 distinct ids once added 130 MB.)"""
    bound(store, 3)
    b = Budget(store)
    for txn in ("t1", "t2", "t3"):
        assert (await b.reserve(txn, 10)).outcome == outcome.ADMITTED
    assert (await b.reserve("t4", 10)).outcome == outcome.FULL
    assert (await b.call(PEEK, "t4", 10)).outcome == outcome.FULL
    assert await b.level() == 30  # the refused one reserved nothing
    assert (await b.reserve("t1", 10)).outcome == outcome.DUPLICATE  # a known id
    assert (await b.settle("t2", 4)).outcome == outcome.SETTLED  # its tombstone stays
    assert (await b.reserve("t5", 10)).outcome == outcome.FULL
    for _ in range(2):  # not remembered: each settle of the unknown id charges
        result = await b.settle("o1", 5)
        assert (result.outcome, result.charged) == (outcome.ORPHAN, 5)
    assert await b.level() == 10 + 10 + 4 + 5 + 5
    other = Budget(store, user="bob")
    assert (await other.reserve("t4", 10)).outcome == outcome.ADMITTED
    b.now += 2 * TTL + 1  # the open ones expired, then their tombstones
    await b.count(0)  # a call sweeps the first SWEEP_BATCH due
    await b.count(0)
    assert (await b.reserve("t6", 10)).outcome == outcome.ADMITTED


async def test_the_memory_store_holds_at_most_its_transactions_over_all_budgets() -> None:
    """MEMORY_MAX_BUDGET_TRANSACTIONS: the process's bound, over every budget."""
    store = MemoryBudgets(max_txns=4)
    alice, bob = Budget(store), Budget(store, user="bob")
    for txn in ("a1", "a2", "a3"):
        assert (await alice.reserve(txn, 1)).outcome == outcome.ADMITTED
    assert (await bob.reserve("b1", 1)).outcome == outcome.ADMITTED
    assert (await bob.reserve("b2", 1)).outcome == outcome.FULL
    assert store.txns == 4
    assert (
        store.dry_run([Call(RESERVE, bob.key, bob.windows, bob.now, "b2", 1, TTL)])[0].outcome
        == outcome.FULL
    )
    assert store.delete(alice.key, alice.now)
    assert store.txns == 1
    assert (await bob.reserve("b2", 1)).outcome == outcome.ADMITTED
    bob.now += 3 * HOUR  # the whole budget is forgotten
    await alice.count(0)
    alice.now = bob.now
    await alice.count(0)
    assert store.txns == 0


async def test_a_settled_transaction_stays_finished_past_its_reservations_deadline(
    store: Any,
) -> None:
    """A settle moves the transaction's deadline later (its tombstone's TTL): a repeated
    settle after the reservation's own deadline still finds it finished, and the tombstone
    goes once its deadline has passed."""
    b = Budget(store)
    assert (await b.reserve("t", 5)).outcome == outcome.ADMITTED
    b.now += TTL // 2
    assert (await b.settle("t", 3)).outcome == outcome.SETTLED
    b.now += TTL // 2 + 1  # past the reservation's deadline, before the tombstone's
    await b.count(0)
    assert (await b.settle("t", 3)).outcome == outcome.FINISHED
    b.now += TTL
    await b.count(0)
    assert (await b.settle("t", 3)).outcome == outcome.ORPHAN  # forgotten: charged anew


async def test_the_memory_store_queues_a_transaction_once_from_reserve_to_its_end() -> None:
    """A settle changes the reservation's record in place: a budget's deadline heap holds
    one entry per transaction, not one per call, and is empty once they have ended."""
    store = MemoryBudgets()
    b = Budget(store)
    for i in range(50):
        await b.reserve(f"t{i}", 1)
        b.now += 1
        await b.settle(f"t{i}", 1)
    budget = store._budgets[b.key]
    assert len(budget.due) == len(budget.txns) == store.txns == 50
    b.now += 2 * TTL  # every tombstone's time is up (the hour window still holds usage)
    await b.count(0)
    assert (len(budget.due), len(budget.txns), store.txns) == (0, 0, 0)


def test_a_transaction_record_is_compiled_and_not_tracked_by_the_collector() -> None:
    """A process may hold hundreds of thousands of transactions: compiled, their records
    cost the cyclic collector nothing (`backends.budget_txns`)."""
    assert (budget_txns.__file__ or "").endswith(".so")
    assert not gc.is_tracked(budget_txns.Txn("t", "o", 1, "3600s=0", 0))


def test_the_transaction_bounds_are_settings_refused_where_they_bound_nothing() -> None:
    assert (load().cache.budget_max_transactions, load().cache.memory_max_budget_transactions) == (
        100_000,
        500_000,
    )
    assert load(BUDGET_MAX_TRANSACTIONS="50").cache.budget_max_transactions == 50
    assert error(BUDGET_MAX_TRANSACTIONS="0") == (
        "BUDGET_MAX_TRANSACTIONS: invalid value '0' (expected an integer 1-2147483647)"
    )
    assert error(
        BACKEND_TYPE="memcache", MEMCACHE_HOST_PORT="h:1", BUDGET_MAX_TRANSACTIONS="5"
    ) == (
        "BUDGET_MAX_TRANSACTIONS: has no effect with BACKEND_TYPE=memcache (it keeps no token "
        "budgets)"
    )
    assert "has no effect with BACKEND_TYPE=redis" in error(
        BACKEND_TYPE="redis", MEMORY_MAX_BUDGET_TRANSACTIONS="5"
    )
    env = {"BACKEND_TYPE": "memory", "MEMORY_MAX_BUDGET_TRANSACTIONS": "9"}
    assert load(**env).cache.memory_max_budget_transactions == 9
