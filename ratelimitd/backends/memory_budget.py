# cython: annotation_typing=False, cdivision=False
"""Budgets in process memory: the twin of the Redis script (`backends.redis.budget`).

Every call is applied whole before the next (the event loop runs one at a time), which is
what makes it atomic; the Redis script gets the same from Redis' single thread. The maths
is written once more here, independently of the Lua, on purpose: the property test that
holds the two equal then checks both.

One call on one budget (see `model` for the state):

1. A budget whose `e` has passed is forgotten (as if its keys had expired).
2. Each window is rolled to `now`: a later window starts empty (a sliding window keeps the
   one before as `p`, `q`); a window written by a clock ahead of ours is read as if we were
   at its start (the most conservative reading, as the sliding window does).
3. Once the budget's next sweep `d` has come, up to SWEEP_BATCH transactions whose
   deadline has passed are applied, oldest first: an open reservation ends by the call's
   policy (its estimate charged, or released) into the window it was made in and becomes
   an `x` tombstone for one more TTL; a tombstone whose time is up is dropped. The next
   sweep is then at the first deadline left, but not before half a TTL from now.
4. The operation (`model.RESERVE` ...), then `e` is raised to cover what was written.

Transactions are bounded (`model.FULL`): a budget holds at most `max_budget_txns` of them,
the process at most `max_txns` over all its budgets (MEMORY_MAX_BUDGET_TRANSACTIONS; Redis
holds its budgets itself, so only the first applies there). Past either, a reserve (or
peek) of a new id is refused and a settle of an unknown id charges its usage without
remembering it.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heappop, heappush
from typing import Any

from ..config.budget_store import (
    ADMITTED,
    CONTESTED,
    COUNT,
    DUPLICATE,
    FINISHED,
    FULL,
    MAX_BUDGET_TXNS,
    NEVER,
    ORPHAN,
    PEEK,
    REFUSED,
    RELEASE,
    RESERVE,
    SETTLE,
    SETTLED,
    SWEEP_BATCH,
    UNKNOWN_ID,
    USED_MAX,
    Call,
    Result,
    Window,
)
from ..config.windows import FIXED_WINDOW
from .budget_txns import Txn, pop, push, read, spell

__all__ = ["MAX_TXNS", "MemoryBudgets", "level", "reset"]

# MEMORY_MAX_BUDGET_TRANSACTIONS' default: ~260 MB of transactions at ~520 B each.
MAX_TXNS = 500_000


class _Limit:
    """The constants of one limit (a `Window`'s), read once and held in C fields: the maths
    read them some twenty times a call."""

    __slots__ = ("algorithm", "limit", "name", "tick", "ticks")

    def __init__(self, win: Window) -> None:
        self.name = win.name
        self.algorithm = win.algorithm
        self.ticks = win.ticks
        self.tick = win.tick
        self.limit = win.limit


class _State:
    """One limit's state in a budget (model docstring): the window's start `w`, its usage
    `u` and reservations `r`, a sliding window's `p` and `q` (the same two of the window
    before); C integers when compiled, so the maths allocate no Python integer for them."""

    __slots__ = ("p", "q", "r", "u", "w")

    def __init__(self) -> None:
        self.w = self.u = self.r = self.p = self.q = 0

    def copy(self) -> _State:
        other = _State()
        other.w, other.u, other.r, other.p, other.q = self.w, self.u, self.r, self.p, self.q
        return other

    def fields(self) -> list[int]:
        """[w, u, r, p, q] (`MemoryBudgets.state`)."""
        return [self.w, self.u, self.r, self.p, self.q]


class _Budget:
    """The two keys of one budget: windows and transactions, and their deadlines."""

    __slots__ = ("d", "due", "e", "queued", "spelt", "starts", "txns", "windows")

    def __init__(self) -> None:
        self.e = 0
        self.queued = 0  # the `e` of its entry in the forget heap; 0: none there
        # The next sweep (ms; `model` step 3): 0, a budget not yet swept, sweeps at once.
        self.d = 0
        self.windows: dict[str, _State] = {}
        self.txns: dict[str, Txn] = {}
        # Heap (`budget_txns.push`) of the records in `txns`, and of ones replaced there.
        self.due: list[Txn] = []
        # The last reservation's starts, and as its record spells them (`_starts`).
        self.starts: tuple[Any, ...] = ()
        self.spelt = ""

    def copy(self) -> _Budget:
        other = _Budget()
        other.e = self.e
        other.queued = self.queued
        other.d = self.d
        other.windows = {name: s.copy() for name, s in self.windows.items()}
        # Records are changed in place: the copy's heap holds the copy's records.
        txns = {t: x.copy() for t, x in self.txns.items()}
        other.txns = txns
        other.due = [txns[x.id] if self.txns.get(x.id) is x else x for x in self.due]
        other.starts = self.starts
        other.spelt = self.spelt
        return other


def level(win: _Limit, s: _State, t: int) -> int:
    """Usage + reservations of a rolled window at tick `t` (a sliding window weighs the one
    before by the part of it still inside the rolling window)."""
    if win.algorithm == FIXED_WINDOW:
        return s.u + s.r
    left = s.w + win.ticks - t
    pe = s.p + s.q
    if pe > win.limit:
        pe = win.limit
    return -(-pe * left // win.ticks) + s.u + s.r


def reset(win: _Limit, s: _State, t: int, asked: int, after: int) -> int:
    """Ticks until the window has room for `asked` if every reservation is charged in full
    (OK: until it holds nothing any more), the sliding window's formulas with usage +
    reservations for its counts."""
    end = s.w + win.ticks - t
    if win.algorithm == FIXED_WINDOW:
        return end
    c = s.u + s.r
    if after <= win.limit:
        return end + win.ticks if c + asked > 0 else end
    pe = s.p + s.q
    if pe > win.limit:
        pe = win.limit
    room = win.limit - c - asked
    if room >= 0:
        return end - room * win.ticks // pe
    if asked > win.limit:
        return end + win.ticks
    ce = c if c < win.limit else win.limit
    return end + win.ticks - (win.limit - asked) * win.ticks // ce if ce else end


def _roll(win: _Limit, s: _State, now: int) -> int:
    """Roll `s` to the window of `now` (ms); the tick the window is read at."""
    t = now // win.tick
    start = t - t % win.ticks
    w = s.w
    if w < start:
        if win.algorithm != FIXED_WINDOW and w == start - win.ticks:
            s.p = s.u
            s.q = s.r
        else:
            s.p = s.q = 0
        s.u = s.r = 0
        s.w = start
    elif w > start:  # written by a clock ahead of ours
        t = w
    return t


def _end(
    b: _Budget, states: list[_State], txn: Txn, charge: int, windows: tuple[_Limit, ...]
) -> None:
    """Free `txn`'s estimate from the windows it was made in and charge `charge` there (a
    window that has rolled out of view takes neither)."""
    est = txn.estimate
    starts = b.starts if txn.starts is b.spelt else read(txn.starts)
    for k in range(len(windows)):
        win = windows[k]
        s = states[k]
        name = win.name
        for i in range(0, len(starts), 2):
            if starts[i] == name:
                start = starts[i + 1]
                break
        else:
            continue
        if start == s.w:
            s.r = max(0, s.r - est)
            s.u = min(s.u + charge, USED_MAX)
        elif win.algorithm != FIXED_WINDOW and start == s.w - win.ticks:
            s.q = max(0, s.q - est)
            s.p = min(s.p + charge, USED_MAX)


class MemoryBudgets:
    """Budgets of one process (module docstring); `run_now` applies calls in order."""

    def __init__(self, max_budget_txns: int = MAX_BUDGET_TXNS, max_txns: int = MAX_TXNS) -> None:
        self._budgets: dict[str, _Budget] = {}
        self._forget: list[tuple[int, str]] = []  # heap of (e, key): memory stays bounded
        self._next_forget = 0
        self.max_budget_txns = max_budget_txns
        self.max_txns = max_txns
        self.txns = 0  # transactions held over every budget
        # The last call's windows and their constants (`_Limit`): calls come in runs on
        # one rule.
        self._windows: tuple[Window, ...] | None = None
        self._limits: tuple[_Limit, ...] = ()

    def __len__(self) -> int:
        return len(self._budgets)

    async def run(self, calls: Sequence[Call]) -> list[Result]:
        """`run_now` (the Redis store's signature)."""
        return self.run_now(calls)

    def run_now(self, calls: Sequence[Call]) -> list[Result]:
        """Apply each call in turn; one Result each."""
        return [self._run(call) for call in calls]

    def apply(self, call: Call) -> Result:
        """Apply one call."""
        return self._run(call)

    def dry_run(self, calls: Sequence[Call]) -> list[Result]:
        """What `run_now(calls)` would answer, writing nothing: the calls applied in order to
        copies of the budgets they touch, each Result with `held` (`/explain`)."""
        scratch = MemoryBudgets(self.max_budget_txns, self.max_txns)
        scratch.txns = self.txns  # the copies' transactions are counted in it already
        for call in calls:
            b = self._budgets.get(call.key)
            if b is not None and call.key not in scratch._budgets:
                scratch._budgets[call.key] = b.copy()
        return [scratch._run(call, held=True) for call in calls]

    def load(self, key: str, fields: dict[bytes, bytes], due: Sequence[bytes]) -> None:
        """Hold a budget as the Redis script stores it (its hash's fields and its deadline
        set as ZRANGE WITHSCORES lists it): a dry run of Redis' state with these maths."""
        b = _Budget()
        deadlines = {due[i].decode(): int(float(due[i + 1])) for i in range(0, len(due), 2)}
        for raw, value in fields.items():
            name = raw.decode()
            if name == "e":
                b.e = int(value)
            elif name == "d":
                b.d = int(value)
            elif name.startswith("t:"):
                txn = name[2:]
                record = value.decode().split()
                estimate = int(record[1]) if len(record) > 1 else 0
                starts = " ".join(record[2:])
                x = b.txns[txn] = Txn(txn, record[0], estimate, starts, deadlines.get(txn, 0))
                push(b.due, x)
                self.txns += 1
            else:
                window, _, part = name.rpartition(".")
                s = b.windows.get(window)
                if s is None:
                    s = b.windows[window] = _State()
                setattr(s, part, int(value))
        self._budgets[key] = b

    def delete(self, key: str, now: int) -> bool:
        """Forget a budget (an admin's reset); whether it held anything at `now` (ms)."""
        b = self._budgets.pop(key, None)
        if b is not None:
            self.txns -= len(b.txns)
        return b is not None and b.e > now

    def state(self, key: str, now: int) -> dict[str, Any] | None:
        """The budget's state as the store holds it at `now` (None when forgotten): for
        tests and the admin view."""
        b = self._budgets.get(key)
        if b is None or b.e <= now:
            return None
        return {
            "e": b.e,
            "windows": {name: s.fields() for name, s in b.windows.items()},
            "txns": {
                t: (x.state, x.estimate, _pairs(read(x.starts)), x.deadline)
                for t, x in b.txns.items()
            },
        }

    def _run(self, call: Call, held: bool = False) -> Result:
        return self.decide(
            call.kind,
            call.key,
            call.windows,
            call.now,
            call.txn,
            call.amount,
            call.ttl,
            call.charge,
            call.force,
            call.remember,
            call.unserved,
            held,
        )

    def decide(
        self,
        kind: int,
        key: str,
        windows: tuple[Window, ...],
        now: int,
        txn_id: str,
        amount: int,
        ttl: int,
        charge: bool,
        force: bool,
        remember: bool,
        unserved: bool,
        held: bool = False,
    ) -> Result:
        """Apply one call given by its fields (a `Call`'s, in order; `held` as in
        `dry_run`): a synchronous caller need not build the Call (`budget.calls.budget_now`)."""
        if now >= self._next_forget:
            self._drop_forgotten(now)
        peek = kind == PEEK
        b = self._budgets.get(key)
        if b is not None and b.e and b.e <= now:
            if not peek:
                del self._budgets[key]
                self.txns -= len(b.txns)
            b = None
        stored = b is not None
        if b is None:
            b = _Budget()
        elif peek:
            b = b.copy()
        if windows is not self._windows:  # the rule's own tuple: read once per rule in turn
            self._limits = tuple([_Limit(win) for win in windows])
            self._windows = windows
        limits = self._limits
        states = []
        ts = []
        bw = b.windows
        for k in range(len(limits)):
            lim = limits[k]
            s = bw.get(lim.name)
            if s is None:
                s = bw[lim.name] = _State()
            ts.append(_roll(lim, s, now))
            states.append(s)
        txns = b.txns
        held_before = len(txns)
        written = False
        result = Result(0, ())
        if b.d <= now:
            written = _sweep(b, now, ttl, charge, limits, states, result)
        if held:
            result.held = tuple([(s.u, s.r) for s in states])
        txn = record = txns.get(txn_id) if kind != COUNT else None
        # A new id's record would pass the budget's bound or the process's.
        full = txn is None and (
            len(txns) >= self.max_budget_txns
            or self.txns + len(txns) - held_before >= self.max_txns
        )
        if kind in (RESERVE, PEEK):
            asked = amount
            if txn is not None and txn.state == "r":
                txn = None  # a remembered refusal, asked again: decided afresh
            result.levels = levels = _levels(limits, states, ts, asked)
            if full:
                result.outcome = FULL
            elif txn is not None:
                result.outcome = DUPLICATE
                if txn.state == "o" and not peek:
                    txn.state = "c"
                    written = True
            else:
                fits = True
                for k in range(len(limits)):
                    lim = limits[k]
                    if levels[k][0] > lim.limit:
                        fits = False
                result.outcome = ADMITTED if fits else REFUSED
                if (fits or force) and not peek:
                    for k in range(len(limits)):
                        s = states[k]
                        s.r += asked
                    _schedule(b, record, txn_id, "o", asked, _starts(b, limits, states), now + ttl)
                    written = True
                elif remember and not peek:
                    _schedule(b, record, txn_id, "r", 0, "", now + ttl)
                    written = True
        elif kind == COUNT:
            asked = amount
            result.levels = levels = _levels(limits, states, ts, asked)
            fits = True
            for k in range(len(limits)):
                after = levels[k][0]
                lim = limits[k]
                s = states[k]
                if after > lim.limit:
                    fits = False
                if asked and (lim.algorithm == FIXED_WINDOW or after <= lim.limit):
                    s.u = min(s.u + asked, USED_MAX)
                    written = True
            result.outcome = ADMITTED if fits else REFUSED
        else:
            if kind == SETTLE:
                if txn is None:
                    result.outcome = ORPHAN
                    for k in range(len(states)):
                        s = states[k]
                        s.u = min(s.u + amount, USED_MAX)
                    if not full:  # remembered, so that a repeated settle charges nothing
                        _schedule(b, None, txn_id, "s", 0, "", now + ttl)
                    result.charged = amount
                    written = True
                elif txn.state == "o" or txn.state == "c":
                    _settle(b, txn_id, now + ttl, limits, states, txn, amount, result)
                    written = True
                else:
                    result.outcome = FINISHED
            elif kind == RELEASE:
                if txn is None:
                    result.outcome = UNKNOWN_ID
                elif txn.state == "c":
                    result.outcome = CONTESTED
                elif txn.state == "o":
                    ends = txn.estimate if charge and not unserved else 0
                    _settle(b, txn_id, now + ttl, limits, states, txn, ends, result)
                    written = True
                else:
                    result.outcome = FINISHED
            else:
                raise ValueError(f"unknown budget call kind {kind}")
            result.levels = _levels(limits, states, ts, 0)
        if written and not peek:
            # Every deadline a call sets is before the end of its window + the TTL.
            e = b.e
            for k in range(len(limits)):
                lim = limits[k]
                s = states[k]
                span = lim.ticks if lim.algorithm == FIXED_WINDOW else 2 * lim.ticks
                end = (s.w + span) * lim.tick + ttl
                if end > e:
                    e = end
            if e != b.e:
                b.e = e
                if not b.queued:  # else its entry, come up, is queued again at `e`
                    b.queued = e
                    heappush(self._forget, (e, key))
            if not stored:
                self._budgets[key] = b
        if not peek and (stored or written):
            self.txns += len(txns) - held_before
        return result

    def _drop_forgotten(self, now: int) -> None:
        """Drop budgets whose `e` has passed (one heap entry each, at its `e` when queued)."""
        self._next_forget = now + 1000
        heap = self._forget
        while heap and heap[0][0] <= now:
            e, key = heappop(heap)
            b = self._budgets.get(key)
            if b is None or b.queued != e:
                continue  # its budget was forgotten (or deleted) since
            if b.e > now:
                b.queued = b.e
                heappush(heap, (b.e, key))
            else:
                del self._budgets[key]
                self.txns -= len(b.txns)


def _settle(
    b: _Budget,
    t: str,
    deadline: int,
    limits: tuple[_Limit, ...],
    states: list[_State],
    txn: Txn,
    charge: int,
    out: Result,
) -> None:
    _end(b, states, txn, charge, limits)
    out.outcome = SETTLED
    out.estimate = txn.estimate
    out.charged = charge
    _schedule(b, txn, t, "s", 0, "", deadline)


def _schedule(
    b: _Budget,
    x: Txn | None,
    t: str,
    state: str,
    estimate: int,
    starts: str,
    deadline: int,
) -> None:
    """Hold transaction `t` as (state, estimate, starts) until `deadline`: its record `x`
    changed in place, or a new one queued when it has none or its heap entry would come
    up after the new deadline (a shorter TTL since)."""
    if x is None or deadline < x.due:
        x = b.txns[t] = Txn(t, state, estimate, starts, deadline)
        push(b.due, x)
    else:
        x.state = state
        x.estimate = estimate
        x.starts = starts
        x.deadline = deadline
    if deadline < b.d:
        b.d = deadline


def _starts(b: _Budget, limits: tuple[_Limit, ...], states: list[_State]) -> str:
    """A reservation's starts (`Txn`) in the windows of `states`: the budget's last one
    when they have not rolled since, so a run of reservations shares one string (and
    `_end` reads it back as the budget's tuple)."""
    last = b.starts
    if len(last) == 2 * len(limits):
        for k in range(len(limits)):
            lim = limits[k]
            s = states[k]
            if last[2 * k] != lim.name or last[2 * k + 1] != s.w:
                break
        else:
            return b.spelt
    held_in: list[Any] = []
    for k in range(len(limits)):
        lim = limits[k]
        s = states[k]
        held_in += (lim.name, s.w)
    b.starts = starts = tuple(held_in)
    b.spelt = spelt = spell(starts)
    return spelt


def _levels(
    limits: tuple[_Limit, ...], states: list[_State], ts: list[int], asked: int
) -> tuple[tuple[int, int], ...]:
    out = []
    for k in range(len(limits)):
        win = limits[k]
        s = states[k]
        t = ts[k]
        after = level(win, s, t) + asked
        out.append((after, reset(win, s, t, asked, after)))
    return tuple(out)


def _sweep(
    b: _Budget,
    now: int,
    ttl: int,
    charge_expired: bool,
    limits: tuple[_Limit, ...],
    states: list[_State],
    result: Result,
) -> bool:
    """Apply up to SWEEP_BATCH transactions whose deadline has passed (module
    docstring, step 3), counted in `result`; whether any was."""
    due = b.due
    txns = b.txns
    swept = ended = charged_total = est_total = 0
    while due and due[0].due <= now and swept < SWEEP_BATCH:
        x = pop(due)
        if txns.get(x.id) is not x:
            continue  # replaced since it was queued
        if x.deadline != x.due:  # moved later since it was queued
            x.due = x.deadline
            push(due, x)
            continue
        swept += 1
        if x.state == "o" or x.state == "c":
            charge = x.estimate if charge_expired else 0
            _end(b, states, x, charge, limits)
            ended += 1
            est_total += x.estimate
            charged_total += charge
            x.state = "x"
            x.starts = ""
            x.due = x.deadline = now + ttl
            push(due, x)
        else:
            del txns[x.id]
    if swept == SWEEP_BATCH:
        b.d = now  # more may be due: the next call looks again
    else:
        # The next sweep: at the first deadline left, but not before half a TTL from now
        # (the Redis store reads a whole budget to sweep it: `model`).
        while due:
            x = due[0]
            if txns.get(x.id) is not x:
                pop(due)  # replaced since it was queued
            elif x.deadline != x.due:  # moved later since it was queued
                pop(due)
                x.due = x.deadline
                push(due, x)
            else:
                break
        b.d = max(due[0].due, now + ttl // 2) if due else NEVER
    result.expired = ended
    result.expired_estimate = est_total
    result.expired_charged = charged_total
    return swept > 0


def _pairs(starts: tuple[Any, ...]) -> dict[str, int]:
    """(name, start, ...) as {name: start} (`MemoryBudgets.state`)."""
    return dict(zip(starts[::2], starts[1::2], strict=True))
