"""`/v2/dates`, `/v2/periods` and `/v2/plans`: the served feed's service days, school
periods and plan, in the real service's shapes.

Carris Metropolitana's feed carries `dates.txt` (date, period, day_type, holiday,
description) and `periods.txt` (period_id, period_name); they are served as they are. A plain
GTFS feed has neither: its dates are the days any service runs, with the day type of the
weekday (1 weekday, 2 Saturday, 3 Sunday, as CM numbers them), not a holiday, no period; it
has no periods. The plan is the feed version served, per agency, valid over feed_info's dates
(else the span of its service days).
"""

from __future__ import annotations

from datetime import date, timedelta

from msgspec import Struct

from .bodies import Body
from .network import Network
from .schemas import json_encoder
from .times import parse_yyyymmdd


class ServiceDate(Struct):
    """One day of `/v2/dates`."""

    date: str
    day_type: str
    description: str
    holiday: str
    period: str


class DateRange(Struct):
    """A run of consecutive days, `YYYYMMDD` both ends included."""

    start: str
    end: str


class Period(Struct):
    """One period of `/v2/periods`: its days and their consecutive runs."""

    id: str
    name: str
    valid_on: list[str]
    valid_ranges: list[DateRange]


class Plan(Struct):
    """One plan of `/v2/plans`: the feed version an agency runs, and when it is valid."""

    agency_id: str
    id: str
    valid_range: DateRange


def _day_type(day: date) -> str:
    return "1" if day.weekday() < 5 else "2" if day.weekday() == 5 else "3"


def service_dates(net: Network) -> list[ServiceDate]:
    """`dates.txt` when the feed has it, else every day a service runs."""
    rows = net.raw.extras.get("dates.txt")
    if rows is not None:
        out = [
            ServiceDate(
                date=r.get("date", ""),
                day_type=r.get("day_type", ""),
                description=r.get("description", ""),
                holiday=r.get("holiday", ""),
                period=r.get("period", ""),
            )
            for r in rows
            if r.get("date")
        ]
        return sorted(out, key=lambda d: d.date)
    days = sorted({d for dates in net.raw.service_dates for d in dates})
    return [
        ServiceDate(
            date=d, day_type=_day_type(parse_yyyymmdd(d)), description="", holiday="0", period=""
        )
        for d in days
    ]


def ranges(days: list[str]) -> list[DateRange]:
    """Consecutive runs of sorted `YYYYMMDD` days."""
    out: list[DateRange] = []
    previous: date | None = None
    for text in days:
        try:
            day = parse_yyyymmdd(text)
        except ValueError:
            continue
        if previous is not None and day == previous + timedelta(days=1):
            out[-1].end = text
        else:
            out.append(DateRange(start=text, end=text))
        previous = day
    return out


def periods(net: Network) -> list[Period]:
    """`periods.txt` with the days `dates.txt` gives each period."""
    names = net.raw.extras.get("periods.txt") or []
    by_period: dict[str, list[str]] = {}
    for d in service_dates(net) if "dates.txt" in net.raw.extras else []:
        by_period.setdefault(d.period, []).append(d.date)
    out = []
    for row in names:
        pid = row.get("period_id", "")
        days = sorted(by_period.get(pid, []))
        out.append(
            Period(
                id=pid, name=row.get("period_name", ""), valid_on=days, valid_ranges=ranges(days)
            )
        )
    return out


def plans(net: Network) -> list[Plan]:
    """The served version per agency."""
    info = (net.raw.extras.get("feed_info.txt") or [{}])[0]
    days = sorted({d for dates in net.raw.service_dates for d in dates})
    start = info.get("feed_start_date") or (days[0] if days else "")
    end = info.get("feed_end_date") or (days[-1] if days else "")
    version = info.get("feed_version") or net.version
    span = DateRange(start=start, end=end)
    return [Plan(agency_id=a, id=version, valid_range=span) for a in net.agency_ids]


def plan_bodies(net: Network) -> dict[str, Body]:
    """The three bodies of one feed version."""
    return {
        "dates": Body(json_encoder.encode(service_dates(net))),
        "periods": Body(json_encoder.encode(periods(net))),
        "plans": Body(json_encoder.encode(plans(net))),
    }
