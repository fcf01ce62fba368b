# cython: annotation_typing=False
"""A budget call in a decision: how the plan finds it, the store operation it becomes, and the
status its result gives (docs/budgets.md).

The decision model (`_plan.pyx` and `_decision.pyx`, compiled only) calls these for its
`BUDGET` items and for nothing else, so an ordinary decision never pays for them:

* plan: `lookup` finds a budget call's rule by the descriptor without its phase and
  transaction entries; `terms_of` is what the call reads of that rule, read once per rule;
  `item_call` what the item asks of its budget, which `held_apart` holds for `arrange`;
* count: `budget_key` is the budget's store key, `budget_call` the one store call of the
  item (a `model.Call`: a synchronous store runs it as it is), `budget_op` that call in an
  `Op` (a store's round);
* verdict: `budget_status` reads the call's `model.Result` as the item's Status, with the
  rule's statistics (the reserve's hits split as any limit's, and the budget's own series).

Compiled with Cython in its pure-Python mode, as `backends.memory_budget` is (every budget
call runs through here; types in `calls.pxd`, which the decision cimports); the same source
runs uncompiled where the extension is not built.
"""

from __future__ import annotations

import hashlib
from binascii import crc32
from collections.abc import Sequence
from typing import Any

from ..backends.base import Op
from ..backends.memory_budget import MemoryBudgets
from ..config.budget_store import (
    ADMITTED,
    COUNT,
    DUPLICATE,
    EXTRA,
    FULL,
    GUARD,
    MAX_TXN_BYTES,
    ORPHAN,
    RELEASE,
    RESERVE,
    SETTLE,
    SETTLED,
    Call,
    Result,
)
from ..config.budgets import PHASES
from ..config.keys import refuse, state_key, unit_seconds, verdict
from ..messages import OK, ServiceError, Status
from .outbox import event as outbox_event

__all__ = [
    "Terms",
    "arrange",
    "budget_call",
    "budget_key",
    "budget_now",
    "budget_op",
    "budget_status",
    "held_apart",
    "item_call",
    "lookup",
    "recognise",
    "relimit",
    "status_of",
    "terms_of",
    "transaction_id",
]

TOO_MANY_REQUESTS = 429


class Terms:
    """What a budget call reads of its rule, in C fields once compiled: the store's view of
    the budget (`windows`, `ttl`, the `unsettled` policy as `charge` and `served`, the
    `outbox`), the rule's modes, and per limit what a status reports (`limits`, the
    `requests` allowed, the `ticks` of its reset). A call reads a dozen of them; read
    through the rule they are a dozen generic attribute lookups."""

    __slots__ = (
        "charge",
        "full_key",
        "limits",
        "outbox",
        "quota",
        "requests",
        "served",
        "shadow",
        "ticks",
        "ttl",
        "windows",
    )

    def __init__(self, rule: Any) -> None:
        spec = rule.budget
        self.full_key = rule.full_key
        self.windows = spec.windows
        self.ttl = spec.ttl_ms
        self.charge = spec.unsettled != "release"
        self.served = spec.unsettled == "charge_served"
        self.outbox = spec.outbox
        self.shadow = rule.shadow_mode
        self.quota = rule.quota_mode
        self.limits = tuple([w.limit for w in rule.windows])
        self.requests = tuple([w.requests for w in rule.windows])
        self.ticks = tuple([w.tick for w in spec.windows])


def terms_of(rule: Any) -> Terms:
    """A budget rule's `Terms`, read on its first call and kept on it (`budget_terms`)."""
    got = rule.budget_terms
    if got is None:
        got = rule.budget_terms = Terms(rule)
    return got  # type: ignore[no-any-return]


def recognise(
    entries: Sequence[tuple[str, str]], phase_key: str, transaction_key: str
) -> tuple[int, str, tuple[tuple[str, str], ...]] | None:
    """(call kind, transaction id, the other entries in order) when the descriptor is a
    budget call: exactly one phase entry with a known phase (`config.budgets.PHASES`) and
    exactly one non-empty transaction entry. Anything else is an ordinary descriptor (None),
    decided as sent."""
    phases = PHASES
    kind = 0
    txn = ""
    rest = []
    for i in range(len(entries)):
        entry = entries[i]
        key = entry[0]
        if key == phase_key:
            if kind:
                return None
            kind = phases.get(entry[1], -1)
        elif key == transaction_key:
            if txn or not entry[1]:
                return None
            txn = entry[1]
        else:
            rest.append(entry)
    if kind <= 0 or not txn:
        return None
    return kind, txn, tuple(rest)


