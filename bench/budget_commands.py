"""Token budgets on Redis without Lua: what the command-only design sketched in
docs/budgets.md ("Cost") costs the server, on prototypes of its calls, against a plain
decision (INCRBY + EXPIRE) and the budget script (`backends/redis/budget.py`) in one run.

    .venv/bin/python bench/budget_commands.py [--calls 20480] [--repeat 5] [--no-check]
                                              [--callgrind-calls 3200] [--store valkey]

The prototypes are one budget on one fixed window, their calls written as the plain
commands a design sends, round by round, and the answer each round's replies give:
`CommandBudget` (the sketch: a counter per window, a record key per transaction, a sorted
set of deadlines; its settle made retry-safe with a claim and a MULTI), `BucketedBudget`
(deadlines in a list per minute), `FloorBudget` (no deadline index: the least a reserve can
send), `HashBudget` (records and tombstones as fields of hashes) and `ClaimBudget` (records
as integers in one hash table per budget, claimed by HINCRBY's overflow; expiry by a sweep
that scans the table). They are not the
store: no sliding windows, outbox, resets, dry run or transaction bound; they exist to
price the design and to check, on a real server, the properties the store must keep
(`check`): no overshoot under concurrent reserves, a retried reserve reserving once, a
duplicate or retried settle charged once (also when the settle's first round reached the
store and its second did not), expiry by a sweep.

Server cost: µs per call from INFO commandstats (the commands' own execution, as the
script's is measured: EVALSHA's figure includes the commands the script calls, EXEC's the
commands it runs), summed over each call's top-level commands, in steady state (64
budgets, ten open reservations on each while they are reserved then settled, in chunks,
on a server already holding 300,000 keys), alternating the designs chunk by chunk; median
of --repeat runs. Then one run under callgrind: instructions of the whole server process
per call. Writes bench/results/budget_commands[_valkey].{json,md}. The machine may be
shared: quote ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import redis
from support.machine import machine_info
from support.ready import wait_for
from support.redis_server import STORES, RedisServers, server_binary
from support.report import load_averages, table

from ratelimitd.backends.redis import budget as lua
from ratelimitd.config.budget_store import RELEASE, RESERVE, SETTLE, Call, budget_keys, fixed

BIG = 2**31  # never over: every measured call takes the admitted path
ESTIMATE, USAGE = 700, 500
TTL = 600_000  # reservation_ttl (ms), the default 10m
NOW = 1_764_936_123_456  # a fixed clock (ms): every call in one hourly window
BUDGETS = 64  # users, as bench/budget.py
FILLER = 300_000  # keys the server holds before a run (`run_once`)
CHUNK = BUDGETS * 10  # transactions reserved, then settled, per chunk: ten open per budget
CLAIM_SWEEP_CHUNKS = 5  # a `ClaimBudget` sweep every fifth chunk, half a TTL (`run_once`)

ADMITTED, REFUSED, DUPLICATE, SETTLED, FINISHED, ORPHAN = (
    "admitted",
    "refused",
    "duplicate",
    "settled",
    "finished",
    "orphan",
)

Command = tuple[Any, ...]


class CommandBudget:
    """One budget on one fixed window of `seconds`, as the command-only design keeps it.

    Keys (one hash tag, so one Cluster slot): per window start one counter `level`
    (used + reserved: named by the window's start, so nothing rolls), per transaction a
    record `t:<id>` (`o <estimate> <reserve attempt> <counter>` while open, the settles'
    claims appended, `|<attempt> <usage>`; its first byte turned to `s` or `x` once it
    ended; `s <attempt>` for an orphan's), and `due`, a sorted set of the open
    transactions' deadlines for the sweep. An attempt is a random id a call keeps across
    its retries: it is how a retry recognises what its earlier attempt did.
    """

    def __init__(self, name: str, limit: int, seconds: int = 3600, ttl: int = TTL) -> None:
        self.base = f"{{{name}}}b"
        self.limit = limit
        self.seconds = seconds
        self.ttl = ttl

    def level(self, now: int) -> str:
        start = now // 1000 - now // 1000 % self.seconds
        return f"{self.base}:l:{start}"

    def record(self, txn: str) -> str:
        return f"{self.base}:t:{txn}"

    @property
    def due(self) -> str:
        return f"{self.base}:due"

    # A reserve: one round when admitted (the common case), a second to undo its
    # increment when refused, when its id is taken, or when it is a retry of itself.

    def reserve(self, txn: str, est: int, now: int, attempt: str) -> list[Command]:
        level = self.level(now)
        rec = f"o {est} {attempt} {level}"
        return [
            ("INCRBY", level, est),
            ("SET", self.record(txn), rec, "NX", "PX", 2 * self.ttl, "GET"),
            ("ZADD", self.due, "NX", now + self.ttl, txn),
        ]

    def reserved(
        self, txn: str, est: int, now: int, attempt: str, replies: list[Any]
    ) -> tuple[str | None, list[Command]]:
        """The answer of a reserve's first round (None: a further round decides), and its
        second round (none: done)."""
        after, old = replies[0], replies[1]
        level = self.level(now)
        undo = ("INCRBY", level, -est)
        if old is None:  # the record is ours, new
            if after > self.limit:
                return REFUSED, [undo, ("DEL", self.record(txn)), ("ZREM", self.due, txn)]
            if after == est:
                # This reserve made the window's counter: it lives until the window has
                # ended and every reservation made in it can have been settled. Set once,
                # here, rather than by a PEXPIRE on every reserve. (A settle that finds
                # the counter gone, long after, makes it anew: the store would set its
                # TTL there too, in a rare round of its own; the prototype does not.)
                span = (self.seconds * 1000 - now % (self.seconds * 1000)) + 2 * self.ttl
                return ADMITTED, [("PEXPIRE", level, span, "NX")]
            return ADMITTED, []
        old = old.decode()
        if old.startswith("o ") and old.split()[2] == attempt:  # our own retry: as the first
            return ADMITTED, [undo]
        second: list[Command] = [undo]
        if old.startswith("o "):  # a reused id: the open one is contested (only its settle
            # or its deadline can end it, so the reuse cannot free someone else's tokens)
            second.append(("SET", self.record(txn), "c" + old[1:], "XX", "KEEPTTL"))
        return DUPLICATE, second

    # A settle: the first round claims the record (APPEND: the first claim after the
    # record is the taker, whoever else appends), the second, the taker's, applies it in
    # one MULTI: so a settle whose first round reached the store and whose second did not
    # is finished by its retry, and is never applied twice.

    def settle(self, txn: str, usage: int, attempt: str) -> list[Command]:
        rec = self.record(txn)
        return [
            ("APPEND", rec, f"|{attempt} {usage}"),
            ("PEXPIRE", rec, 2 * self.ttl, "NX"),  # a claim on nothing (an orphan) expires
            ("GET", rec),
        ]

    def settled(
        self,
        txn: str,
        usage: int,
        now: int,
        attempt: str,
        replies: list[Any],
        tombstone: str = "s",
    ) -> tuple[str | None, list[Command]]:
        head, *claims = replies[2].decode().split("|")
        parts = head.split()
        if head[:1] in ("s", "x"):  # ended: by the first claim, or an orphan's own attempt
            taker = parts[1] if len(parts) == 2 else claims[0].split()[0]
            return (SETTLED if head[0] == "s" and taker == attempt else FINISHED), []
        if claims[0].split()[0] != attempt or head.startswith("r"):
            return FINISHED, []  # another settle took it, or a remembered refusal
        if not head:  # nothing was reserved under this id: its usage, once, to now
            level = self.level(now)
            span = (self.seconds * 1000 - now % (self.seconds * 1000)) + 2 * self.ttl
            end: Command = ("SET", self.record(txn), f"s {attempt}", "PX", self.ttl)
            apply: list[Command] = [("INCRBY", level, usage), ("PEXPIRE", level, span, "NX"), end]
            return ORPHAN, [("MULTI",), *apply, ("EXEC",)]
        # The record becomes its own tombstone in place (its first byte; the claims after
        # it name the taker): no new value, and the TTL it was made with (two TTLs from
        # the reserve) keeps it at least a TTL past its deadline.
        _, est, _, level = parts
        end = ("SETRANGE", self.record(txn), 0, tombstone)
        apply = [("INCRBY", level, usage - int(est)), end, ("ZREM", self.due, txn)]
        return SETTLED, [("MULTI",), *apply, ("EXEC",)]

    # The settle as docs/budgets.md sketched it first: GETDEL, then the writes. Cheaper
    # by a command, but a retry of a settle whose GETDEL reached the store and whose
    # writes did not finds nothing and charges its usage as an orphan, while the
    # reservation's estimate stays held: measured for comparison only.

    def settle_getdel(self, txn: str) -> list[Command]:
        return [("GETDEL", self.record(txn))]

    def settled_getdel(
        self, txn: str, usage: int, attempt: str, replies: list[Any]
    ) -> list[Command]:
        _, est, _, level = replies[0].decode().split()
        return [
            ("INCRBY", level, usage - int(est)),
            ("SET", self.record(txn), f"s {attempt}", "PX", self.ttl),
            ("ZREM", self.due, txn),
        ]

    # Expiry: the daemon's periodic sweep, not a step of every call.

    def sweep(self, now: int) -> list[Command]:
        return [("ZRANGEBYSCORE", self.due, "-inf", now, "LIMIT", 0, 64)]


class BucketedBudget(CommandBudget):
    """The same calls with a cheaper deadline index: a reserve appends its id to a list
    per minute of deadlines (`due:<minute>`, RPUSH onto a list the budget's other reserves
    of that minute made) instead of a ZADD, and a settle removes nothing from it; the
    sweep reads a minute's list once it has passed (LRANGE, then the records in one MGET),
    ends the ones still open and deletes the list. A reservation ends up to a minute after
    its deadline; a list's TTL is set, like a counter's, by a second round on the reserve
    that created it (RPUSH answered 1)."""

    BUCKET = 60_000  # ms of deadlines per list

    def bucket(self, deadline: int) -> str:
        return f"{self.base}:due:{-(-deadline // self.BUCKET)}"

    def reserve(self, txn: str, est: int, now: int, attempt: str) -> list[Command]:
        return [
            ("INCRBY", self.level(now), est),
            (
                "SET",
                self.record(txn),
                f"o {est} {attempt} {self.level(now)}",
                "NX",
                "PX",
                2 * self.ttl,
                "GET",
            ),
            ("RPUSH", self.bucket(now + self.ttl), txn),
        ]

    def reserved(
        self, txn: str, est: int, now: int, attempt: str, replies: list[Any]
    ) -> tuple[str | None, list[Command]]:
        answer, second = super().reserved(txn, est, now, attempt, replies)
        second = [c for c in second if c[0] != "ZREM"]
        if replies[2] == 1:  # this reserve made the minute's list: its TTL, once
            second.append(("PEXPIRE", self.bucket(now + self.ttl), 2 * self.ttl, "NX"))
        return answer, second

    def settled(self, *args: Any, **kwargs: Any) -> tuple[str | None, list[Command]]:
        answer, second = super().settled(*args, **kwargs)
        return answer, [c for c in second if c[0] != "ZREM"]

    def sweep_bucket(self, client: redis.Redis, deadline: int) -> list[str]:
        """The ids of a passed minute's list whose records are still open (the sweep then
        ends each through the settle's claim); the list deleted."""
        key = self.bucket(deadline)
        ids = [t.decode() for t in pipeline(client, [("LRANGE", key, 0, -1)])[0]]
        records = pipeline(client, [("MGET", *map(self.record, ids))])[0] if ids else []
        pipeline(client, [("DEL", key)])
        return [t for t, r in zip(ids, records, strict=True) if r and r[:1] in (b"o", b"c")]


class FloorBudget(BucketedBudget):
    """The least a reserve can send: the counter and the record (INCRBY, SET NX PX GET),
    no deadline index. Expiry is then the record's own TTL, and an estimate nobody settled
    stays held in its window, as if charged: the `charge` policies' answer, without the
    expired series or an outbox event; `release` cannot be kept. Priced as a floor."""

    def reserve(self, txn: str, est: int, now: int, attempt: str) -> list[Command]:
        return super().reserve(txn, est, now, attempt)[:2]

    def reserved(
        self, txn: str, est: int, now: int, attempt: str, replies: list[Any]
    ) -> tuple[str | None, list[Command]]:
        return super().reserved(txn, est, now, attempt, [*replies, 0])


class HashBudget(CommandBudget):
    """Records as fields of small hashes rather than keys of their own (a new key cost a
    SET about 2 µs on a server holding many keys; a field of a small hash a fraction).

    `o`, a hash of the open records (`t:<id>`: `o <estimate> <attempt> <counter>
    <deadline>`) and of the settles' claims (`c:<id>`: `<attempt> <usage>`), small while
    few transactions are open: the sweep reads it whole (HGETALL). Tombstones go to a hash
    per `reservation_ttl` period (`s:<period>`, kept two periods), so that one is found
    for at least a TTL by looking in this period's and the last. A reserve: INCRBY, HSETNX
    the record, HEXISTS in both tombstone hashes (a finished id is refused). A settle:
    HSETNX its claim (the first claimer takes the record), HGET the record and the claim;
    then the taker's MULTI: INCRBY, HDEL record and claim, HSET the tombstone, EXPIRE NX
    its hash, EXEC. The rare paths (a reserve's id taken, a settle finding no record)
    read more in a further round."""

    def open(self) -> str:
        return f"{self.base}:o"

    def tombs(self, now: int) -> tuple[str, str]:
        period = now // self.ttl
        return f"{self.base}:s:{period}", f"{self.base}:s:{period - 1}"

    def reserve(self, txn: str, est: int, now: int, attempt: str) -> list[Command]:
        level = self.level(now)
        rec = f"o {est} {attempt} {level} {now + self.ttl}"
        this, last = self.tombs(now)
        return [
            ("INCRBY", level, est),
            ("HSETNX", self.open(), f"t:{txn}", rec),
            ("HEXISTS", this, txn),
            ("HEXISTS", last, txn),
        ]

    def reserved(
        self, txn: str, est: int, now: int, attempt: str, replies: list[Any]
    ) -> tuple[str | None, list[Command]]:
        after, new, finished = replies[0], replies[1], replies[2] or replies[3]
        level = self.level(now)
        undo = ("INCRBY", level, -est)
        if not new:  # the id is open: our own retry, or a reuse (`reserved_again`)
            return None, [undo, ("HGET", self.open(), f"t:{txn}")]
        if finished:
            return DUPLICATE, [undo, ("HDEL", self.open(), f"t:{txn}")]
        if after > self.limit:
            return REFUSED, [undo, ("HDEL", self.open(), f"t:{txn}")]
        if after == est:  # this reserve made the window's counter: its TTL, once
            span = (self.seconds * 1000 - now % (self.seconds * 1000)) + 2 * self.ttl
            return ADMITTED, [("PEXPIRE", level, span, "NX")]
        return ADMITTED, []

    def reserved_again(
        self, txn: str, attempt: str, replies: list[Any]
    ) -> tuple[str, list[Command]]:
        old = (replies[1] or b"").decode()
        if old.startswith("o ") and old.split()[2] == attempt:
            return ADMITTED, []
        if old.startswith("o "):
            return DUPLICATE, [("HSET", self.open(), f"t:{txn}", "c" + old[1:])]
        return DUPLICATE, []

    def settle(self, txn: str, usage: int, attempt: str) -> list[Command]:
        return [
            ("HSETNX", self.open(), f"c:{txn}", f"{attempt} {usage}"),
            ("HGET", self.open(), f"t:{txn}"),
            ("HGET", self.open(), f"c:{txn}"),
        ]

    def settled(
        self,
        txn: str,
        usage: int,
        now: int,
        attempt: str,
        replies: list[Any],
        tombstone: str = "s",
    ) -> tuple[str | None, list[Command]]:
        rec, claim = (replies[1] or b"").decode(), replies[2].decode()
        if claim.split()[0] != attempt:
            return FINISHED, []  # another settle claimed it first
        if not rec:  # settled before (by us?), or never reserved: the tombstones say
            return None, [("HGET", t, txn) for t in self.tombs(now)]
        if rec.startswith("r"):
            return FINISHED, [("HDEL", self.open(), f"c:{txn}")]
        _, est, _, level, _ = rec.split()
        return SETTLED, self.finish(txn, level, usage - int(est), now, f"{tombstone} {attempt}")

    def finish(self, txn: str, level: str, delta: int, now: int, tomb: str) -> list[Command]:
        this, _ = self.tombs(now)
        return [
            ("MULTI",),
            ("INCRBY", level, delta),
            ("HDEL", self.open(), f"t:{txn}", f"c:{txn}"),
            ("HSET", this, txn, tomb),
            ("PEXPIRE", this, 2 * self.ttl, "NX"),
            ("EXEC",),
        ]

    def settled_again(
        self, txn: str, usage: int, now: int, attempt: str, replies: list[Any]
    ) -> tuple[str, list[Command]]:
        tomb = next((r.decode() for r in replies if r), "")
        drop = [("HDEL", self.open(), f"c:{txn}")]  # our claim on a record already gone
        if tomb:
            return (SETTLED if tomb == f"s {attempt}" else FINISHED), drop
        level = self.level(now)
        span = (self.seconds * 1000 - now % (self.seconds * 1000)) + 2 * self.ttl
        apply = self.finish(txn, level, usage, now, f"s {attempt}")
        return ORPHAN, [*apply[:-1], ("PEXPIRE", level, span, "NX"), apply[-1]]


class ClaimBudget(CommandBudget):
    """Records as integer fields of one hash per budget, kept a hash table, and claims made
    by the arithmetic of `HINCRBY` (the design that reaches 2.5x: module docstring).

    `t`, the budget's hash: per transaction a field `<id>` whose value is an integer, the
    estimate (bits 0-31) and the reserve's second (bits 32-52, modulo 2^21: a record
    lives a TTL, far less than the 24 days that wrap), with APPLIED (2^62) added once its
    settle, close or expiry is applied (EXPIRED, 2^60, with it when by expiry). A second
    HINCRBY of APPLIED would pass 2^63: Redis refuses it as an overflow and changes
    nothing, so adding APPLIED is the claim, and only one caller's claim can succeed. A
    field `~` with a value longer than `hash-max-listpack-value` (64 bytes) makes the
    hash a hash table when it is made, and it stays one: a listpack, the encoding a hash
    of up to `hash-max-listpack-entries` (512) fields has by default, is read by a linear
    scan, which is what made `HashBudget` cost what it did (HSETNX 1.8 µs in a listpack
    of 321 fields against 0.7 in a table). Counters per window start as `CommandBudget`.

    A reserve (one round): INCRBY the counter, HSETNX the record, HLEN (the budget's
    transaction bound). A settle: HGET the record; then HINCRBY APPLIED (the claim) and
    INCRBY the counter by usage - estimate, in that order in one write, without MULTI. A
    settle stopped after its read is simply done again. One stopped between its claim and
    its charge (a connection cut inside the write, a failover that kept the first
    command) leaves its reservation charged at its estimate, the `unsettled: charge`
    outcome, an upper bound of the usage: never charged twice, since the claim is made.
    When the claim overflows (another settle, its own earlier attempt whose reply was
    lost, or the sweep, applied it first) a third round takes its increment back. What
    HINCRBY answers minus the claim is what the record held: a settle that found nothing
    (an orphan) but raced a reserve of the same id sees that reserve's record there and
    corrects to it. An orphan's charge and claim do go in a MULTI: either order alone can
    charge it twice or not at all, and an orphan is rare. No attempt id is written
    anywhere: the claim, not the caller, decides who applied.

    The sweep (the daemon's, per budget, every half TTL or so): HSCAN the hash; a
    record open past its deadline is ended by the same claim (charged or released by the
    policy); a record applied a TTL ago is deleted (HDEL, in batches); the hash's TTL set
    again (PEXPIRE), which no call then has to do."""

    EST_BITS = 32
    TIME_MOD = 2**21
    APPLIED = 2**62
    EXPIRED = 2**60
    FILLER = "x" * 65  # longer than hash-max-listpack-value: the hash is a table

    @property
    def table(self) -> str:
        return f"{self.base}:t"

    def value(self, est: int, now: int) -> int:
        return est + ((now // 1000 % self.TIME_MOD) << self.EST_BITS)

    def read(self, value: int, now: int) -> tuple[bool, bool, int, int]:
        """(applied, expired, estimate, the reserve's instant in ms, to the second)."""
        applied, expired = value >= self.APPLIED, value % self.APPLIED >= self.EXPIRED
        value %= self.EXPIRED
        est, second = value % 2**self.EST_BITS, value >> self.EST_BITS
        back = (now // 1000 - second) % self.TIME_MOD  # seconds since the reserve
        return applied, expired, est, (now // 1000 - back) * 1000

    def reserve(self, txn: str, est: int, now: int, attempt: str) -> list[Command]:
        return [
            ("INCRBY", self.level(now), est),
            ("HSETNX", self.table, txn, self.value(est, now)),
            ("HLEN", self.table),
        ]

    def reserved(
        self, txn: str, est: int, now: int, attempt: str, replies: list[Any]
    ) -> tuple[str | None, list[Command]]:
        after, new, held = replies
        level = self.level(now)
        undo = ("INCRBY", level, -est)
        if not new:  # the id is taken: our own retry (its reply lost), or a reuse
            return None, [undo, ("HGET", self.table, txn)]
        second: list[Command] = []
        if held == 1:  # this reserve made the hash: a table from now on
            second.append(("HSET", self.table, "~", self.FILLER))
        if after > self.limit:
            return REFUSED, [undo, ("HDEL", self.table, txn)]
        if after == est:  # this reserve made the window's counter: its TTL, once
            span = (self.seconds * 1000 - now % (self.seconds * 1000)) + 2 * self.ttl
            second.append(("PEXPIRE", level, span, "NX"))
        return ADMITTED, second

    def reserved_again(
        self, txn: str, est: int, now: int, attempt: str, replies: list[Any], *, retry: bool
    ) -> str:
        """A taken id: the reserve's own retry finds the value it wrote (the caller knows it
        is retrying: a first attempt that finds an id taken is always a reuse)."""
        found = int(replies[1] or 0)
        return ADMITTED if retry and found == self.value(est, now) else DUPLICATE

    def settle(self, txn: str, usage: int, attempt: str) -> list[Command]:
        return [("HGET", self.table, txn)]

    # Whether a settle's claim and charge go in a MULTI (`WrappedClaimBudget`): not
    # needed for safety, as the claim is sent first (class docstring), and its EXEC
    # costs more than the two commands it runs.
    WRAPPED = False

    def apply(
        self, txn: str, level: str, delta: int, mark: int, *, wrap: bool = False
    ) -> list[Command]:
        round_ = [("HINCRBY", self.table, txn, mark), ("INCRBY", level, delta)]
        return [("MULTI",), *round_, ("EXEC",)] if wrap or self.WRAPPED else round_

    def settled(
        self,
        txn: str,
        usage: int,
        now: int,
        attempt: str,
        replies: list[Any],
        tombstone: str = "s",
    ) -> tuple[str | None, list[Command]]:
        """(None, the second round), which `applied` reads; FINISHED when the record says
        it was applied. The claim also moves the record's second to now, so that its
        tombstone lives a TTL from its end (the sweep deletes it then)."""
        mark = self.APPLIED + (self.EXPIRED if tombstone == "x" else 0)
        if replies[0] is None:  # nothing reserved under this id: its usage, to now
            level = self.level(now)
            return None, self.apply(txn, level, usage, mark + self.value(0, now), wrap=True)
        applied, _, est, at = self.read(int(replies[0]), now)
        if applied:
            return FINISHED, []
        moved = (now // 1000 - at // 1000) << self.EST_BITS
        return None, self.apply(txn, self.level(at), usage - est, mark + moved)

    def applied(
        self,
        txn: str,
        usage: int,
        now: int,
        second: list[Command],
        replies: list[Any],
        *,
        orphan: bool,
    ) -> tuple[str, list[Command]]:
        """The answer of the second round, and the round that mends it, if any."""
        if second[0][0] == "MULTI":
            claim, _ = replies[-1]
            _, (_, _, _, mark), (_, level, delta), _ = second
        else:
            claim = replies[0]
            (_, _, _, mark), (_, level, delta) = second
        if isinstance(claim, redis.ResponseError):  # another applied it first: ours back
            return FINISHED, [("INCRBY", level, -delta)]
        before = claim - mark
        if orphan and before:  # a reserve made the record meanwhile: settled against it
            _, _, est, at = self.read(before, now)
            return SETTLED, [
                ("INCRBY", level, -delta),
                ("INCRBY", self.level(at), usage - est),
                ("HINCRBY", self.table, txn, -self.value(0, at)),  # its second: now's
            ]
        if orphan:
            span = (self.seconds * 1000 - now % (self.seconds * 1000)) + 2 * self.ttl
            return ORPHAN, [("PEXPIRE", level, span, "NX")]
        return SETTLED, []

    def sweep_table(
        self, client: redis.Redis, now: int, *, charge: bool, cursor_count: int = 1000
    ) -> tuple[int, int]:
        """One sweep of the hash at `now`: (reservations ended, tombstones deleted)."""
        ended, gone, cursor = 0, [], 0
        while True:
            scan = ("HSCAN", self.table, cursor, "COUNT", cursor_count)
            cursor, flat = pipeline(client, [scan])[0]
            cursor = int(cursor)
            for txn, value in zip(flat[::2], flat[1::2], strict=True):
                if txn == b"~":
                    continue
                applied, _, est, at = self.read(int(value), now)
                if at + self.ttl > now:
                    continue
                if applied:
                    gone.append(txn)
                elif (
                    settle(
                        client,
                        self,
                        txn.decode(),
                        est if charge else 0,
                        now,
                        "sweep",
                        tombstone="x",
                    )
                    == SETTLED
                ):
                    ended += 1
            if not cursor:
                break
        rounds: list[Command] = [("PEXPIRE", self.table, 3 * self.ttl)]
        for i in range(0, len(gone), 256):
            rounds.append(("HDEL", self.table, *gone[i : i + 256]))
        pipeline(client, rounds)
        return ended, len(gone)


class WrappedClaimBudget(ClaimBudget):
    """`ClaimBudget` with each settle's claim and charge in a MULTI, measured beside it:
    what the transaction would cost."""

    WRAPPED = True


def raw(client: redis.Redis) -> redis.Redis:
    """A client on `client`'s connections that hands back replies as the server sent them
    (redis-py turns a SET's reply into a bool, even SET ... GET's old value)."""
    out = redis.Redis(connection_pool=client.connection_pool)
    out.response_callbacks.clear()
    return out


def pipeline(
    client: redis.Redis, commands: Iterable[Command], *, errors: bool = False
) -> list[Any]:
    """One round of `commands` (replies as sent: `raw`); an error reply raised, or with
    `errors` handed back in its place (a claim's overflow)."""
    pipe = raw(client).pipeline(transaction=False)
    for cmd in commands:
        pipe.execute_command(*cmd)
    return pipe.execute(raise_on_error=not errors)


# The calls one at a time, a round per round trip, as a daemon makes them.


def reserve(
    client: redis.Redis,
    b: CommandBudget,
    txn: str,
    est: int,
    now: int,
    attempt: str,
    *,
    retry: bool = False,
) -> str:
    answer, second = b.reserved(
        txn, est, now, attempt, pipeline(client, b.reserve(txn, est, now, attempt))
    )
    if second:
        replies = pipeline(client, second)
        if answer is None and isinstance(b, ClaimBudget):
            answer = b.reserved_again(txn, est, now, attempt, replies, retry=retry)
        elif answer is None:  # a rare path that reads more first (`HashBudget`)
            assert isinstance(b, HashBudget)
            answer, third = b.reserved_again(txn, attempt, replies)
            if third:
                pipeline(client, third)
    assert answer is not None
    return answer


def settle(
    client: redis.Redis,
    b: CommandBudget,
    txn: str,
    usage: int,
    now: int,
    attempt: str,
    *,
    first_round_only: bool = False,
    tombstone: str = "s",
) -> str:
    replies = pipeline(client, b.settle(txn, usage, attempt))
    answer, second = b.settled(txn, usage, now, attempt, replies, tombstone)
    if answer is None and isinstance(b, ClaimBudget):  # the claim and charge, then mend
        if first_round_only:
            return SETTLED
        answer, third = b.applied(
            txn,
            usage,
            now,
            second,
            pipeline(client, second, errors=True),
            orphan=replies[0] is None,
        )
        if third:
            pipeline(client, third)
        return answer
    if answer is None:  # a rare path that reads more first (`HashBudget`)
        assert isinstance(b, HashBudget)
        answer, second = b.settled_again(txn, usage, now, attempt, pipeline(client, second))
    if second and not first_round_only:
        pipeline(client, second)
    return answer


def sweep(client: redis.Redis, b: CommandBudget, now: int, *, charge: bool) -> int:
    """End the reservations past their deadline by the policy (charge the estimate, or
    release it), through the settle's claim: a settle racing the sweep is applied once."""
    ended = 0
    for txn in pipeline(client, b.sweep(now))[0]:
        txn = txn.decode()
        rec = client.get(b.record(txn))
        est = int(rec.split()[1]) if rec and rec[:1] in (b"o", b"c") else 0
        answer = settle(
            client,
            b,
            txn,
            est if charge else 0,
            now,
            "sweep-" + secrets.token_hex(4),
            tombstone="x",
        )
        if answer != SETTLED:
            client.zrem(b.due, txn)  # a tombstone or a settle's: nothing to end
        ended += answer == SETTLED
    return ended


def counter(client: redis.Redis, key: str) -> int:
    """A counter's value (0: absent)."""
    return int(client.get(key) or 0)  # type: ignore[arg-type]


def check(address: str) -> dict[str, str]:
    """The properties the store must keep, on the prototypes (module docstring)."""
    host, port = address.split(":")
    client = redis.Redis(host=host, port=int(port))
    client.flushall()
    out = {}
    for kind in (CommandBudget, HashBudget):
        out.update({f"{kind.__name__}, {k}": v for k, v in check_calls(address, kind).items()})
    out.update(check_expiry(client))
    out.update(check_claim(address))
    client.flushall()
    client.close()
    return out


def overshoot(address: str, client: redis.Redis, b: CommandBudget) -> str:
    """Concurrent reserves on `b`, each thread its own connection: none admitted past the
    limit, and the counter the sum of those admitted once the refusals were undone."""
    host, port = address.split(":")
    admitted: list[int] = []
    lock = threading.Lock()

    def crowd(k: int) -> None:
        c = redis.Redis(host=host, port=int(port))
        for i in range(25):
            est = 300 + (k * 37 + i * 11) % 900
            if reserve(c, b, f"t{k}-{i}", est, NOW, secrets.token_hex(4)) == ADMITTED:
                with lock:
                    admitted.append(est)
        c.close()

    threads = [threading.Thread(target=crowd, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    level = counter(client, b.level(NOW))
    assert sum(admitted) <= b.limit and level == sum(admitted), (sum(admitted), level)
    return (
        f"8 threads x 25 reserves: {len(admitted)} admitted, {sum(admitted)} tokens of "
        f"{b.limit}, the counter {level} once the refusals were undone"
    )


def check_calls(address: str, kind: type[CommandBudget]) -> dict[str, str]:
    """Overshoot, retries and duplicates on a budget kept as `kind` keeps it."""
    host, port = address.split(":")
    client = redis.Redis(host=host, port=int(port))
    out = {}
    b = kind(f"crowd-{kind.__name__}", limit=10_000)
    out["overshoot"] = overshoot(address, client, b)

    b = kind(f"ann-{kind.__name__}", limit=10_000)
    # A retried reserve (its reply lost) answers as the first did, reserving once.
    assert reserve(client, b, "r1", 1000, NOW, "a1") == ADMITTED
    assert reserve(client, b, "r1", 1000, NOW, "a1") == ADMITTED
    assert counter(client, b.level(NOW)) == 1000
    # A reused id is refused, holding nothing more.
    assert reserve(client, b, "r1", 1000, NOW, "a2") == DUPLICATE
    assert counter(client, b.level(NOW)) == 1000
    # A settle whose first round reached the store and whose second did not: its retry
    # finishes it; a retry after that answers as it did; another settle changes nothing.
    assert settle(client, b, "r1", 800, NOW, "s1", first_round_only=True) == SETTLED
    assert counter(client, b.level(NOW)) == 1000
    assert settle(client, b, "r1", 800, NOW, "s1") == SETTLED
    assert settle(client, b, "r1", 800, NOW, "s1") == SETTLED
    assert settle(client, b, "r1", 800, NOW, "s2") == FINISHED
    assert counter(client, b.level(NOW)) == 800
    # A settle of an id never reserved charges its usage once.
    assert settle(client, b, "o1", 50, NOW, "s3") == ORPHAN
    assert settle(client, b, "o1", 50, NOW, "s4") == FINISHED
    assert counter(client, b.level(NOW)) == 850
    out["idempotency"] = (
        "a retried reserve reserves once; a reused id is refused; a settle retried after "
        "its first round is charged once; a duplicate settle once; an orphan once"
    )
    client.close()
    return out


def check_expiry(client: redis.Redis) -> dict[str, str]:
    """The sweep of `CommandBudget` (its deadline set)."""
    out = {}
    b = CommandBudget("expiry", limit=10_000)
    assert reserve(client, b, "r1", 900, NOW, "a0") == ADMITTED
    assert settle(client, b, "r1", 850, NOW, "s0") == SETTLED
    # Expiry by the sweep, by policy: charged, then released; a late settle changes nothing.
    assert reserve(client, b, "e1", 1000, NOW, "a3") == ADMITTED
    assert sweep(client, b, NOW + TTL - 1, charge=True) == 0
    assert sweep(client, b, NOW + TTL, charge=True) == 1
    assert settle(client, b, "e1", 10, NOW, "s5") == FINISHED
    assert reserve(client, b, "e2", 1000, NOW, "a4") == ADMITTED
    assert sweep(client, b, NOW + TTL, charge=False) == 1
    assert counter(client, b.level(NOW)) == 1850 and client.zcard(b.due) == 0
    out["CommandBudget, expiry"] = (
        "the sweep ends a reservation at its deadline, charged or released by the policy; "
        "a late settle changes nothing"
    )
    return out


def check_claim(address: str) -> dict[str, str]:
    """`ClaimBudget`'s answers to the same faults: it keeps no attempt id, so a retry is
    told apart by what it finds (module docstring)."""
    host, port = address.split(":")
    client = redis.Redis(host=host, port=int(port))
    out = {}
    b = ClaimBudget("crowd-claim", limit=10_000)
    out["ClaimBudget, overshoot"] = overshoot(address, client, b)
    assert client.object("encoding", b.table) == b"hashtable"

    b = ClaimBudget("ann-claim", limit=10_000)
    assert reserve(client, b, "r1", 1000, NOW, "") == ADMITTED
    assert reserve(client, b, "r1", 1000, NOW, "", retry=True) == ADMITTED
    assert counter(client, b.level(NOW)) == 1000
    assert reserve(client, b, "r1", 1000, NOW, "") == DUPLICATE
    assert counter(client, b.level(NOW)) == 1000
    # A settle stopped after its read is done again; once applied, a retry finds it done.
    later = NOW + 5000
    assert settle(client, b, "r1", 800, later, "", first_round_only=True) == SETTLED
    assert counter(client, b.level(NOW)) == 1000
    assert settle(client, b, "r1", 800, later, "") == SETTLED
    assert settle(client, b, "r1", 800, later, "") == FINISHED
    assert counter(client, b.level(NOW)) == 800
    # Two settles (or a settle and its own retry) that both read the record open: one
    # claim succeeds, the other's increment is taken back.
    assert reserve(client, b, "r2", 1000, NOW, "") == ADMITTED
    firsts = [pipeline(client, b.settle("r2", 600, "")) for _ in range(2)]
    seconds = [b.settled("r2", 600, later, "", r)[1] for r in firsts]
    answers = [
        b.applied("r2", 600, later, second, pipeline(client, second, errors=True), orphan=False)
        for second in seconds
    ]
    for _, third in answers:
        if third:
            pipeline(client, third)
    assert [a for a, _ in answers] == [SETTLED, FINISHED], answers
    assert counter(client, b.level(NOW)) == 1400
    # An orphan's usage, once; an orphan that raced a reserve of its id, as its settle.
    assert settle(client, b, "o1", 50, NOW, "") == ORPHAN
    assert settle(client, b, "o1", 50, NOW, "") == FINISHED
    assert counter(client, b.level(NOW)) == 1450
    first = pipeline(client, b.settle("o2", 300, ""))
    assert reserve(client, b, "o2", 1000, NOW, "") == ADMITTED
    second = b.settled("o2", 300, later, "", first)[1]
    claimed = pipeline(client, second, errors=True)
    answer, third = b.applied("o2", 300, later, second, claimed, orphan=True)
    pipeline(client, third)
    assert answer == SETTLED and counter(client, b.level(NOW)) == 1750
    assert settle(client, b, "o2", 300, later, "") == FINISHED
    assert reserve(client, b, "o2", 1000, later, "") == DUPLICATE
    out["ClaimBudget, idempotency"] = (
        "a retried reserve reserves once; a reused id is refused; a settle retried after "
        "its read is charged once; two settles that both read it open, once; an orphan "
        "once; an orphan racing a reserve of its id, as that reservation's settle"
    )

    # Expiry by the sweep, by policy; tombstones a TTL after their end.
    b = ClaimBudget("expiry-claim", limit=10_000)
    assert reserve(client, b, "e1", 1000, NOW, "") == ADMITTED
    assert reserve(client, b, "e2", 700, NOW, "") == ADMITTED
    assert b.sweep_table(client, NOW + TTL - 1000, charge=True) == (0, 0)
    assert b.sweep_table(client, NOW + TTL, charge=True) == (2, 0)
    assert settle(client, b, "e1", 10, NOW + TTL, "") == FINISHED
    assert reserve(client, b, "e3", 900, NOW, "") == ADMITTED
    assert b.sweep_table(client, NOW + TTL, charge=False) == (1, 0)
    assert counter(client, b.level(NOW)) == 1700
    assert b.sweep_table(client, NOW + 2 * TTL, charge=False) == (0, 3)
    assert client.hkeys(b.table) == [b"~"]
    out["ClaimBudget, expiry"] = (
        "the sweep ends a reservation at its deadline, charged or released by the policy; "
        "a late settle changes nothing; a tombstone is deleted a TTL after its end"
    )
    client.close()
    return out


# Measurement.


def commandstats(client: redis.Redis) -> dict[str, float]:
    return {k[len("cmdstat_") :]: float(v["usec"]) for k, v in client.info("commandstats").items()}


class Meter:
    """Server µs of each measured call's top-level commands, accumulated over chunks
    (EVALSHA's and EXEC's figures include the commands they run, so those are left out)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.usec: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.commands: dict[str, dict[str, float]] = {}

    def measure(
        self, name: str, top: tuple[str, ...], calls: int, work: Callable[[], None]
    ) -> None:
        before = commandstats(self.client)
        work()
        after = commandstats(self.client)
        spent = {k: after[k] - before.get(k, 0.0) for k in after if k != "info"}
        self.usec[name] = self.usec.get(name, 0.0) + sum(spent.get(k, 0.0) for k in top)
        self.calls[name] = self.calls.get(name, 0) + calls
        mine = self.commands.setdefault(name, {})
        for k, v in spent.items():
            if v:
                mine[k] = mine.get(k, 0.0) + v

    def per_call(self) -> dict[str, float]:
        return {name: self.usec[name] / self.calls[name] for name in self.usec}

    def per_command(self) -> dict[str, dict[str, float]]:
        return {
            name: {k: round(v / self.calls[name], 3) for k, v in sorted(c.items())}
            for name, c in self.commands.items()
        }


class CallgrindMeter(Meter):
    """Instructions the whole redis-server process ran per call (read, parse, execute,
    reply, its timers), under callgrind: zeroed before each measured batch, dumped after
    (`callgrind_control`). Deterministic where the µs of a shared machine are not."""

    def __init__(self, client: redis.Redis, pid: int, workdir: Path) -> None:
        super().__init__(client)
        self.pid = pid
        self.workdir = workdir

    def control(self, option: str) -> None:
        subprocess.run(
            ["callgrind_control", option, str(self.pid)], check=True, capture_output=True
        )

    def measure(
        self, name: str, top: tuple[str, ...], calls: int, work: Callable[[], None]
    ) -> None:
        self.control("-z")
        work()
        self.control("-d")
        dumps = sorted(self.workdir.glob("callgrind.out.*.*"), key=lambda p: int(p.suffix[1:]))
        totals = next(
            int(line.split()[1])
            for line in dumps[-1].read_text().splitlines()
            if line.startswith("totals:")
        )
        self.usec[name] = self.usec.get(name, 0.0) + totals
        self.calls[name] = self.calls.get(name, 0) + calls


def callgrind_run(calls: int, workdir: Path, store: str) -> dict[str, float]:
    """Instructions per call of every design (`CallgrindMeter`), one run on a redis-server
    under valgrind."""
    sock = workdir / "redis.sock"
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--dump-instr=no",
            f"--callgrind-out-file={workdir}/callgrind.out.%p",
            server_binary(store),
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(unix_socket_path=str(sock))

        def up() -> bool:
            try:
                return bool(client.ping())
            except (redis.RedisError, OSError):
                return False

        wait_for(up, 120, "redis-server under valgrind")
        meter = run_once(client, calls, "cg-", CallgrindMeter(client, proc.pid, workdir))
        client.close()
        return {name: round(v) for name, v in meter.per_call().items()}
    finally:
        proc.terminate()
        proc.wait(60)


def resp_args(data: bytes) -> list[bytes]:
    """The arguments of one RESP array of bulk strings (`lua.encode`'s call)."""
    lines = data.split(b"\r\n")
    return [lines[i] for i in range(2, 2 * int(lines[0][1:]) + 1, 2)]


# The calls measured: name -> what it sends, in the table's words.
CALLS = {
    "plain": "INCRBY + EXPIRE (a plain decision)",
    "script_reserve": "the script (EVALSHA), today",
    "script_settle": "the script (EVALSHA), today",
    "reserve": "INCRBY, SET NX PX GET, ZADD NX: one round",
    "settle": "APPEND, PEXPIRE NX, GET; then MULTI, INCRBY, SETRANGE, ZREM, EXEC",
    "settle_getdel": "GETDEL; then INCRBY, SET PX, ZREM (not retry-safe)",
    "bucketed_reserve": "INCRBY, SET NX PX GET, RPUSH due:<minute>: one round",
    "bucketed_settle": "APPEND, PEXPIRE NX, GET; then MULTI, INCRBY, SETRANGE, EXEC",
    "bucketed_sweep": "per transaction: its share of LRANGE, MGET, DEL of its minute's list",
    "floor_reserve": "INCRBY, SET NX PX GET (no deadline index)",
    "hash_reserve": "INCRBY, HSETNX o, HEXISTS s:<period> x 2: one round",
    "hash_settle": "HSETNX o (claim), HGET o x 2; "
    "then MULTI, INCRBY, HDEL o, HSET s, PEXPIRE NX, EXEC",
    "claim_reserve": "INCRBY, HSETNX t, HLEN t: one round",
    "claim_settle": "HGET t; then HINCRBY t (the claim), INCRBY",
    "claim_settle_multi": "HGET t; then MULTI, HINCRBY t (the claim), INCRBY, EXEC",
    "claim_sweep": "per transaction: its share of a sweep each half TTL (HSCAN, HDEL, PEXPIRE)",
}
# ... and the top-level commands it sends, whose INFO commandstats make its server µs.
TOP_LEVEL = {
    "plain": ("incrby", "expire"),
    "script_reserve": ("evalsha",),
    "script_settle": ("evalsha",),
    "reserve": ("incrby", "set", "zadd", "pexpire"),
    "settle": ("append", "pexpire", "get", "multi", "exec"),
    "settle_getdel": ("getdel", "incrby", "set", "zrem"),
    "bucketed_reserve": ("incrby", "set", "rpush", "pexpire"),
    "bucketed_settle": ("append", "pexpire", "get", "multi", "exec"),
    "bucketed_sweep": ("lrange", "mget", "del"),
    "floor_reserve": ("incrby", "set", "pexpire"),
    "hash_reserve": ("incrby", "hsetnx", "hexists", "pexpire"),
    "hash_settle": ("hsetnx", "hget", "multi", "exec"),
    "claim_reserve": ("incrby", "hsetnx", "hlen", "hset", "pexpire"),
    # (the commands a MULTI runs are counted by EXEC's figure and their own: listed once)
    "claim_settle": ("hget", "hincrby", "incrby", "pexpire"),
    "claim_settle_multi": ("hget", "multi", "exec", "pexpire"),
    "claim_sweep": ("hscan", "hdel", "pexpire"),
}


def run_once(client: redis.Redis, calls: int, tag: str, meter: Meter | None = None) -> Meter:
    """One run of every design on fresh transactions, chunk by chunk, alternating."""
    client.flushall()
    # A server that already holds keys (a rate limiter's counters): the run's own new keys
    # (records, tombstones) then fit the keyspace's table as sized, so that no resize is
    # charged to the calls that happen to grow it.
    for i in range(0, FILLER, 1000):
        client.mset({f"filler:{j}": 1 for j in range(i, i + 1000)})
    meter = meter or Meter(client)
    designs: dict[str, list[Any]] = {
        "": [CommandBudget(f"u{u}", BIG) for u in range(BUDGETS)],
        "bucketed_": [BucketedBudget(f"k{u}", BIG) for u in range(BUDGETS)],
        "floor_": [FloorBudget(f"f{u}", BIG) for u in range(BUDGETS)],
        "hash_": [HashBudget(f"h{u}", BIG) for u in range(BUDGETS)],
        "claim_": [ClaimBudget(f"c{u}", BIG) for u in range(BUDGETS)],
        "claimw_": [WrappedClaimBudget(f"w{u}", BIG) for u in range(BUDGETS)],
    }
    window = (fixed(3600, BIG),)
    states = [budget_keys("", "llm", [("user", f"u{u}")])[0] for u in range(BUDGETS)]

    def script(kind: int, u: int, txn: str, amount: int) -> Command:
        c = Call(kind, states[u], window, NOW, txn, amount, TTL, charge=True)
        return tuple(resp_args(lua.encode(c)))

    warm = Call(RELEASE, "warm", window, NOW, "w", 0, TTL)
    pipeline(client, [tuple(resp_args(lua.encode(warm, load=True)))])
    for design in designs.values():  # each window's counter made (and its TTL set) once
        for u, b in enumerate(design):
            t = f"{tag}warm{u}"
            for _ in range(2):  # the second makes the minute's list of a bucketed one
                t += "-"
                _, second = b.reserved(t, 1, NOW, "w", pipeline(client, b.reserve(t, 1, NOW, "w")))
                pipeline(client, second)
                settle(client, b, t, 1, NOW, "w")

    Ids = list[tuple[int, str]]  # (budget, transaction) per call of a chunk

    def plain(ids: Ids) -> None:
        counters = (f"{{u{u}}}k" for u, _ in ids)
        pipeline(
            client, (c for k in counters for c in (("INCRBY", k, ESTIMATE), ("EXPIRE", k, 3600)))
        )

    def script_reserve(ids: Ids) -> None:
        for reply in pipeline(client, (script(RESERVE, u, t, ESTIMATE) for u, t in ids)):
            assert reply[0] == 1, reply

    def script_settle(ids: Ids) -> None:
        for reply in pipeline(client, (script(SETTLE, u, t, USAGE) for u, t in ids)):
            assert reply[0] == 4, reply

    def command_reserve(budgets: list[CommandBudget], ids: Ids) -> None:
        rounds = [budgets[u].reserve(t, ESTIMATE, NOW, "a" + t) for u, t in ids]
        replies = iter(pipeline(client, (c for r in rounds for c in r)))
        seconds: list[Command] = []
        for (u, t), r in zip(ids, rounds, strict=True):
            first = [next(replies) for _ in r]
            answer, second = budgets[u].reserved(t, ESTIMATE, NOW, "a" + t, first)
            assert answer == ADMITTED, answer
            seconds += second
        if seconds:
            pipeline(client, seconds)

    def command_settle(budgets: list[CommandBudget], ids: Ids) -> None:
        rounds = [budgets[u].settle(t, USAGE, "s" + t) for u, t in ids]
        replies = iter(pipeline(client, (c for r in rounds for c in r)))
        seconds = []
        for (u, t), r in zip(ids, rounds, strict=True):
            first = [next(replies) for _ in r]
            answer, second = budgets[u].settled(t, USAGE, NOW, "s" + t, first)
            assert answer == SETTLED, answer
            seconds += second
        pipeline(client, seconds)

    def settle_getdel(budgets: list[CommandBudget], ids: Ids) -> None:
        replies = pipeline(client, (budgets[u].settle_getdel(t)[0] for u, t in ids))
        seconds = []
        for (u, t), reply in zip(ids, replies, strict=True):
            seconds += budgets[u].settled_getdel(t, USAGE, "s" + t, [reply])
        pipeline(client, seconds)

    # A claim budget's chunks are a tenth of a TTL apart (its own clock: a minute at the
    # default 10m), and every fifth ends with the sweep of every budget (so a reservation
    # nobody settles is ended up to half a TTL after its deadline): tombstones live a TTL,
    # so its hashes hold some hundred records each, and each record is read by two or
    # three sweeps before one deletes it.
    def claim_reserve(budgets: list[ClaimBudget], ids: Ids, now: int) -> None:
        rounds = [budgets[u].reserve(t, ESTIMATE, now, "") for u, t in ids]
        replies = pipeline(client, (c for r in rounds for c in r))
        seconds: list[Command] = []
        for i, (u, t) in enumerate(ids):
            answer, second = budgets[u].reserved(t, ESTIMATE, now, "", replies[3 * i : 3 * i + 3])
            assert answer == ADMITTED, answer
            seconds += second
        if seconds:
            pipeline(client, seconds)

    def claim_settle(budgets: list[ClaimBudget], ids: Ids, now: int) -> None:
        replies = pipeline(client, (budgets[u].settle(t, USAGE, "")[0] for u, t in ids))
        seconds = []
        for (u, t), reply in zip(ids, replies, strict=True):
            answer, second = budgets[u].settled(t, USAGE, now, "", [reply])
            assert answer is None and reply is not None, answer
            seconds.append(second)
        applied = iter(pipeline(client, (c for second in seconds for c in second), errors=True))
        thirds: list[Command] = []
        for (u, t), second in zip(ids, seconds, strict=True):
            got = [next(applied) for _ in second]
            answer, third = budgets[u].applied(t, USAGE, now, second, got, orphan=False)
            assert answer == SETTLED, answer
            thirds += third
        if thirds:
            pipeline(client, thirds)

    def claim_sweep(budgets: list[ClaimBudget], now: int, chunk: int) -> None:
        if chunk % CLAIM_SWEEP_CHUNKS != CLAIM_SWEEP_CHUNKS - 1:
            return
        for b in budgets:
            assert b.sweep_table(client, now, charge=True)[0] == 0

    def bucketed_sweep(budgets: list[BucketedBudget]) -> None:
        # Every reservation of the chunk is settled: the sweep finds nothing open.
        for b in budgets:
            assert b.sweep_bucket(client, NOW + TTL) == []

    plain_, bucketed, floor = designs[""], designs["bucketed_"], designs["floor_"]
    hashed, claimed, wrapped = designs["hash_"], designs["claim_"], designs["claimw_"]
    for chunk in range(calls // CHUNK):
        ids = [(i % BUDGETS, f"{tag}{chunk}-{i}") for i in range(CHUNK)]
        minute = NOW + chunk * TTL // 10
        later = [(u, "g" + t) for u, t in ids]  # the GETDEL settle's own reservations
        meter.measure("plain", TOP_LEVEL["plain"], CHUNK, partial(plain, ids))
        for name, work in (
            ("script_reserve", partial(script_reserve, ids)),
            ("reserve", partial(command_reserve, plain_, ids)),
            ("bucketed_reserve", partial(command_reserve, bucketed, ids)),
            ("floor_reserve", partial(command_reserve, floor, ids)),
            ("hash_reserve", partial(command_reserve, hashed, ids)),
            ("script_settle", partial(script_settle, ids)),
            ("settle", partial(command_settle, plain_, ids)),
            ("bucketed_settle", partial(command_settle, bucketed, ids)),
            ("hash_settle", partial(command_settle, hashed, ids)),
            ("bucketed_sweep", partial(bucketed_sweep, bucketed)),
            ("claim_reserve", partial(claim_reserve, claimed, ids, minute)),
            ("claim_settle", partial(claim_settle, claimed, ids, minute)),
            ("claim_sweep", partial(claim_sweep, claimed, minute, chunk)),
        ):
            meter.measure(name, TOP_LEVEL[name], CHUNK, work)
        claim_reserve(wrapped, ids, minute)  # not measured: a reserve as above
        meter.measure(
            "claim_settle_multi",
            TOP_LEVEL["claim_settle_multi"],
            CHUNK,
            partial(claim_settle, wrapped, ids, minute),
        )
        claim_sweep(wrapped, minute, chunk)
        command_reserve(plain_, later)  # not measured: a reserve as above
        meter.measure(
            "settle_getdel",
            TOP_LEVEL["settle_getdel"],
            CHUNK,
            partial(settle_getdel, plain_, later),
        )
    return meter


def sweep_cost(client: redis.Redis, n: int) -> float:
    """Server µs of one sweep of one budget that has nothing due (its usual case)."""
    b = CommandBudget("sweep", BIG)
    for i in range(8):
        pipeline(client, b.reserve(f"s{i}", ESTIMATE, NOW, "a"))
    before = commandstats(client).get("zrangebyscore", 0.0)
    pipeline(client, (b.sweep(NOW)[0] for _ in range(n)))
    return (commandstats(client)["zrangebyscore"] - before) / n


def _runs(figures: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in figures)


def per_budget_call(figures: dict[str, float]) -> float:
    """`ClaimBudget`'s cost of a budget call: a transaction (reserve, settle, and its
    share of the sweep) over its two calls."""
    return (figures["claim_reserve"] + figures["claim_settle"] + figures["claim_sweep"]) / 2


def _per_call(figures: dict[str, float], unit: str, form: str) -> str:
    each = per_budget_call(figures)
    return (
        f"`ClaimBudget`, a budget call with its share of the sweep ((reserve + settle + "
        f"sweep) / 2): {form.format(each)} {unit}, {each / figures['plain']:.2f} x plain."
    )


def render(result: dict[str, Any]) -> str:
    r, m = result["server_us"], result["machine"]
    lines = [
        "# Token budgets on Redis without Lua (bench/budget_commands.py)",
        "",
        "Command: `.venv/bin/python bench/budget_commands.py` (one run: every call measured",
        f"chunk by chunk, alternating; median of {result['args']['repeat']} runs of "
        f"{result['args']['calls']} calls each). Redis server µs per call from INFO",
        "commandstats (each call's top-level commands; EVALSHA's and EXEC's figures include",
        "what they run), 64 budgets with ten open reservations each, one hourly fixed window,",
        f"estimate 700, usage 500, on a server holding {FILLER:,} other keys. The",
        "command-only calls are a prototype (`CommandBudget`, `BucketedBudget`,",
        "`FloorBudget`, `HashBudget`, `ClaimBudget`), not the store.",
        "",
        f"Machine: {m.get('cpu')}, {result['server']}. Load average before and after: "
        f"{load_averages(result['load_average'])} (a shared machine: other engineers' builds "
        "and tests ran meanwhile).",
        "",
    ]
    plain = r["plain"]
    lines += table(
        ["call", "commands", "server µs", "x plain", "each run (µs)"],
        [
            (name, what, f"{r[name]:.2f}", f"{r[name] / plain:.2f}", _runs(result["runs"][name]))
            for name, what in CALLS.items()
        ],
        align="llrrl",
    )
    lines += ["", _per_call(r, "µs", "{:.2f}")]
    ins = result.get("instructions")
    if ins:
        lines += [
            "",
            f"Under callgrind ({result['args']['callgrind_calls']} calls of each, one run):"
            " instructions of the whole redis-server process per call (reading, parsing,",
            "executing, replying; deterministic where the µs above are not):",
            "",
        ]
        rows = [(n, f"{ins[n]:,}", f"{ins[n] / ins['plain']:.2f}") for n in CALLS]
        lines += table(["call", "instructions", "x plain"], rows)
        lines += ["", _per_call(ins, "instructions", "{:,.0f}")]
    lines += [
        "",
        f"A sweep of a budget with nothing due (ZRANGEBYSCORE): {result['sweep_us']:.2f} µs, "
        "once per budget per sweep, not per call.",
        "",
        "µs per call of each command, the last run (a call's own and those EVALSHA or EXEC ran):",
        "",
    ]
    for name, commands in result["per_command"].items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in commands.items()))
    lines.append("")
    if result.get("check"):
        lines += ["Checked on the prototypes against the same server:", ""]
        lines += [f"- {k}: {v}" for k, v in result["check"].items()]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_480)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-check", action="store_true", help="skip the prototype's checks")
    parser.add_argument(
        "--callgrind-calls",
        type=int,
        default=CHUNK * CLAIM_SWEEP_CHUNKS,  # one claim sweep among them
        help="calls of the run under callgrind (0: none)",
    )
    parser.add_argument(
        "--store",
        choices=STORES,
        default="redis",
        help="the server measured (results: budget_commands[_<store>].md)",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        servers = RedisServers(Path(tmp), store=args.store)
        try:
            server = servers()
            client = server.client()
            checked = {} if args.no_check else check(server.address)
            meters = [run_once(client, args.calls, f"r{i}-") for i in range(args.repeat)]
            swept = sweep_cost(client, args.calls)
        finally:
            servers.stop_all()
        instructions = (
            callgrind_run(args.callgrind_calls, Path(tmp), args.store)
            if args.callgrind_calls
            else {}
        )
    runs = [m.per_call() for m in meters]
    result = {
        "machine": machine_info(),
        "server": subprocess.run(
            [server_binary(args.store), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip(),
        "args": vars(args),
        "server_us": {n: round(statistics.median(r[n] for r in runs), 3) for n in CALLS},
        "runs": {n: [round(r[n], 3) for r in runs] for n in CALLS},
        "sweep_us": round(swept, 3),
        "instructions": instructions,
        "per_command": meters[-1].per_command(),
        "check": checked,
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }
    out = Path(__file__).parent / "results"
    name = "budget_commands" + ("" if args.store == "redis" else f"_{args.store}")
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()
