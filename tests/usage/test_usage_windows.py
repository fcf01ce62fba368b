"""Window arithmetic with a controllable clock: billing cycles and rolling 30 days."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from ratelimitd.config.keys import meter_key
from sidecars.usage.windows import (
    DAY,
    billing_cycle,
    cycle_start,
    day_start,
    epoch,
    usage_window,
    utc_date,
)


def ts(*args: int) -> float:
    """Epoch seconds of a UTC date-time."""
    return datetime(*args, tzinfo=UTC).timestamp()  # type: ignore[misc]


def test_day_start_and_dates_agree_with_ratelimitd_meter_keys() -> None:
    now = ts(2025, 11, 22, 23, 59, 59)
    assert day_start(now) == 1763769600 == epoch(date(2025, 11, 22))
    assert day_start(now + 1) == 1763769600 + DAY
    assert utc_date(now) == date(2025, 11, 22)
    # The README's example: the sidecar's keys are ratelimitd's keys.
    key = meter_key("", "api", [("account", "acme")], day_start(now))
    assert key == "meter_api_account_acme_1763769600"
    assert meter_key("", "api", [("account", "acme")], int(now)) == key


@pytest.mark.parametrize(
    ("anchor", "today", "start", "end"),
    [
        # Mid-month anchor: the cycle changes exactly on the anchor day.
        (date(2026, 1, 15), date(2026, 1, 15), date(2026, 1, 15), date(2026, 2, 15)),
        (date(2026, 1, 15), date(2026, 2, 14), date(2026, 1, 15), date(2026, 2, 15)),
        (date(2026, 1, 15), date(2026, 2, 15), date(2026, 2, 15), date(2026, 3, 15)),
        (date(2026, 1, 15), date(2027, 1, 14), date(2026, 12, 15), date(2027, 1, 15)),
        (date(2026, 1, 15), date(2027, 1, 15), date(2027, 1, 15), date(2027, 2, 15)),
        # Anchor on the 31st: shorter months end on their last day, then back to the 31st.
        (date(2026, 1, 31), date(2026, 2, 27), date(2026, 1, 31), date(2026, 2, 28)),
        (date(2026, 1, 31), date(2026, 2, 28), date(2026, 2, 28), date(2026, 3, 31)),
        (date(2026, 1, 31), date(2026, 3, 30), date(2026, 2, 28), date(2026, 3, 31)),
        (date(2026, 1, 31), date(2026, 3, 31), date(2026, 3, 31), date(2026, 4, 30)),
        (date(2026, 1, 31), date(2026, 4, 30), date(2026, 4, 30), date(2026, 5, 31)),
        # Leap year: anchor 29/30/31 -> Feb 29.
        (date(2027, 12, 30), date(2028, 2, 29), date(2028, 2, 29), date(2028, 3, 30)),
        (date(2027, 12, 30), date(2028, 2, 28), date(2028, 1, 30), date(2028, 2, 29)),
        # Year boundary.
        (date(2025, 12, 1), date(2025, 12, 31), date(2025, 12, 1), date(2026, 1, 1)),
        (date(2025, 12, 1), date(2026, 1, 1), date(2026, 1, 1), date(2026, 2, 1)),
        # Before the subscription starts: its first cycle.
        (date(2026, 3, 10), date(2026, 1, 5), date(2026, 3, 10), date(2026, 4, 10)),
    ],
)
def test_billing_cycle_boundaries(anchor: date, today: date, start: date, end: date) -> None:
    assert billing_cycle(anchor, today) == (start, end)


def test_consecutive_cycles_tile_the_calendar() -> None:
    for anchor in (date(2026, 1, 1), date(2026, 1, 29), date(2026, 1, 30), date(2026, 1, 31)):
        day = anchor
        previous = billing_cycle(anchor, day)
        while day < date(2029, 1, 1):
            day = date.fromordinal(day.toordinal() + 1)
            cycle = billing_cycle(anchor, day)
            assert cycle[0] <= day < cycle[1]
            if cycle != previous:
                assert cycle[0] == previous[1], (anchor, day)  # no gap, no overlap
                assert 28 <= (cycle[1] - cycle[0]).days <= 31
                previous = cycle
        assert cycle_start(anchor, 0) == anchor


def test_billing_window_counts_days_from_cycle_start_to_today() -> None:
    anchor = date(2026, 1, 15)
    # One second before the cycle boundary: the whole old cycle, 31 buckets.
    w = usage_window("billing_cycle", anchor, ts(2026, 2, 14, 23, 59, 59))
    assert (w.start, w.end) == (epoch(date(2026, 1, 15)), epoch(date(2026, 2, 15)))
    assert len(w.days) == 31 and w.days[0] == w.start and w.days[-1] == epoch(date(2026, 2, 14))
    # At the boundary: a new cycle with today's bucket only.
    w = usage_window("billing_cycle", anchor, ts(2026, 2, 15))
    assert w.days == (epoch(date(2026, 2, 15)),) and w.end == epoch(date(2026, 3, 15))
    # Before the subscription starts nothing is counted.
    assert usage_window("billing_cycle", anchor, ts(2026, 1, 14, 12)).days == ()


def test_rolling_window_is_30_whole_utc_days_plus_today() -> None:
    now = ts(2026, 3, 1, 0, 0, 0)
    w = usage_window("rolling_30_days", date(2020, 1, 1), now)
    assert len(w.days) == 31
    assert w.days[-1] == epoch(date(2026, 3, 1))  # today counts
    assert w.days[0] == epoch(date(2026, 1, 30))  # 30 whole days before today
    # At least 30 × 24 h of history at any time of the day.
    assert now - w.start >= 30 * DAY
    assert w.start == w.days[0] and w.end == epoch(date(2026, 3, 2))
    # Through the day the window does not move; at 00:00Z it slides by one bucket.
    assert usage_window("rolling_30_days", date(2020, 1, 1), now + DAY - 1) == w
    slid = usage_window("rolling_30_days", date(2020, 1, 1), now + DAY)
    assert slid.days == (*w.days[1:], epoch(date(2026, 3, 2)))


def test_unknown_window_kind() -> None:
    with pytest.raises(ValueError, match="unknown window kind"):
        usage_window("weekly", date(2026, 1, 1), 0)