def transaction_id(value: str) -> str:
    """The id a transaction is stored under: the value itself, or `#<digest>` for one of
    more than MAX_TXN_BYTES bytes (a client may send any x-request-id; the store keeps a
    bounded field per transaction)."""
    # An ASCII id (an x-request-id, nearly always) is as long in bytes as in characters:
    # no encoding to measure it.
    size = len(value) if value.isascii() else len(value.encode())
    if size <= MAX_TXN_BYTES and (not value or value[0] != "#"):
        return value
    return "#" + hashlib.blake2b(value.encode(), digest_size=16).hexdigest()


def lookup(
    find: Any,
    root: Any,
    domain: str,
    entries: Sequence[tuple[str, str]],
    keys: tuple[str, str, bool, bool],
    walked: list[Any] | None,
) -> tuple[Any, tuple[int, str, tuple[tuple[str, str], ...]]] | None:
    """(what `find` found, the recognised call) when `entries` are a budget call (one phase
    entry, one transaction entry, `keys`' first two) whose other entries match a budget
    rule; None otherwise (the descriptor is then looked up as sent, `walked` emptied)."""
    call = recognise(entries, keys[0], keys[1])
    if call is None:
        return None
    found = find(root, domain, call[2], walked)
    if found is not None and found[0].budget is not None:
        return found, call
    if walked is not None:
        walked.clear()
    return None


def relimit(found: Any, limit: tuple[int, int]) -> Any:
    """`found` (a budget rule as `lookup` found it) with a request's own limit in place of
    the rule's (`descriptor.limit`: Envoy Gateway's `limit.fromMetadata`, one rule for every
    tenant, each at its own limit). Send the same limit with every call of a transaction:
    its windows are named by the limit's unit."""
    rule = found[0]
    requests_per_unit, unit = limit
    if not unit_seconds(unit):
        raise ServiceError(f"invalid rate limit override unit {unit}")
    own = rule.relimited(
        requests_per_unit,
        unit,
        algorithm=rule.algorithm,
        # The rule's tick when it fits (a sliding window's maths over the new limit).
        tick=rule.tick if requests_per_unit * unit_seconds(unit) * 1000 <= 2**50 else 1000,
    )
    return (own, *found[1:])


def item_call(
    call: tuple[int, str, tuple[tuple[str, str], ...]] | None,
    terms: Terms,
    entries: Sequence[tuple[str, str]],
    negative: bool,
    keys: tuple[str, str, bool, bool] | None,
) -> tuple[int, str, Sequence[tuple[str, str]], bool, bool]:
    """What a descriptor matching a budget rule (its `terms`) asks of its budget: (the call's
    kind,
    its transaction id as stored, the budget's entries, force, remember). Without a
    recognised `call` it is a plain COUNT of the descriptor's `entries`. Shadow mode (the
    rule's or SHADOW_MODE, `keys`' third) forces a reserve; quota mode (the rule's or
    QUOTA_MODE, its fourth) remembers a refused one. Raises ServiceError for a refund."""
    if negative:
        raise ServiceError(
            f"is_negative_hits: '{terms.full_key}' is a token budget (its usage is settled, "
            "not refunded)"
        )
    shadow = quota = False
    if keys is not None:
        shadow, quota = keys[2], keys[3]
    force = shadow or terms.shadow
    remember = quota or terms.quota
    if call is None:
        return COUNT, "", entries, force, remember
    kind, txn, rest = call
    return kind, transaction_id(txn), rest, force, remember


def held_apart(kind: int) -> bool:
    """Whether a budget item asking a call of `kind` (`item_call`) is held apart from the
    plan's items until `arrange` puts it there, once every descriptor is planned: a
    reserve, a part of one, a guard or a close."""
    return kind in (RESERVE, EXTRA, GUARD, RELEASE)


