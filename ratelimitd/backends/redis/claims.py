"""Budgets of fixed windows on Redis in plain commands: no script on a call's common paths.

A script costs the server some 30 times a plain decision per call, most of it its own Lua
(docs/budgets.md, "Cost"). A budget whose windows are all fixed and whose rule has no
outbox is kept here instead, in keys of its state key's slot (`config.budget_store`): per
window start a counter (usage + reservations), and one hash of records, whose `~` holds
the budget's `e` and keeps the hash a hash table (`config.budget_store.e_field`).

A record is an estimate (bits 0-31), a time in ms modulo 2^28 (bits 32-59: the reserve's,
then the end's; 74 h wrap, and no record lives that long), and the flags CONTESTED,
REFUSED (a remembered refusal) and ENDED (2^62). Its deadline is its time + the TTL.
Ending a record is `HINCRBY <id> ENDED` (with the end's time, `claim_of`): a second one
would pass 2^63, which Redis refuses as an overflow, leaving the value, so of two callers
ending one reservation exactly one succeeds (the claim), whatever else either has seen.

The calls are the twin's maths (`backends.memory_budget`; a property test holds them
equal): a reserve is `INCRBY` per counter, `HSETNX` the record and `HLEN` in one round
(taken back in a second when over a limit or full); a settle `HGET`, then the claim and
`INCRBY` per counter by usage - estimate in one write, claim first, so a settle cut between
them leaves its estimate charged, never twice; a close alike, the estimate charged or freed.
A process remembers the records it made (`Claims.mine`): its settle claims unread, in one
round, the claim's reply telling whether the record was that one (`_unmade` if not). Rare
paths are small scripts (`claim_scripts`): an unknown id's settle, marking a reused id
contested, raising `e` (once per budget per window) and forgetting at `e`.

The sweep reads a budget whole (one `HGETALL`, or `HSCAN` when it is large: no deadline
index), so it runs at the first call once the budget's next sweep `d` has come, at most
every half TTL (`model`), ends up to SWEEP_BATCH reservations past their deadline by the
same claim, and deletes the tombstones past theirs in one `HDEL`. `d` and a lower bound of
`e` are the process's own, from what it wrote and last read; the sweep itself is claimed
in the store, by one process a half TTL (`_claimed`; docs/budgets.md, "Store").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

from ...config.budget_store import (  # the calls and what came of them
    ADMITTED,
    CONTESTED,
    CONTESTED_BIT,
    COUNT,
    DUPLICATE,
    ENDED_BIT,
    EST,
    FINISHED,
    FULL,
    NEVER,
    ORPHAN,
    PEEK,
    REFUSED,
    REFUSED_BIT,
    RELEASE,
    RESERVE,
    SETTLE,
    SETTLED,
    SWEEP_BATCH,
    UNKNOWN_ID,
    Call,
    Result,
    claim_of,
    counter_key,
    covers,
    e_field,
    e_of,
    is_open,
    record,
    record_time,
    records_key,
    remembered,
    script_state,
    sweep_key,
)
from ..base import BackendError
from .claim_scripts import CONTEST, DROP, FORGET, RAISE, SWEEP, Script
from .claim_scripts import ORPHAN as ORPHAN_SCRIPT
from .resp import ReplyError, command, key_slot

__all__ = ["Claims"]

SCAN_COUNT = 1000
# A budget of fewer records than this (as last counted) is read in one HGETALL, which
# costs the server about two thirds of HSCAN per record; a larger one by HSCAN, so that
# no single command holds the server for long.
WHOLE = 4096
KNOWN = 100_000  # budgets whose `e` and next sweep a process keeps (then it starts over)
MINE = 20_000  # reservations a process remembers making (the oldest forgotten first)


class Instance(Protocol):
    routed: bool
    budget_max_transactions: int

    async def _run(self, cmds: list[tuple[int, bytes]]) -> list[Any]: ...


class Windows:
    """A call's windows at its `now`: per window its counter key, start, end (ms) and the
    ticks until it resets."""

    __slots__ = ("counters", "ends", "limits", "resets", "starts")

    def __init__(self, call: Call) -> None:
        self.counters: list[str] = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.resets: list[int] = []
        self.limits: list[int] = []
        for win in call.windows:
            t = call.now // win.tick
            start = t - t % win.ticks
            self.counters.append(counter_key(call.key, win.name, start))
            self.starts.append(start)
            self.ends.append((start + win.ticks) * win.tick)
            self.resets.append(start + win.ticks - t)
            self.limits.append(win.limit)

    def back(self, amount: int) -> list[bytes]:  # a reserve's increments, taken back
        return [command("INCRBY", c, -amount) for c in self.counters]

    def levels(self, afters: Sequence[int]) -> tuple[tuple[int, int], ...]:
        return tuple(zip(afters, self.resets, strict=True))

    def of(self, call: Call, at: int) -> dict[int, str]:
        """Per window, the counter a record made at `at` holds in, unless it has ended."""
        out = {}
        for k, win in enumerate(call.windows):
            t = at // win.tick
            start = t - t % win.ticks
            if start >= self.starts[k]:
                out[k] = counter_key(call.key, win.name, start)
        return out


class _At:
    """One call's budget: its slot, records hash, windows and what the process knows of it
    (`Claims.known`)."""

    __slots__ = ("known", "slot", "table", "windows")

    def __init__(self, call: Call, known: list[int], routed: bool) -> None:
        self.slot = key_slot(call.key.encode()) if routed else 0
        self.table = records_key(call.key)
        self.windows = Windows(call)
        self.known = known


class Claims:
    """The budgets of one Redis deployment kept in plain commands (module docstring)."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        # Per budget (its state key): [e as last known, the next sweep, the first deadline
        # set since the last read, its records as last counted]. Unknown: [0, 0, NEVER,
        # WHOLE], so that its first call sweeps it (and learns them).
        self.known: dict[str, list[int]] = {}
        # Per budget with a backlog: what its last read found due and not yet ended, and
        # the first deadline after them (`_sweep`).
        self.backlog: dict[str, tuple[list[tuple[int, str, int]], int]] = {}
        # Per (budget, id) this process reserved: the record it made. Its settle, until the
        # record's deadline, claims without reading it first (`_settle`).
        self.mine: dict[tuple[str, str], int] = {}
        self.owner = os.urandom(6).hex()  # its sweeps' claims (`_claimed`)

    def _state(self, key: str) -> list[int]:
        st = self.known.get(key)
        if st is None:
            if len(self.known) >= KNOWN:
                self.known.clear()
                self.backlog.clear()
            st = self.known[key] = [0, 0, NEVER, WHOLE]
        return st

    async def run(self, calls: Sequence[Call]) -> list[Result]:
        """Apply the calls in order; one Result each."""
        out: list[Result] = []
        last: tuple[Call, Result] | None = None
        for call in calls:
            if last is not None and _closes_what_it_settled(last, call, self._state(call.key)):
                result = Result(FINISHED, last[1].levels)
            else:
                result = await self._call(call)
            out.append(result)
            last = (call, result)
        return out

    async def _round(self, slot: int, cmds: list[bytes]) -> list[Any]:
        if not cmds:
            return []
        return await self.instance._run([(slot, c) for c in cmds])

    async def _script(
        self, slot: int, script: Script, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        (reply,) = await self._round(slot, [script.call(keys, args)])
        if isinstance(reply, ReplyError) and str(reply).startswith("NOSCRIPT"):
            (reply,) = await self._round(slot, [script.call(keys, args, load=True)])
        if isinstance(reply, ReplyError):
            raise BackendError(str(reply))
        return reply

    async def _call(self, call: Call) -> Result:
        b = _At(call, self._state(call.key), self.instance.routed)
        st, slot, table = b.known, b.slot, b.table
        result = Result(0, ())
        now = call.now
        if 0 < st[0] <= now or st[1] <= now:
            if call.kind == PEEK:  # what a sweep would change, on a copy
                return (await self._twin([call])).run_now([call])[0]
            if 0 < st[0] <= now:
                e = await self._script(slot, FORGET, [table], [now])
                st[0] = e
                if not e:
                    st[1] = min(st[1], 0)  # swept (empty) below
            if st[1] <= now:
                st[1] = NEVER  # one sweep at a time: the process's other calls go on meanwhile
                try:
                    swept = await self._claimed(call, b) and await self._sweep(call, b, result)
                except BaseException:
                    st[1] = now  # not swept: the next call tries again
                    raise
                if swept:
                    await self._raise(call, b)
        kind = call.kind
        if kind == RESERVE:
            written = await self._reserve(call, b, result)
        elif kind == SETTLE:
            written = await self._settle(call, b, result)
        elif kind == RELEASE:
            written = await self._release(call, b, result)
        elif kind == COUNT:
            written = await self._count(call, b, result)
        elif kind == PEEK:
            written = await self._peek(call, b, result)
        else:
            raise ValueError(f"unknown budget call kind {kind}")
        if written:
            await self._raise(call, b)
        return result

    async def _claimed(self, call: Call, b: _At) -> bool:
        """Whether this process sweeps the budget now: it is working through a backlog of
        it, or it claims the sweep, which one process holds for half a TTL while the others
        wait for it (their records are read by that sweep or by theirs after)."""
        if call.key in self.backlog:
            return True
        now, ttl = call.now, call.ttl
        args = [now, now + ttl // 2, self.owner, max(ttl, 1000)]
        held = int(await self._script(b.slot, SWEEP, [sweep_key(call.key)], args))
        if held:
            b.known[1] = held
        return not held

    async def _raise(self, call: Call, b: _At) -> None:
        """`e` raised to cover a write at `call.now` (module docstring)."""
        e = covers(call)
        if e > b.known[0]:
            kept = await self._script(b.slot, RAISE, [b.table], [e, e_field(e), call.now])
            b.known[0] = max(e, kept)

    async def _levels(self, slot: int, windows: Windows) -> tuple[tuple[int, int], ...]:
        replies = await self._round(slot, [command("GET", c) for c in windows.counters])
        return windows.levels([_int(r) for r in replies])

    async def _reserve(self, call: Call, b: _At, out: Result) -> bool:
        st, slot, table, windows = b.known, b.slot, b.table, b.windows
        amount, now, txn = call.amount, call.now, call.txn
        value = record(amount, now)
        cmds = [command("INCRBY", c, amount) for c in windows.counters]
        cmds += (command("HSETNX", table, txn, value), command("HLEN", table))
        replies = await self._round(slot, cmds)
        n = len(windows.counters)
        afters = [_int(r) for r in replies[:n]]
        made, held = _int(replies[n]), _int(replies[n + 1])
        st[3] = held
        out.levels = windows.levels(afters)
        fits = all(a <= lim for a, lim in zip(afters, windows.limits, strict=True))
        follow = [
            command("PEXPIRE", c, end + 1000 - now)
            for c, end, a in zip(windows.counters, windows.ends, afters, strict=True)
            if a == amount  # this reserve made the counter (or found it at 0)
        ]
        if not made:  # the id is there: read it
            back = windows.back(amount)
            found = await self._round(slot, [*back, command("HGET", table, txn), *follow])
            return await self._taken(call, b, out, found[n], fits)
        if held >= 2 and held - 2 >= self.instance.budget_max_transactions:
            out.outcome = FULL
            await self._round(slot, [*windows.back(amount), command("HDEL", table, txn), *follow])
            return False
        out.outcome = ADMITTED if fits else REFUSED
        if held == 1 and (fits or call.force or call.remember):
            # this reserve made the hash: a table from now on, forgotten at `e`
            e = max(st[0], covers(call))
            follow += (command("HSET", table, "~", e_field(e)), command("PEXPIRE", table, e - now))
            st[0] = e
        if fits or call.force:
            await self._round(slot, follow)
            _scheduled(st, now + call.ttl)
            mine = self.mine
            if len(mine) >= MINE:
                del mine[next(iter(mine))]
            mine[call.key, txn] = value
            return True
        if call.remember:
            follow.append(command("HSET", table, txn, record(0, now, REFUSED_BIT)))
            await self._round(slot, [*windows.back(amount), *follow])
            _scheduled(st, now + call.ttl)
            return True
        await self._round(slot, [*windows.back(amount), command("HDEL", table, txn), *follow])
        return False

    async def _taken(self, call: Call, b: _At, out: Result, found: Any, fits: bool) -> bool:
        """A reserve whose id was there: a duplicate, or a remembered refusal decided again."""
        st, slot, table, windows = b.known, b.slot, b.table, b.windows
        if found is None:  # ended and deleted meanwhile: one more try
            return await self._reserve(call, b, out)
        value = int(found)
        if remembered(value):
            amount, now = call.amount, call.now
            if fits or call.force:  # decided afresh: as the first round found the room
                cmds = [command("INCRBY", c, amount) for c in windows.counters]
                cmds.append(command("HSET", table, call.txn, record(amount, now)))
                await self._round(slot, cmds)
                out.outcome = ADMITTED if fits else REFUSED
                _scheduled(st, now + call.ttl)
                return True
            out.outcome = REFUSED
            if call.remember:
                refusal = record(0, now, REFUSED_BIT)
                await self._round(slot, [command("HSET", table, call.txn, refusal)])
                _scheduled(st, now + call.ttl)
                return True
            return False
        out.outcome = DUPLICATE
        if is_open(value) and not value & CONTESTED_BIT:
            marked = await self._script(slot, CONTEST, [table], [call.txn, value, CONTESTED_BIT])
            return bool(marked)
        return False

    async def _settle(self, call: Call, b: _At, out: Result) -> bool:
        made = self.mine.pop((call.key, call.txn), None)
        if made is not None and record_time(made, call.now) + call.ttl > call.now:
            # Made here and not yet due, so still held (ended or not): claimed unread, the
            # claim's reply telling what it found (`_end`).
            return await self._end(call, b, out, made, call.amount, made=True)
        slot, table = b.slot, b.table
        (found,) = await self._round(slot, [command("HGET", table, call.txn)])
        if found is None:
            return await self._orphan(call, b, out)
        return await self._end(call, b, out, int(found), call.amount)

    async def _release(self, call: Call, b: _At, out: Result) -> bool:
        slot, table, windows = b.slot, b.table, b.windows
        (found,) = await self._round(slot, [command("HGET", table, call.txn)])
        if found is None:
            out.outcome = UNKNOWN_ID
        else:
            value = int(found)
            if not is_open(value):
                out.outcome = FINISHED
            elif value & CONTESTED_BIT:
                out.outcome = CONTESTED
            else:
                est = value % EST
                charge = est if call.charge and not call.unserved else 0
                return await self._end(call, b, out, value, charge)
        out.levels = await self._levels(slot, windows)
        return False

    async def _end(
        self, call: Call, b: _At, out: Result, value: int, charge: int, made: bool = False
    ) -> bool:
        """End an open record by the claim, charging `charge` for its estimate. `made`: the
        value is the one this process wrote, not read: the claim's reply says what it was."""
        st, slot, table, windows = b.known, b.slot, b.table, b.windows
        if not is_open(value):
            out.outcome = FINISHED
            out.levels = await self._levels(slot, windows)
            return False
        now = call.now
        est = value % EST
        mine = windows.of(call, record_time(value, now))
        delta = charge - est
        claim, after = claim_of(value, now)
        cmds = [command("HINCRBY", table, call.txn, claim)]
        at = []  # per window, the reply that is its level after
        for k, current in enumerate(windows.counters):
            held_in = mine.get(k)
            if held_in is not None and held_in != current:  # a later window's (a clock ahead)
                cmds.append(command("INCRBY", held_in, delta))
            at.append(len(cmds))
            if held_in == current:
                cmds.append(command("INCRBY", current, delta))
            else:
                cmds.append(command("GET", current))
        replies = await self._round(slot, cmds)
        afters = [_int(replies[i]) for i in at]
        if isinstance(replies[0], ReplyError):  # another end came first: ours back
            if delta:
                await self._round(slot, [command("INCRBY", c, -delta) for c in mine.values()])
                afters = [a - delta if k in mine else a for k, a in enumerate(afters)]
            out.outcome = FINISHED
            out.levels = windows.levels(afters)
            return False
        if made and (found := int(replies[0]) - claim) & ~CONTESTED_BIT != value:
            back = [command("INCRBY", c, -delta) for c in mine.values() if delta]
            return await self._unmade(call, b, out, found, claim, charge, back)
        if after:
            await self._round(slot, [command("HINCRBY", table, call.txn, after)])
        out.outcome = SETTLED
        out.estimate = est
        out.charged = charge
        out.levels = windows.levels(afters)
        _scheduled(st, now + call.ttl)
        return True

    async def _unmade(
        self,
        call: Call,
        b: _At,
        out: Result,
        found: int,
        claim: int,
        charge: int,
        back: list[bytes],
    ) -> bool:
        """A claim by the record this process made found `found` instead (its reserve's
        record had gone, by a reset, or was made again): the claim and its charge taken
        back, the settle goes on as if it had read `found` (0: nothing)."""
        slot, table, txn = b.slot, b.table, call.txn
        if found == 0:  # the claim made the field: it goes again
            await self._round(slot, back)
            await self._script(slot, DROP, [table], [txn, claim])
            return await self._orphan(call, b, out)
        await self._round(slot, [*back, command("HINCRBY", table, txn, -claim)])
        return await self._end(call, b, out, found, charge)

    async def _orphan(self, call: Call, b: _At, out: Result) -> bool:
        st, slot, table, windows = b.known, b.slot, b.table, b.windows
        now = call.now
        e = max(st[0], covers(call))
        args: list[Any] = [
            call.txn,
            call.amount,
            record(0, now, ENDED_BIT),
            self.instance.budget_max_transactions,
            e - now,
            e_field(e),
        ]
        args += [end + 1000 - now for end in windows.ends]
        reply = await self._script(slot, ORPHAN_SCRIPT, [table, *windows.counters], args)
        if reply[0] == -1:  # a reserve of the id came first: this settles it
            return await self._end(call, b, out, int(reply[1]), call.amount)
        out.outcome = ORPHAN
        out.charged = call.amount
        out.levels = windows.levels(_ints(reply[1:]))
        if reply[0]:
            _scheduled(st, now + call.ttl)
        return True

    async def _count(self, call: Call, b: _At, out: Result) -> bool:
        slot, windows = b.slot, b.windows
        amount = call.amount
        if amount:
            cmds = [command("INCRBY", c, amount) for c in windows.counters]
            afters = _ints(await self._round(slot, cmds))
            follow = [
                command("PEXPIRE", c, end + 1000 - call.now)
                for c, end, a in zip(windows.counters, windows.ends, afters, strict=True)
                if a == amount
            ]
            await self._round(slot, follow)
        else:
            afters = _ints(await self._round(slot, [command("GET", c) for c in windows.counters]))
        out.levels = windows.levels(afters)
        fits = all(a <= lim for a, lim in zip(afters, windows.limits, strict=True))
        out.outcome = ADMITTED if fits else REFUSED
        return amount > 0

    async def _peek(self, call: Call, b: _At, out: Result) -> bool:
        slot, table, windows = b.slot, b.table, b.windows
        cmds = [command("GET", c) for c in windows.counters]
        cmds += (command("HGET", table, call.txn), command("HLEN", table))
        replies = await self._round(slot, cmds)
        n = len(windows.counters)
        afters = [_int(r) + call.amount for r in replies[:n]]
        found, held = replies[n], _int(replies[n + 1])
        out.levels = windows.levels(afters)
        value = None if found is None else int(found)
        if value is None and held - 1 >= self.instance.budget_max_transactions:
            out.outcome = FULL
        elif value is not None and not remembered(value):
            out.outcome = DUPLICATE
        else:
            fits = all(a <= lim for a, lim in zip(afters, windows.limits, strict=True))
            out.outcome = ADMITTED if fits else REFUSED
        return False

    async def _scan(self, slot: int, table: str, size: int) -> tuple[dict[str, int], int]:
        """The budget's records and its `e`, read whole: HGETALL when it held fewer than
        WHOLE records as last counted (`size`), else HSCAN."""
        records: dict[str, int] = {}
        e = 0
        cursor = b"0"
        while True:
            if size < WHOLE:
                (flat,) = await self._round(slot, [command("HGETALL", table)])
                cursor = b"0"
            else:
                (reply,) = await self._round(
                    slot, [command("HSCAN", table, cursor, "COUNT", SCAN_COUNT)]
                )
                if reply.__class__ is not list:
                    raise BackendError(str(reply))
                cursor, flat = reply
            if flat.__class__ is not list:
                raise BackendError(str(flat))
            for i in range(0, len(flat), 2):
                name = flat[i]
                if name == b"~":
                    e = e_of(flat[i + 1])
                else:
                    records[name.decode()] = int(flat[i + 1])
            if cursor == b"0":
                return records, e

    async def _sweep(self, call: Call, b: _At, out: Result) -> bool:
        """The sweep (module docstring); whether it wrote anything. A backlog (more due
        than one sweep ends) is kept from its read and worked through on the next calls,
        not read again each time."""
        st, slot, table, windows = b.known, b.slot, b.table, b.windows
        now, ttl = call.now, call.ttl
        kept = self.backlog.pop(call.key, None)
        if kept is not None:
            due, later = kept
        else:
            st[2] = NEVER  # deadlines set from now on (`_scheduled`)
            records, e = await self._scan(slot, table, st[3])
            if 0 < e <= now:  # a budget this process had not known, to be forgotten
                st[0] = await self._script(slot, FORGET, [table], [now])
                if not st[0]:
                    st[1] = NEVER
                    return False
                records, e = await self._scan(slot, table, st[3])
            st[0] = max(st[0], e)
            st[3] = len(records)
            due, later = [], NEVER
            for t, v in records.items():
                deadline = record_time(v, now) + ttl
                if deadline <= now:
                    due.append((deadline, t, v))
                elif deadline < later:
                    later = deadline
            due.sort()
        batch, rest = due[:SWEEP_BATCH], due[SWEEP_BATCH:]
        cmds: list[bytes] = []
        gone: list[str] = []  # tombstones past their deadline, deleted in one HDEL
        # per reservation ended: (estimate, charge, its counters, its claim's index, its id,
        # what to add once claimed: `config.budget_store.claim_of`)
        ends: list[tuple[int, int, list[str], int, str, int]] = []
        for _, t, v in batch:
            if is_open(v):  # ended by the claim, by the policy; a tombstone for a TTL
                est = v % EST
                charge = est if call.charge else 0
                mine = list(windows.of(call, record_time(v, now)).values()) if charge != est else []
                claim, after = claim_of(v, now)
                ends.append((est, charge, mine, len(cmds), t, after))
                cmds.append(command("HINCRBY", table, t, claim))
                cmds += [command("INCRBY", c, charge - est) for c in mine]
                later = min(later, now + ttl)
            else:
                gone.append(t)
        if gone:
            cmds.append(command("HDEL", table, *gone))
        replies = await self._round(slot, cmds)
        back: list[bytes] = []
        for est, charge, mine, at, t, after in ends:
            if isinstance(replies[at], ReplyError):  # another end came first: ours back
                back += [command("INCRBY", c, est - charge) for c in mine]
                continue
            if after:
                back.append(command("HINCRBY", table, t, after))
            out.expired += 1
            out.expired_estimate += est
            out.expired_charged += charge
        await self._round(slot, back)
        if len(batch) == SWEEP_BATCH:
            if rest:
                self.backlog[call.key] = (rest, later)
            st[1] = now  # more may be due: the next call looks again
        else:
            later = min(later, st[2])
            st[1] = NEVER if later == NEVER else max(later, now + ttl // 2)
        return bool(batch)

    async def dry_run(self, calls: Sequence[Call]) -> list[Result]:
        """What `run(calls)` would answer now, writing nothing: the budgets read whole and
        the calls applied to copies with the twin's maths (each Result with `held`)."""
        return (await self._twin(calls)).dry_run(calls)

    async def _twin(self, calls: Sequence[Call]) -> Any:
        """The budgets of `calls` read now and held, as the script would keep them, by a
        scratch twin (`config.budget_store.script_state`)."""
        from ..memory_budget import MemoryBudgets

        scratch = MemoryBudgets(self.instance.budget_max_transactions, 2**62)
        for key in dict.fromkeys(call.key for call in calls):
            call = next(c for c in calls if c.key == key)
            slot = key_slot(key.encode()) if self.instance.routed else 0
            size = self.known.get(key, [0, 0, NEVER, WHOLE])[3]
            records, e = await self._scan(slot, records_key(key), size)
            windows = Windows(call)
            counters = _ints(await self._round(slot, [command("GET", c) for c in windows.counters]))
            e0, d = self.known.get(key, [0, 0])[:2]
            state = script_state(call, records, max(e, e0), d, counters, windows.starts)
            scratch.load(key, *state)
        return scratch


def _closes_what_it_settled(last: tuple[Call, Result], call: Call, st: list[int]) -> bool:
    """A stream end's close right after its settle (one request): FINISHED, known."""
    before, result = last
    return (
        call.kind == RELEASE
        and before.kind == SETTLE
        and before.key == call.key
        and before.txn == call.txn
        and before.now == call.now
        and result.outcome in (SETTLED, FINISHED)
        and st[1] > call.now
        and not 0 < st[0] <= call.now
    )


def _scheduled(st: list[int], deadline: int) -> None:
    """A record of `deadline` written: the next sweep is not after it."""
    if deadline < st[1]:
        st[1] = deadline
    if deadline < st[2]:
        st[2] = deadline


def _int(reply: Any) -> int:
    if reply is None:
        return 0
    if isinstance(reply, ReplyError):
        raise BackendError(str(reply))
    return int(reply)


def _ints(replies: Sequence[Any]) -> list[int]:
    return [_int(r) for r in replies]
