"""What a budget call is, what it answers, and where a budget lives (docs/budgets.md).

A budget is one descriptor of a `budget:` rule (after its phase and transaction entries are
taken out) with the rule's limits. Its whole state is two store keys that share one Redis
Cluster hash slot:

  `<prefix>{<tag>}<domain>_<k>_<v>[_<k>_<v>..]_budget`        a hash: per limit its window
                                                              (`<name>.w/.u/.r/.p/.q`), per
                                                              transaction `t:<id>`, `e`, and
                                                              on Redis `d`
  the same key + `_due`                                       a sorted set: transaction ->
                                                              deadline (ms)

`<tag>` is the CRC-32 of the readable part, in hex. Only the slot depends on it (two
budgets whose tags collide share a slot, nothing else), and it is the first `{...}` of the
key whatever the descriptor values contain, so a value with braces cannot split a budget
over two slots. Per limit `name` (`3600s`, `60s_sliding`): `w` the window start (ticks of
that limit), `u` the usage charged to it, `r` the estimates reserved in it and still open;
a sliding window also keeps `p` and `q`, the same two of the window before. A transaction
is `o <estimate> <name>=<start> ...` while open (`c` once another reserve reused its id),
then a tombstone `s` (settled, released or closed) or `x` (expired), each until its deadline
in the sorted set; `r` marks a refused reserve that asked to be remembered (a quota-mode
budget: the request went elsewhere, so its stream end must charge nothing here). `e` is
when the whole budget can be forgotten (ms): the stores treat the state as absent from then
on, whatever the real key TTL says, so the memory twin and Redis agree under a test's
clock: the end of the last window written + the TTL, which no deadline set then passes.
`d` is the next sweep: the first deadline, but not before half a TTL after the sweep
before (a store without a deadline index reads a whole budget to sweep it).

That is the script's layout (`backends.redis.budget`), which keeps a budget with a sliding
window or an outbox. A budget of fixed windows without an outbox is kept on Redis in plain
commands instead (`backends.redis.claims`), in other keys of the same slot:

  the state key + `_t`                                        a hash: per transaction
                                                              `<id>` an integer record;
                                                              `~` the budget's `e`
  the state key + `_<name>_<start>`                           per window start a counter:
                                                              usage + reservations

The maths of one call is `ratelimitd.backends.memory_budget` (the twin), the Lua script of
`ratelimitd.backends.redis.budget`, line for line, and the commands of
`ratelimitd.backends.redis.claims`; property tests hold them equal.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence

import msgspec

from .windows import FIXED_WINDOW, SLIDING_WINDOW

__all__ = [
    "ADMITTED",
    "CONTESTED",
    "CONTESTED_BIT",
    "COUNT",
    "DUPLICATE",
    "ENDED_BIT",
    "EST",
    "EXTRA",
    "FINISHED",
    "FULL",
    "GUARD",
    "KIND_NAMES",
    "MAX_BUDGET_TXNS",
    "MAX_TXN_BYTES",
    "NEVER",
    "ORPHAN",
    "OUTCOME_NAMES",
    "PEEK",
    "REFUSED",
    "REFUSED_BIT",
    "RELEASE",
    "RESERVE",
    "SETTLE",
    "SETTLED",
    "SKEW",
    "SWEEP_BATCH",
    "TIME",
    "UNKNOWN_ID",
    "USED_MAX",
    "Call",
    "Result",
    "Window",
    "budget_keys",
    "claim_of",
    "command_keys",
    "counter_key",
    "covers",
    "e_field",
    "e_of",
    "eligible",
    "fixed",
    "is_open",
    "moved_to",
    "record",
    "record_time",
    "records_key",
    "remembered",
    "script_state",
    "sliding",
    "sweep_key",
    "tagged",
]

# What a call does. RESERVE: hold `amount` (the estimate) for `txn` if every window has room.
# SETTLE: charge `amount` (the actual usage) to the reservation's windows and free it.
# RELEASE: free it without usage (a stream end without usage, "close"): the estimate is
# charged instead when `charge` is set (the rule's policy). COUNT: a plain call on a budget
# rule (no transaction): its hits are counted as the limit's algorithm counts them, against
# usage + reservations. PEEK: what RESERVE would answer, writing nothing (a dry RESERVE).
RESERVE, SETTLE, RELEASE, COUNT, PEEK = 1, 2, 3, 4, 5
# GUARD is no store operation: a request-time entry Envoy always sends beside the reserve
# (its hits a static number), so that a reserve Envoy dropped (an estimate it could not
# format) is noticed. The plan turns it into a RESERVE of its hits when no reserve of its
# transaction came in the same call, and drops it otherwise (`budget.calls.arrange`).
GUARD = 6
# EXTRA is no store operation either: another part of a transaction's estimate (e.g. the
# prompt's bound beside the completion's `max_tokens`), added to its reservation. It never
# stands in for the reserve a guard watches for.
EXTRA = 7
KIND_NAMES = {
    RESERVE: "reserve",
    SETTLE: "settle",
    RELEASE: "release",
    COUNT: "count",
    PEEK: "peek",
    GUARD: "guard",
    EXTRA: "extra",
}

# What came of it.
ADMITTED = 1  # reserve / count / peek: every window had room
REFUSED = 2  # reserve / count / peek: a window had none; nothing reserved
DUPLICATE = 3  # reserve of an id that is open or finished: refused, the open one contested
SETTLED = 4  # settle / release of an open reservation: done
FINISHED = 5  # settle / release of a settled, released or expired one: nothing changes
ORPHAN = 6  # settle of an unknown id (never reserved here): the usage charged to now
UNKNOWN_ID = 7  # release of an unknown id: nothing to do
CONTESTED = 8  # release of a contested reservation: ignored, only a settle or the TTL end it
FULL = 9  # reserve / peek of a new id on a budget (or a process) holding its most transactions
OUTCOME_NAMES = {
    ADMITTED: "admitted",
    REFUSED: "refused",
    DUPLICATE: "duplicate",
    SETTLED: "settled",
    FINISHED: "finished",
    ORPHAN: "orphan",
    UNKNOWN_ID: "unknown",
    CONTESTED: "contested",
    FULL: "full",
}

# Expired transactions one call applies at most, oldest first (the rest on later calls:
# until then they still hold their estimates, so a backlog can refuse, never overshoot).
SWEEP_BATCH = 64
# A budget's next sweep when it has nothing to sweep (ms): 2^53 - 1, exact in Lua.
NEVER = 2**53 - 1
# Usage saturates here: far past any uint32 limit, exact in Lua's doubles.
USED_MAX = 2**52
# A longer transaction id is stored as its digest (`budget.calls.transaction_id`: an
# x-request-id is a client's header).
MAX_TXN_BYTES = 64
# BUDGET_MAX_TRANSACTIONS' default: the transactions (open ones and tombstones) one budget
# holds at most. Past it a reserve of a new id is refused (FULL) and a settle of an unknown
# one charges its usage without a tombstone. 250,880 reserves in 5 s once added 130 MB to one
# memory budget (518 B each) and 237k grew one Redis hash by 75 MB.
MAX_BUDGET_TXNS = 100_000


class Window(msgspec.Struct, frozen=True, gc=False):
    """One limit of a budget: its state's field prefix, algorithm, length and limit.

    Lengths and times are in ticks of `tick` ms: 1000 for a fixed window (its starts are
    the reference's Unix-second window starts), the rule's own tick for a sliding window.
    """

    name: str
    algorithm: int
    ticks: int
    tick: int
    limit: int


def fixed(seconds: int, limit: int) -> Window:
    """A fixed window of `seconds` (field prefix `<seconds>s`)."""
    return Window(f"{seconds}s", FIXED_WINDOW, seconds, 1000, limit)


def sliding(seconds: int, limit: int, tick: int = 1) -> Window:
    """A sliding window of `seconds` counted in ticks of `tick` ms (`<seconds>s_sliding`)."""
    return Window(f"{seconds}s_sliding", SLIDING_WINDOW, seconds * 1000 // tick, tick, limit)


class Call(msgspec.Struct, gc=False):
    """One budget operation on one budget (module docstring), at `now` (Unix ms).

    `ttl` (ms) is how long a reservation may stay open, and how long a finished
    transaction's tombstone is kept (so a repeated settle changes nothing). `charge` is the
    rule's policy for a reservation that ends without usage (a RELEASE, or its TTL passing):
    charge the estimate, else release it. `force` reserves even without room (shadow mode:
    the answer is OK either way, and the accounting stays exact). `remember` keeps a refused
    reserve as an `r` tombstone for `ttl` (quota mode: the request is served elsewhere, and
    its settle must not be charged here as an unknown transaction). `unserved` marks a
    RELEASE of a response that served nothing (a stream end whose status is not a success):
    its own reservation is released even when `charge` is set, while reservations ended by
    their TTL during the call are still charged by `charge`.
    """

    kind: int
    key: str
    windows: tuple[Window, ...]
    now: int
    txn: str = ""
    amount: int = 0
    ttl: int = 0
    charge: bool = False
    force: bool = False
    remember: bool = False
    unserved: bool = False
    outbox: str = ""  # the rule's outbox stream (`budget.outbox`), on each of its calls
    # and a settle's or close's entry there, its `e` field
    event: str = ""


class Result(msgspec.Struct, gc=False):
    """What a call did.

    `levels` holds per window `(after, ticks until reset)`: `after` is usage + reservations
    (weighted as the algorithm weighs them) after the call, plus the amount asked for by a
    reserve, count or peek whether admitted or not, so `after > limit` is exactly "this
    window refused". The reset is when the window frees room if every open reservation is
    charged in full (the worst case; it may come sooner). `estimate` and `charged` are what
    the call's own settle or release took from the reservations and added to usage;
    `expired*` the same for the reservations whose TTL ended during the call. A dry run
    (`MemoryBudgets.dry_run`, `/explain`) also gives `held`: per window `(used, reserved)`
    of its current window once expired reservations are applied, before the call's own
    operation.
    """

    outcome: int
    levels: tuple[tuple[int, int], ...]
    estimate: int = 0
    charged: int = 0
    expired: int = 0
    expired_estimate: int = 0
    expired_charged: int = 0
    held: tuple[tuple[int, int], ...] = ()


def budget_keys(
    prefix: str,
    domain: str,
    entries: Sequence[tuple[str, str]],
    share: Sequence[str] | None = None,
) -> tuple[str, str]:
    """The budget's state hash and deadline set keys (module docstring).

    `share` replaces values by their share_threshold patterns, as the counter keys do.
    Raises ValueError for a `prefix` that would stop the tag from choosing the slot (its
    first `{` directly followed by `}`: Redis then hashes whole keys).
    """
    start = prefix.find("{")
    if start >= 0 and prefix[start + 1 : start + 2] == "}":
        raise ValueError(
            f"CACHE_KEY_PREFIX {prefix!r} starts an empty Redis hash tag '{{}}': "
            "a budget's two keys could land in different Cluster slots"
        )
    parts = [domain, "_"]
    for i, (k, v) in enumerate(entries):
        pattern = share[i] if share is not None and i < len(share) else ""
        parts += (k, "_", pattern or v, "_")
    parts.append("budget")
    state = tagged(prefix, "".join(parts))
    return state, state + "_due"


def eligible(call: Call) -> bool:
    """Whether Redis keeps `call`'s budget in plain commands (`backends.redis.claims`):
    fixed windows only, and no outbox (whose event the script appends in the same atomic
    step as the charge)."""
    return not call.outbox and all(win.algorithm == FIXED_WINDOW for win in call.windows)


def e_field(e: int) -> bytes:
    """The `~` field of a budget's records, holding its `e`: 65 bytes, past
    `hash-max-listpack-value`, so that the hash is a hash table from its first field (a
    listpack, a small hash's default encoding, is scanned linearly)."""
    return b"%020d" % e + b"~" * 45


def e_of(field: bytes | None) -> int:
    """The `e` an `e_field` holds (0: none)."""
    return int(field[:20]) if field else 0


def command_keys(key: str, windows: Sequence[Window], now: int) -> list[str]:
    """The keys a budget of fixed windows kept in plain commands (`backends.redis.claims`)
    lives in at `now` (ms): its records' hash, its sweep's claim, then per window its
    current counter."""
    out = [records_key(key), sweep_key(key)]
    for win in windows:
        t = now // win.tick
        out.append(counter_key(key, win.name, t - t % win.ticks))
    return out


# A record of a budget kept in plain commands: an integer in its records' hash.
EST = 2**32  # its estimate: bits 0-31
TIME = 2**28  # its time, ms modulo 2^28: bits 32-59
CONTESTED_BIT = 2**60  # open, and another reserve reused its id
REFUSED_BIT = 2**61  # a remembered refusal
ENDED_BIT = 2**62  # settled, released or expired: added twice, it would pass 2^63
# A record's time up to this far ahead of the reader's clock reads as ahead (another
# daemon's clock); one older than TIME - SKEW would read as ahead too, and none lives that
# long (a TTL of at most 24 h open, one as a tombstone, the sweep half a TTL late).
SKEW = 3_600_000


def record(est: int, time: int, flags: int = 0) -> int:
    """A record of `est` (at most 2^32 - 1: more than any limit) made at `time` (ms)."""
    return min(est, EST - 1) + (time % TIME) * EST + flags


def record_time(value: int, now: int) -> int:
    """A record's time (ms), read at `now`."""
    back = (now - (value // EST) % TIME) % TIME
    return now + (TIME - back) if back > TIME - SKEW else now - back


def moved_to(value: int, now: int) -> int:
    """What to add to a record for its time to read `now`."""
    return (now % TIME - (value // EST) % TIME) * EST


def claim_of(value: int, now: int) -> tuple[int, int]:
    """A claim's increment on a record read as `value` at `now` (its end: ENDED, its time
    moved to `now`), and one to add once it has succeeded. The time moves in with the
    claim when that adds to the record; when it would take from it (the time wrapped since
    the reserve, or the reserving clock was ahead), a claim on an ended record might not
    overflow, so the time moves after."""
    moved = moved_to(value, now)
    return (ENDED_BIT + moved, 0) if moved >= 0 else (ENDED_BIT, moved)


def covers(call: Call) -> int:
    """The `e` a write at `call.now` needs: its windows' ends + the TTL (`model`)."""
    e = 0
    for win in call.windows:
        t = call.now // win.tick
        end = (t - t % win.ticks + win.ticks) * win.tick
        e = max(e, end)
    return e + call.ttl


def is_open(value: int) -> bool:
    """An open reservation's record (contested or not)."""
    return value < REFUSED_BIT


def remembered(value: int) -> bool:
    """A remembered refusal's record."""
    return REFUSED_BIT <= value < ENDED_BIT


def script_state(
    call: Call,
    records: dict[str, int],
    e: int,
    d: int,
    counters: Sequence[int],
    starts: Sequence[int],
) -> tuple[dict[bytes, bytes], list[bytes]]:
    """A budget kept in plain commands, read at `call.now` (its records, `e`, next sweep
    `d`, and its windows' current counters from `starts`), as the script keeps one: the
    fields and deadlines `MemoryBudgets.load` takes, for a dry run with the twin's maths."""
    now, ttl = call.now, call.ttl
    fields: dict[bytes, bytes] = {}
    if records or e:
        fields[b"e"], fields[b"d"] = b"%d" % e, b"%d" % d
    due: list[bytes] = []
    reserved = [0] * len(call.windows)
    for t, v in records.items():
        at = record_time(v, now)
        if is_open(v):
            est = v % EST
            held_in = []
            for k, win in enumerate(call.windows):
                tick = at // win.tick
                start = tick - tick % win.ticks
                held_in.append(f"{win.name}={start}")
                if start == starts[k]:
                    reserved[k] += est
            opened = "c" if v & CONTESTED_BIT else "o"
            fields[b"t:" + t.encode()] = f"{opened} {est} {' '.join(held_in)}".encode()
        else:
            fields[b"t:" + t.encode()] = b"r" if remembered(v) else b"s"
        due += (t.encode(), b"%d" % (at + ttl))
    for k, win in enumerate(call.windows):
        if counters[k] or reserved[k]:
            name = win.name.encode()
            fields[name + b".w"] = b"%d" % starts[k]
            fields[name + b".u"] = b"%d" % (counters[k] - reserved[k])
            fields[name + b".r"] = b"%d" % reserved[k]
    return fields, due


def records_key(key: str) -> str:
    """The hash of a budget's records, in plain commands (`backends.redis.claims`)."""
    return key + "_t"


def sweep_key(key: str) -> str:
    """Who swept a budget last and until when no one else need (`backends.redis.claims`)."""
    return key + "_s"


def counter_key(key: str, name: str, start: int) -> str:
    """A window's counter from `start` (ticks), in plain commands (`backends.redis.claims`)."""
    return f"{key}_{name}_{start}"


def tagged(prefix: str, readable: str) -> str:
    """A budget's state key from its readable part (`budget_keys`): the part's CRC-32 as the
    hash tag, first after the prefix."""
    return f"{prefix}{{{binascii.crc32(readable.encode()):08x}}}{readable}"