def arrange(held: list[Any], items: list[Any], metadata: list[Any] | None) -> None:
    """Put the budget items held apart (`held_apart`) into the plan's `items`, once the whole
    request is planned (`decision.finish`). Per transaction on one budget:

    * its `reserve` and `extra` entries become one reservation of their summed hits (an
      estimate in parts: the completion's `max_tokens` and the prompt's bound);
    * a `guard` is dropped when a `reserve` of the transaction is in the call, and
      otherwise reserves its own hits (plus the extras): Envoy dropped the reserve (it
      could not format its estimate), and the request must not be served unreserved;
    * closes go last: a close after its stream's settle changes nothing, before it would
      free the reservation the settle then finds finished.

    A merged or dropped item answers as a descriptor without a limit (OK), and its rule's
    metadata (in the plan's `metadata`) is not the response's (the kept item's stands for
    the transaction).
    """
    if len(held) == 1:  # most calls: one reserve (or a part standing for it), or a close
        item = held[0]
        kind = item.budget[0]
        if kind not in (RESERVE, RELEASE):
            item.budget = (RESERVE, *item.budget[1:])
        items.append(item)
        return
    # Per (rule, budget entries, txn): [its reserve, its guard, its first other part, the
    # hits of every other part]; a second guard adds nothing.
    parts: dict[tuple[str, tuple[tuple[str, str], ...], str], list[Any]] = {}
    closes = []
    for item in held:
        kind = item.budget[0]
        if kind == RELEASE:
            closes.append(item)
            continue
        key = (item.rule.full_key, tuple(item.budget[2]), item.budget[1])
        got = parts.get(key)
        if got is None:
            got = parts[key] = [None, None, None, 0]
        if kind == GUARD:
            if got[1] is None:
                got[1] = item
        elif kind == RESERVE and got[0] is None:
            got[0] = item
        else:
            if got[2] is None:
                got[2] = item
            got[3] += item.hits
    kept = set()
    for reserve, guard, other, more in parts.values():
        base = reserve if reserve is not None else guard
        if base is None:  # other parts alone: their sum is the estimate
            base, more = other, more - other.hits
        base.budget = (RESERVE, *base.budget[1:])
        base.hits += more
        items.append(base)
        kept.add(base.index)
    items += closes
    if metadata is not None:
        for item in held:
            if item.budget[0] != RELEASE and item.index not in kept:
                metadata[item.index] = None


def budget_key(prefix: str, domain: str, entries: Sequence[tuple[str, str]], share: Any) -> str:
    """The budget's state key (`model.budget_keys`; its deadline set is this + `_due`), its
    readable part spelt by the counters' compiled key maths (the same spelling), the prefix
    already checked by the limiter."""
    readable = state_key("", domain, entries, share, "budget")
    # `config.budget_store.tagged`, with the CRC-32 a C integer (formatted in C); the two
    # spellings are held equal by tests/budget/test_budget_store.py.
    crc = crc32(readable.encode())
    return f"{prefix}{{{crc:08x}}}{readable}"


def budget_op(item: Any, key: str, now_ms: int) -> Op:
    """The store operation of a budget item at `now_ms`: its `budget_call` in an Op."""
    call = budget_call(item, key, now_ms)
    return Op(key, call.amount, 0, budget=call)


def budget_call(item: Any, key: str, now_ms: int) -> Call:
    """The one store call of a budget item at `now_ms` (a synchronous store takes it as
    it is: `SyncBackend.budget_now`).

    A close's hits are the response code. Under `charge_served` a success (2xx: the
    response started, so content may have streamed) charges the estimate and anything else
    (0: the client left before any answer; an error; a refusal) releases it. A 429 (the
    request was refused, by this service or the upstream) releases under every policy,
    since nothing was served. Reservations past their TTL are charged unless the policy is
    `release`."""
    asked = item.budget
    kind = asked[0]
    terms = terms_of(item.rule)
    amount = item.hits
    unserved = kind == RELEASE and _unserved(terms.served, amount)
    if kind == RELEASE:
        amount = 0
    call = Call(
        kind,
        key,
        terms.windows,
        now_ms,
        txn=asked[1],
        amount=amount,
        ttl=terms.ttl,
        charge=terms.charge,
        force=asked[3],
        remember=asked[4],
        unserved=unserved,
    )
    if terms.outbox:  # on every call: a budget with an outbox is kept by the script
        call.outbox = terms.outbox
        if kind in (SETTLE, RELEASE):
            call.event = outbox_event(asked[2])
    return call


