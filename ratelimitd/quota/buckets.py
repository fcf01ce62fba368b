"""Buckets: an RLQS BucketId (a map) as the descriptor entries of the rule set, and what
the server remembers of one bucket of one stream.

One config serves RLS and RLQS: a bucket `{name: api, user: alice}` is the descriptor
`[(name, api), (user, alice)]` when RLQS_BUCKET_KEYS is `name,user`; keys the setting does
not list follow in name order, so the order never depends on the map's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..messages import TooLarge, check_entries

Entries = tuple[tuple[str, str], ...]


class BucketError(ValueError):
    """A BucketId the server refuses (empty, an empty key or value, past the bounds)."""


class BucketKeys:
    """The order of a bucket's keys as descriptor entries (RLQS_BUCKET_KEYS)."""

    def __init__(self, order: Sequence[str] = ()) -> None:
        self.rank = {key: i for i, key in enumerate(order)}

    def entries(self, bucket: Mapping[str, str], bounds: object) -> Entries:
        """The descriptor entries of `bucket`; BucketError when it cannot be one (`bounds`:
        MAX_ENTRIES_PER_DESCRIPTOR and MAX_DESCRIPTOR_VALUE_LENGTH, as for RLS)."""
        if not bucket:
            raise BucketError("a bucket_id with no entries")
        for key, value in bucket.items():
            if not key or not value:
                raise BucketError(f"a bucket_id entry with an empty key or value: {key!r}")
        last = len(self.rank)
        ordered = sorted(bucket.items(), key=lambda kv: (self.rank.get(kv[0], last), kv[0]))
        entries = tuple(ordered)
        try:
            check_entries(bounds, entries)
        except TooLarge as exc:
            raise BucketError(str(exc)) from None
        return entries


@dataclass(slots=True, eq=False)
class Bucket:
    """One bucket of one stream: its demand and what its Envoy holds."""

    entries: Entries
    # Requests per second (smoothed over reports); None before the first report.
    rate: float | None = None
    # Tokens the server estimates the Envoy's token bucket still holds: the last
    # assignment's size less what was reported allowed since.
    left: int = 0
    # The strategy last sent (`strategy` key), None before the first assignment.
    sent: tuple[object, ...] | None = None
    # The daemon's clock when the counted window ends (0: not known yet).
    window_end: float = 0.0
    # The clock of the last report that carried a request (idle buckets are abandoned).
    last_busy: float = 0.0
    # Totals for the metrics and the /counters view.
    reports: int = 0
    allowed: int = 0
    denied: int = 0
    assignments: int = 0
    limit: int = 0
