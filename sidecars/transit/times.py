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


def operational_day(now: float, tz: ZoneInfo, start_hour: int) -> date:
    """The operational day at Unix time `now`: the local date, or the day before it before
    `start_hour` (04:00 by default: a bus at 01:30 still runs yesterday's timetable)."""
    local = datetime.fromtimestamp(now, tz)
    day = local.date()
    if local.hour < start_hour:
        day -= timedelta(days=1)
    return day


def service_time_unix(day: date, seconds: int, tz: ZoneInfo) -> int:
    """Unix seconds of a service time on the given day, on the local wall clock.

    `25:10:00` on day D is 01:10 local on D+1; the offset is the one in force at that wall
    time, so the result is right on DST change days (a wall time skipped by the spring change
    is read with the offset before it, as zoneinfo's fold=0 does).
    """
    days, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    if days:
        day = day + timedelta(days=days)
    return int(datetime(day.year, day.month, day.day, h, m, s, tzinfo=tz).timestamp())


def clock_string(unix: int, day: date, tz: ZoneInfo) -> str:
    """`HH:MM:SS` of a Unix time relative to the operational day (after midnight is 24+)."""
    local = datetime.fromtimestamp(unix, tz)
    offset_days = (local.date() - day).days
    return format_time(offset_days * 86400 + local.hour * 3600 + local.minute * 60 + local.second)