def budget_now(
    run: Any, item: Any, asked: tuple[Any, ...], terms: Terms, hits: int, key: str, now_ms: int
) -> Result:
    """The result of a budget item's `budget_call` on a synchronous store, whose
    `budget_now` is `run`; `asked`, `terms` (its rule's) and `hits` are the item's (read by
    the compiled decision from its fields). On the memory store's budgets
    (`MemoryBudgets.apply`) the call is made from them, no Call built; the memory store
    appends to no outbox."""
    budgets = getattr(run, "__self__", None)
    if type(budgets) is not MemoryBudgets:
        return run(budget_call(item, key, now_ms))  # type: ignore[no-any-return]
    memory = budgets
    kind = asked[0]
    amount = hits
    unserved = kind == RELEASE and _unserved(terms.served, amount)
    if kind == RELEASE:
        amount = 0
    return memory.decide(  # type: ignore[no-any-return]
        kind,
        key,
        terms.windows,
        now_ms,
        asked[1],
        amount,
        terms.ttl,
        terms.charge,
        asked[3],
        asked[4],
        unserved,
    )


def _unserved(served: bool, code: int) -> bool:
    """Whether a close with response code `code` served nothing: under `charge_served`
    (`served`) anything but a success, under the other policies a refusal (`budget_call`)."""
    if served:
        return not 200 <= code < 300
    return code == TOO_MANY_REQUESTS


def budget_status(item: Any, result: Result, ratio: float) -> Status:
    """A budget item's Status from its call's result, and its statistics.

    The deciding window is chosen as for any limit (over first, the longest wait among
    those; else the least remaining; the first listed on a tie). A reserve or a plain count
    is then any limit's verdict (a reused transaction id refused); a settle or close
    answers OK with what remains.
    """
    return status_of(item.budget, terms_of(item.rule), item.hits, item.stats, result, ratio)


def status_of(
    asked: tuple[Any, ...], terms: Terms, hits: int, st: Any, result: Result, ratio: float
) -> Status:
    """`budget_status` of an item given by its call (`item.budget`), rule's `terms`, hits
    and statistics (the compiled decision reads them from the item's fields)."""
    if not st.budget:  # a read costs less than a write
        st.budget = True
    best: Any = None
    best_over = False
    best_after = best_reset = best_left = 0
    # Indexed, not zipped: this runs for every budget call (the four are in step).
    limits = terms.limits
    allowed = terms.requests
    tick_ms = terms.ticks
    levels = result.levels
    for k in range(len(levels)):
        after, ticks = levels[k]
        tick = tick_ms[k]
        requests = allowed[k]
        wait = -(-ticks * tick // 1000)  # never past the wait
        left = requests - after
        over = left < 0
        if (
            best is None
            or (over and (not best_over or wait > best_reset))
            or (not over and not best_over and left < best_left)
        ):
            best, best_over, best_after, best_reset, best_left = limits[k], over, after, wait, left
    if result.expired:
        st.budget_expired += result.expired
        st.budget_reserved -= result.expired_estimate
        st.budget_charged += result.expired_charged
    kind = asked[0]
    outcome = result.outcome
    if kind in (RESERVE, COUNT):
        st.total_hits += hits
        if outcome == DUPLICATE:
            st.budget_duplicate += 1
            return refuse(best, st, hits, best_reset)
        if outcome == FULL:  # the budget (or process) holds its most transactions
            st.budget_full += 1
            return refuse(best, st, hits, best_reset)
        if kind == RESERVE and (outcome == ADMITTED or asked[3]):
            st.budget_reserved += hits  # held (forced past the limit in shadow mode)
        return verdict(best, st, hits, best_after, ratio, best_reset)
    if outcome == SETTLED:
        st.budget_reserved -= result.estimate
        if kind == SETTLE:
            st.budget_settled += 1
        else:
            st.budget_released += 1
    elif outcome == ORPHAN:
        st.budget_orphaned += 1
    st.budget_charged += result.charged
    return Status(OK, best, max(0, best_left), best_reset)
