"""Service-day time arithmetic: past-24:00 times, the 04:00 operational day, DST."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecars.transit.times import (
    BadTime,
    clock_string,
    format_time,
    operational_day,
    parse_time,
    service_time_unix,
    time_24h,
)

from ..helpers import BRISBANE, LISBON, local_ts


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6:00:00", 21600), ("06:00:00", 21600), ("24:05:00", 86700), ("29:39:00", 106740)],
)
def test_parse_time_accepts_single_digit_hours_and_hours_past_24(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["", "6:00", "06:60:00", "aa:00:00", "06:0:00", "-1:00:00"])
def test_parse_time_rejects_malformed(text: str) -> None:
    with pytest.raises(BadTime):
        parse_time(text)


@pytest.mark.parametrize(
    ("text", "display"),
    [
        ("6:00:00", "06:00:00"),
        ("23:59:59", "23:59:59"),
        ("24:05:00", "00:05:00"),
        ("25:10:00", "01:10:00"),
        # The real service subtracts 24 once, not modulo 24.
        ("49:00:00", "25:00:00"),
    ],
)
def test_arrival_time_24h(text: str, display: str) -> None:
    assert time_24h(text) == display


def test_operational_day_starts_at_four_local_time() -> None:
    assert operational_day(local_ts("2026-03-27T03:59:59"), LISBON, 4) == date(2026, 3, 26)
    assert operational_day(local_ts("2026-03-27T04:00:00"), LISBON, 4) == date(2026, 3, 27)
    assert operational_day(local_ts("2026-03-27T00:00:00"), LISBON, 4) == date(2026, 3, 26)
    assert operational_day(local_ts("2026-03-27T23:59:00"), LISBON, 4) == date(2026, 3, 27)
    # The same instant is a different operational day in another zone.
    instant = utc("2014-06-09T17:30:00")  # 03:30 on the 10th in Brisbane (UTC+10)
    assert operational_day(instant, BRISBANE, 4) == date(2014, 6, 9)
    assert operational_day(instant + 1800, BRISBANE, 4) == date(2014, 6, 10)
    assert operational_day(local_ts("2026-03-27T02:00"), LISBON, 0) == date(2026, 3, 27)


def test_service_time_unix_past_midnight_is_next_calendar_day() -> None:
    day = date(2026, 3, 26)  # WET, UTC+0
    assert service_time_unix(day, parse_time("25:10:00"), LISBON) == utc("2026-03-27T01:10:00")
    assert service_time_unix(day, parse_time("08:00:00"), LISBON) == utc("2026-03-26T08:00:00")


def test_service_time_unix_spring_dst_change() -> None:
    # Lisbon goes from 01:00 WET to 02:00 WEST on 2026-03-29.
    before = date(2026, 3, 28)
    assert service_time_unix(before, parse_time("10:00:00"), LISBON) == utc("2026-03-28T10:00:00")
    assert service_time_unix(date(2026, 3, 29), parse_time("10:00:00"), LISBON) == utc(
        "2026-03-29T09:00:00"
    )
    # Times count from noon minus 12 h (00:00 WET on the 28th): 26:30 is 26.5 h later, 03:30
    # WEST on the 29th by the clock, and 25:30 an hour before it (02:30 WEST).
    assert service_time_unix(before, parse_time("26:30:00"), LISBON) == utc("2026-03-29T02:30:00")
    assert service_time_unix(before, parse_time("25:30:00"), LISBON) == utc("2026-03-29T01:30:00")


def test_service_time_unix_autumn_dst_change() -> None:
    # Lisbon goes from 02:00 WEST back to 01:00 WET on 2026-10-25.
    day = date(2026, 10, 24)
    assert service_time_unix(day, parse_time("24:30:00"), LISBON) == utc("2026-10-24T23:30:00")
    # Noon minus 12 h of the 24th is 23:00 UTC on the 23rd (00:00 WEST): 26:30 is 01:30 UTC
    # (01:30 WET, the second 01:30 of the night), an hour after 25:30 (01:30 WEST).
    assert service_time_unix(day, parse_time("26:30:00"), LISBON) == utc("2026-10-25T01:30:00")
    assert service_time_unix(day, parse_time("25:30:00"), LISBON) == utc("2026-10-25T00:30:00")
    assert service_time_unix(date(2026, 10, 25), parse_time("12:00:00"), LISBON) == utc(
        "2026-10-25T12:00:00"
    )


def test_clock_string_is_relative_to_the_operational_day() -> None:
    day = date(2026, 3, 26)
    assert clock_string(utc("2026-03-26T08:03:04"), day, LISBON) == "08:03:04"
    assert clock_string(utc("2026-03-27T01:10:00"), day, LISBON) == "25:10:00"


@given(st.integers(min_value=0, max_value=47 * 3600 + 59 * 60 + 59))
def test_format_and_parse_round_trip(seconds: int) -> None:
    text = format_time(seconds)
    assert parse_time(text) == seconds
    display = time_24h(text)
    assert parse_time(display) == (seconds - 86400 if seconds >= 86400 else seconds)
