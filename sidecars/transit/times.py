"""GTFS time arithmetic: service-day times past 24:00, the operational day, DST-aware Unix."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo


class BadTime(ValueError):
    """A GTFS time that is not `H:MM:SS`."""


def parse_time(text: str) -> int:
    """Seconds after the service day's noon-minus-12h for a GTFS `H:MM:SS` (hours may pass 24)."""
    parts = text.strip().split(":")
    if len(parts) != 3:
        raise BadTime(text)
    h, m, s = parts
    if not (h.isdigit() and m.isdigit() and s.isdigit() and len(m) == 2 and len(s) == 2):
        raise BadTime(text)
    minutes, seconds = int(m), int(s)
    if minutes > 59 or seconds > 59:
        raise BadTime(text)
    return int(h) * 3600 + minutes * 60 + seconds


def format_time(seconds: int) -> str:
    """`HH:MM:SS` for seconds since the start of the service day (hours may pass 24)."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


def time_24h(text: str) -> str:
    """The display form of a GTFS time: zero-padded, 24 subtracted once when the hour passes 23.

    The real service subtracts 24 once rather than taking a modulo, so `49:00:00` gives
    `25:00:00`; clients compare against it, so it is kept.
    """
    h, m, s = text.strip().split(":")
    hour = int(h)
    if hour >= 24:
        hour -= 24
    return f"{hour:02d}:{int(m):02d}:{int(s):02d}"


def yyyymmdd(day: date) -> str:
    """`YYYYMMDD` of a date."""
    return f"{day.year:04d}{day.month:02d}{day.day:02d}"


def parse_yyyymmdd(text: str) -> date:
    """The date of a `YYYYMMDD` string."""
    if len(text) != 8 or not text.isdigit():
        raise ValueError(f"not a YYYYMMDD date: {text!r}")
    return date(int(text[:4]), int(text[4:6]), int(text[6:]))


def parse_service_day(text: str) -> date:
    """A `?date=` service day: eight ASCII digits naming a calendar date (`00000000`,
    `20250230` and full-width digits are not one)."""
    if not (len(text) == 8 and text.isascii() and text.isdigit()):
        raise ValueError(f"not a YYYYMMDD date: {text!r}")
    return parse_yyyymmdd(text)


def operational_day(now: float, tz: ZoneInfo, start_hour: int) -> date:
    """The operational day at Unix time `now`: the local date, or the day before it before
    `start_hour` (04:00 by default: a bus at 01:30 still runs yesterday's timetable)."""
    local = datetime.fromtimestamp(now, tz)
    day = local.date()
    if local.hour < start_hour:
        day -= timedelta(days=1)
    return day


def days_around(op_day: date, span_days: int) -> list[date]:
    """The service days that can have a departure from the start of operational day
    `op_day` to the end of the next one (`next_horizon`): the days before it whose times run
    past 24:00 (`span_days` of them: a feed's latest time is under `span_days + 1` days), the
    day itself, and the two after it (the next day's own trips, and the early trips, 00:30,
    of the day after, which run before the next operational day ends)."""
    return [op_day + timedelta(days=k) for k in range(-max(1, span_days), 3)]


def next_horizon(op_day: date, start_hour: int, tz: ZoneInfo) -> int:
    """Unix end of the operational day after `op_day`: how far ahead "the next N" look."""
    return wall_clock_unix(op_day + timedelta(days=2), start_hour, tz)


def wall_clock_unix(day: date, hour: int, tz: ZoneInfo) -> int:
    """Unix seconds of a local wall-clock hour on a day."""
    return int(datetime(day.year, day.month, day.day, hour, tzinfo=tz).timestamp())


def day_origin(day: date, tz: ZoneInfo) -> int:
    """Unix seconds of a service day's time origin: noon minus 12 h, as the GTFS reference
    defines it. On the days the clocks change this is 23:00 or 01:00 wall-clock time, so
    times of the same trip stay as many seconds apart as the timetable says (25:30 and 26:30
    on the eve of a change are an hour apart, not 0 or 2)."""
    return int(datetime(day.year, day.month, day.day, 12, tzinfo=tz).timestamp()) - 43200


def service_time_unix(day: date, seconds: int, tz: ZoneInfo) -> int:
    """Unix seconds of a service time (seconds after the day's noon-minus-12h) on a day."""
    return day_origin(day, tz) + seconds


def clock_string(unix: int, day: date, tz: ZoneInfo) -> str:
    """`HH:MM:SS` of a Unix time as a service time of `day` (after midnight is 24+), on the
    same noon-minus-12h origin as the timetable, so an estimate reads like its
    `scheduled_arrival` on the days the clocks change too."""
    return format_time(unix - day_origin(day, tz))
