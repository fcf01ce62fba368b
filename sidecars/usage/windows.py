"""Counting windows over UTC day buckets: billing cycles and rolling 30 days.

Pure arithmetic with the clock passed in, so the boundaries are unit-tested with any `now`.
ratelimitd meters into one bucket per UTC day (`meter_key`, day start in epoch seconds); a
window is the list of day starts whose buckets are summed.

- `billing_cycle`: monthly cycles anchored on the subscription's start day. Cycle k starts in
  the k-th month after the start month on the anchor day, or on that month's last day when the
  month is shorter (anchor 31 -> Feb 28/29, Apr 30, then back to the 31st where it exists). The
  current cycle is the one containing today; it ends where the next one starts. Before the
  subscription starts, the first cycle is reported and nothing is counted.
- `rolling_30_days`: 30 whole UTC days plus today: the 30 complete days before today and
  today's bucket so far (31 buckets), so the window always covers at least 30 × 24 h (between
  30 and 31 days, growing through the day). It slides at 00:00Z: a day's usage leaves the
  window at the start of the 31st day after it.
"""

from __future__ import annotations

import calendar
from datetime import UTC, date, datetime, timedelta

import msgspec

DAY = 86400
ROLLING_DAYS = 30  # whole days before today
DEFAULT_RANGE_DAYS = 30  # a report's range when only its end (or nothing) is given


def day_range(first: date | None, last: date) -> tuple[date, date]:
    """[first, last] with `first` defaulting to the DEFAULT_RANGE_DAYS days ending at `last`;
    ValueError (the reason) when that default would start before the calendar does, or
    `first` is after `last`."""
    if first is None:
        if (last - date.min).days < DEFAULT_RANGE_DAYS - 1:
            raise ValueError(
                f"the default range (the {DEFAULT_RANGE_DAYS} days ending at {last}) would "
                f"start before {date.min}; give the first day too"
            )
        first = last - timedelta(days=DEFAULT_RANGE_DAYS - 1)
    if first > last:
        raise ValueError(f"the first day ({first}) is after the last ({last})")
    return first, last


class Window(msgspec.Struct, frozen=True):
    """A counting window: [start, end) in epoch seconds and the day buckets counted so far."""

    kind: str
    start: int
    end: int
    days: tuple[int, ...]


def day_start(ts: float) -> int:
    """Epoch seconds of 00:00Z of the UTC day containing `ts`."""
    t = int(ts // 1)
    return t - t % DAY


def epoch(d: date) -> int:
    """Epoch seconds of 00:00Z of the UTC calendar day `d`."""
    return (d.toordinal() - _EPOCH_ORDINAL) * DAY


def utc_date(ts: float) -> date:
    """The UTC calendar day containing `ts`."""
    return date.fromordinal(_EPOCH_ORDINAL + day_start(ts) // DAY)


def utc_datetime(ts: int) -> datetime:
    """An aware UTC datetime for epoch seconds (encodes as ...Z)."""
    return datetime.fromtimestamp(ts, UTC)


_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def cycle_start(anchor: date, k: int) -> date:
    """Start of the k-th monthly cycle after `anchor` (k=0 is the anchor itself)."""
    months = anchor.year * 12 + anchor.month - 1 + k
    year, month = divmod(months, 12)
    month += 1
    return date(year, month, min(anchor.day, calendar.monthrange(year, month)[1]))


def billing_cycle(anchor: date, today: date) -> tuple[date, date]:
    """The [start, end) dates of the cycle containing `today` (the first one before it starts)."""
    k = (today.year - anchor.year) * 12 + today.month - anchor.month
    if k > 0 and cycle_start(anchor, k) > today:
        # Today is in this month but before its anchor day: still last month's cycle.
        k -= 1
    k = max(k, 0)
    return cycle_start(anchor, k), cycle_start(anchor, k + 1)


def usage_window(kind: str, anchor: date, now: float) -> Window:
    """The window of kind `billing_cycle` or `rolling_30_days` at `now`."""
    today = day_start(now)
    if kind == "rolling_30_days":
        start = today - ROLLING_DAYS * DAY
        return Window(kind, start, today + DAY, tuple(range(start, today + DAY, DAY)))
    if kind != "billing_cycle":
        raise ValueError(f"unknown window kind {kind!r}")
    first, after = billing_cycle(anchor, utc_date(now))
    start, end = epoch(first), epoch(after)
    # Only days up to today have buckets; none before the subscription starts.
    return Window(kind, start, end, tuple(range(start, min(end, today + DAY), DAY)))
