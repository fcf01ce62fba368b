"""Budgets kept in plain commands (`backends.redis.claims`) under the races and faults a
script never has, on a real redis-server: two callers ending one reservation, a settle cut
between its claim and its charge, an orphan racing a reserve of its id, a sweep racing a
settle, and a replica sweeping what another reserved. Each interleaving is forced: the
first caller's round runs, then the second caller's whole call, then the first goes on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from support.budget import redis_budgets
from support.redis_server import RedisServer

from ratelimitd.backends.redis.claims import WHOLE, Claims
from ratelimitd.config.budget_store import (
    ADMITTED,
    COUNT,
    ENDED_BIT,
    FINISHED,
    NEVER,
    ORPHAN,
    PEEK,
    RELEASE,
    RESERVE,
    SETTLE,
    SETTLED,
    TIME,
    Call,
    budget_keys,
    fixed,
    record,
    records_key,
)

T0 = 1_699_999_200_000 + 600_000  # ten minutes into an hour
TTL = 600_000
WINDOWS = (fixed(3600, 1000),)
KEY = budget_keys("", "llm", [("user", "ann")])[0]


def call(kind: int, txn: str, amount: int = 0, now: int = T0, **kw: Any) -> Call:
    return Call(kind, KEY, WINDOWS, now, txn, amount, TTL, **kw)


class Between:
    """An instance whose round matching `after` (a command's bytes), once, is followed by
    `then` before its replies go back: the other caller's call, run in between."""

    def __init__(self, instance: Any, after: bytes, then: Callable[[], Awaitable[Any]]) -> None:
        self.instance = instance
        self.after = after
        self.then: Callable[[], Awaitable[Any]] | None = then
        self.routed = instance.routed
        self.budget_max_transactions = instance.budget_max_transactions

    async def _run(self, cmds: list[tuple[int, bytes]]) -> list[Any]:
        replies = await self.instance._run(cmds)
        if self.then is not None and any(self.after in c for _, c in cmds):
            then, self.then = self.then, None
            await then()
        return replies  # type: ignore[no-any-return]


@pytest.fixture
async def claims(redis_server: RedisServer) -> AsyncIterator[Claims]:
    """One daemon's budgets in plain commands on `redis_server`."""
    backend, _ = await redis_budgets(redis_server.address)
    yield backend.main.claims
    await backend.close()


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[tuple[Any, Any]]:
    """Two daemons' Redis backends on one server (each its own connections and `Claims`)."""
    a, _ = await redis_budgets(redis_server.address)
    b, _ = await redis_budgets(redis_server.address)
    yield a, b
    await a.close()
    await b.close()


async def level(claims: Claims, now: int = T0) -> int:
    (peek,) = await claims.run([call(PEEK, "peek", 0, now)])
    return peek.levels[0][0]


async def test_two_ends_of_one_reservation_charge_it_once(replicas: tuple[Any, Any]) -> None:
    a, b = replicas
    one, other = a.main.claims, b.main.claims
    assert (await one.run([call(RESERVE, "t1", 400)]))[0].outcome == ADMITTED
    # Both read the record open; the other's settle ends it first.
    racing = Claims(Between(a.main, b"HGET", lambda: other.run([call(SETTLE, "t1", 300)])))
    (late,) = await racing.run([call(SETTLE, "t1", 250)])
    assert late.outcome == FINISHED  # its claim overflowed: its increment taken back
    assert await level(one) == 300


async def test_a_settle_cut_between_its_claim_and_its_charge_charges_the_estimate(
    claims: Claims,
    redis_server: RedisServer,
) -> None:
    await claims.run([call(RESERVE, "t1", 400)])
    # The claim reached the server, the charge did not (a connection cut in the write).
    redis_server.client().hincrby(records_key(KEY), "t1", ENDED_BIT)
    (again,) = await claims.run([call(SETTLE, "t1", 300)])
    assert again.outcome == FINISHED  # never charged twice
    assert await level(claims) == 400  # the estimate, an upper bound of the usage


async def test_an_orphan_racing_a_reserve_of_its_id_settles_that_reservation(
    replicas: tuple[Any, Any],
) -> None:
    a, b = replicas
    one, other = a.main.claims, b.main.claims
    await one.run([call(RESERVE, "warm", 1)])
    # The settle finds no record; a reserve of its id lands before it charges.
    racing = Claims(Between(a.main, b"HGET", lambda: other.run([call(RESERVE, "o1", 400)])))
    (settled,) = await racing.run([call(SETTLE, "o1", 300)])
    assert (settled.outcome, settled.estimate, settled.charged) == (SETTLED, 400, 300)
    assert await level(one) == 301
    (close,) = await one.run([call(RELEASE, "o1")])
    assert close.outcome == FINISHED


async def test_a_sweep_racing_a_settle_ends_the_reservation_once(replicas: tuple[Any, Any]) -> None:
    a, b = replicas
    one, other = a.main.claims, b.main.claims
    await one.run([call(RESERVE, "t1", 400)])
    late = T0 + TTL  # t1's deadline: a sweep would release it (charge=False)
    # The sweep reads t1 due; a settle (on a replica that has not swept) ends it first.
    other.known[KEY] = [T0 + 4 * 3_600_000, late + 1, NEVER, WHOLE]
    racing = Claims(Between(a.main, b"HSCAN", lambda: other.run([call(SETTLE, "t1", 300, late)])))
    racing.known[KEY] = [T0 + 4 * 3_600_000, late, NEVER, WHOLE]  # read by HSCAN
    (peek,) = await racing.run([call(RESERVE, "t2", 1, late)])
    assert peek.expired == 0  # the sweep's claim overflowed: its release taken back
    assert await level(one, late) == 301


async def test_a_replica_sweeps_what_another_reserved(replicas: tuple[Any, Any]) -> None:
    """A replica that stopped leaves reservations open; another, on its first call on the
    budget, reads it whole and ends those past their deadline by the policy."""
    a, b = replicas
    one, other = a.main.claims, b.main.claims
    await one.run([call(RESERVE, "t1", 400), call(RESERVE, "t2", 100)])
    await a.close()
    late = T0 + TTL + 1
    (first,) = await other.run([call(RESERVE, "t3", 50, late)])
    assert (first.expired, first.expired_estimate, first.expired_charged) == (2, 500, 0)
    assert first.levels[0][0] == 50  # released by the policy: room again
    assert await level(other, late) == 50


@pytest.mark.parametrize("read", ["hgetall", "hscan"])
async def test_a_backlog_is_worked_through_without_reading_the_budget_again(
    claims: Claims, redis_server: RedisServer, read: str
) -> None:
    """More reservations past their deadline than one sweep ends: the next calls end the
    rest, oldest first, from what the first sweep read (in one HGETALL when the budget
    was last counted small, else by HSCAN)."""
    await claims.run([call(RESERVE, f"t{i}", 1, T0 + i) for i in range(100)])
    client = redis_server.client()
    client.config_resetstat()
    if read == "hscan":
        claims.known[KEY][3] = WHOLE
    late = T0 + TTL + 100
    first, second, third = [
        (await claims.run([call(RESERVE, f"n{i}", 1, late)]))[0] for i in range(3)
    ]
    assert (first.expired, second.expired, third.expired) == (64, 36, 0)
    stats = client.info("commandstats")
    assert stats[f"cmdstat_{read}"]["calls"] == 1
    assert f"cmdstat_{({'hscan', 'hgetall'} - {read}).pop()}" not in stats
    assert await level(claims, late) == 3  # released (charge=False): the new ones only


async def test_a_settle_by_the_reserving_process_claims_without_reading(
    claims: Claims,
    redis_server: RedisServer,
) -> None:
    """The process that made a reservation knows its record: its settle claims it in one
    round, unread, and the claim's reply confirms it."""
    await claims.run([call(RESERVE, "t1", 400)])
    client = redis_server.client()
    client.config_resetstat()
    (settled,) = await claims.run([call(SETTLE, "t1", 300, T0 + 5)])
    assert (settled.outcome, settled.estimate, settled.charged) == (SETTLED, 400, 300)
    assert "cmdstat_hget" not in client.info("commandstats")
    assert int(client.hget(records_key(KEY), "t1")) == record(400, T0 + 5, ENDED_BIT)
    assert await level(claims) == 300


async def test_a_settle_by_the_reserving_process_after_a_reset_is_an_orphan(
    claims: Claims,
    redis_server: RedisServer,
) -> None:
    """The record it made has gone (a reset): its claim made the field, which goes again,
    and the settle is charged as one of an id the budget does not hold."""
    await claims.run([call(RESERVE, "t1", 400)])
    redis_server.client().flushall()
    (settled,) = await claims.run([call(SETTLE, "t1", 300)])
    assert (settled.outcome, settled.charged) == (ORPHAN, 300)
    tombstone = int(redis_server.client().hget(records_key(KEY), "t1"))
    assert tombstone == record(0, T0, ENDED_BIT)
    assert await level(claims) == 300


async def test_a_settle_by_the_reserving_process_of_what_another_ended(
    replicas: tuple[Any, Any],
) -> None:
    a, b = replicas
    one, other = a.main.claims, b.main.claims
    await one.run([call(RESERVE, "t1", 400)])
    assert (await other.run([call(SETTLE, "t1", 300)]))[0].outcome == SETTLED
    (late,) = await one.run([call(SETTLE, "t1", 250)])
    assert late.outcome == FINISHED  # its claim overflowed: its charge taken back
    assert await level(one) == 300


async def test_two_ends_of_a_reservation_across_the_time_wrap_charge_it_once(
    replicas: tuple[Any, Any], redis_server: RedisServer
) -> None:
    """A record made just before its time field wraps (every 2^28 ms), ended just after:
    moving its time in the claim would take from the record, and a second claim would no
    longer overflow, so the time moves after the claim."""
    a, b = replicas
    one, other = a.main.claims, b.main.claims
    wrap = (T0 // TIME + 1) * TIME
    await one.run([call(RESERVE, "t1", 400, wrap - 1_000)])
    ends = wrap + 10
    racing = Claims(Between(a.main, b"HGET", lambda: other.run([call(SETTLE, "t1", 300, ends)])))
    (late,) = await racing.run([call(SETTLE, "t1", 250, ends)])
    assert late.outcome == FINISHED
    assert await level(one, ends) == 300
    tombstone = int(redis_server.client().hget(records_key(KEY), "t1"))
    assert tombstone == record(400, ends, ENDED_BIT)  # the end's time


async def test_one_process_sweeps_a_budget_for_half_a_ttl_the_others_wait(
    replicas: tuple[Any, Any], redis_server: RedisServer
) -> None:
    """Each process keeps its own next sweep; the sweep itself is claimed in the store, so
    that N daemons read a budget once a half TTL, not N times. The others wait until the
    claim ends, then one of them sweeps, reading what all of them wrote."""
    a, b = replicas
    one, other = a.main.claims, b.main.claims
    await one.run([call(RESERVE, "t1", 400)])  # its first call: it sweeps (nothing) and holds
    client = redis_server.client()
    client.config_resetstat()
    await other.run([call(RESERVE, "t2", 100, T0 + 1)])  # its first: it would sweep, waits
    assert "cmdstat_hgetall" not in client.info("commandstats")
    assert other.known[KEY][1] == T0 + TTL // 2
    late = T0 + TTL + 1  # both deadlines passed, the claim long over
    (swept,) = await other.run([call(RESERVE, "t3", 1, late)])
    assert (swept.expired, swept.expired_estimate) == (2, 500)
    assert client.info("commandstats")["cmdstat_hgetall"]["calls"] == 1
    (after,) = await one.run([call(RESERVE, "t4", 1, late + 1)])  # now the other holds it
    assert after.expired == 0
    assert client.info("commandstats")["cmdstat_hgetall"]["calls"] == 1


async def test_two_calls_of_one_process_on_a_due_budget_sweep_it_once(
    claims: Claims,
    redis_server: RedisServer,
) -> None:
    await claims.run([call(RESERVE, "t1", 400)])
    client = redis_server.client()
    client.config_resetstat()
    late = T0 + TTL + 1
    both = await asyncio.gather(
        claims.run([call(RESERVE, "t2", 1, late)]), claims.run([call(RESERVE, "t3", 1, late)])
    )
    assert sum(r.expired for (r,) in both) == 1
    assert client.info("commandstats")["cmdstat_hgetall"]["calls"] == 1


async def test_a_sweep_that_ends_reservations_is_next_due_at_their_tombstones_deadline(
    claims: Claims,
) -> None:
    await claims.run([call(RESERVE, "t1", 400)])
    late = T0 + TTL + 1
    (swept,) = await claims.run([call(COUNT, "", 0, late)])  # writes nothing of its own
    assert swept.expired == 1
    assert claims.known[KEY][1] == late + TTL  # the tombstone's deadline
