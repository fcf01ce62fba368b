"""The settle outbox: every settled token budget as one entry of a Redis stream, appended by
the budget's own script in the same atomic step that charges the usage.

A budget rule with `outbox: <stream key>` (Redis backend) has each settle that charges
usage (a reservation settled, or an unknown transaction charged at once) append:

    t    the transaction id as stored (the x-request-id, or `#<digest>` of a long one)
    n    the tokens charged (the stream end's usage)
    at   the call's instant, Unix ms
    e    the budget's descriptor entries without the phase and transaction ones, JSON
         [[key, value], ...] (which user, model, ... the tokens belong to)

Exactly once: the script charges and appends together or not at all; a repeated settle
finds the transaction's tombstone and does neither; a settle the store could not take is
kept and sent again (`budget.retry`) and then does both. A consumer (the usage sidecar's
budget feed) stores entries keyed by `t`, so a redelivered entry counts once, and
acknowledges them after storing (XREADGROUP / XACK). The stream is one key outside the
budget's hash tag: standalone or sentinel Redis, not Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

__all__ = ["Settled", "event", "parse"]

_encode = msgspec.json.encode


class Settled(msgspec.Struct, frozen=True):
    """One outbox entry, decoded."""

    txn: str
    tokens: int
    at_ms: int
    entries: tuple[tuple[str, str], ...]

    def value(self, key: str) -> str | None:
        """The value of descriptor entry `key`, or None."""
        return next((v for k, v in self.entries if k == key), None)


def event(entries: Sequence[tuple[str, str]]) -> str:
    """The `e` field of a settle of a budget with these entries."""
    return _encode([list(e) for e in entries]).decode()


def parse(fields: Mapping[bytes, bytes]) -> Settled:
    """An entry's fields (as XREADGROUP returns them); ValueError when malformed."""
    try:
        raw = msgspec.json.decode(fields[b"e"], type=list[tuple[str, str]])
        return Settled(fields[b"t"].decode(), int(fields[b"n"]), int(fields[b"at"]), tuple(raw))
    except (KeyError, ValueError, msgspec.DecodeError) as exc:
        raise ValueError(f"not a settle outbox entry: {exc}") from None
