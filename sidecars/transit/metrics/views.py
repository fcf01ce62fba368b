"""The metrics endpoints' bodies, computed from the store's tables.

Two families, refreshed at different paces by `MetricsService`:
- *aggregate views* (demand, service, complaints) change only when records are ingested or the
  operational day turns, so they are encoded once per store generation and day;
- *videowall views* are "so far today" figures, recomputed every refresh tick.

"Today" is the operational day of the clock in the agency timezone, starting at 04:00 (the
same rule as the arrivals); "until now" means rides whose scheduled start (the
operational date plus the scheduled `H:MM:SS`, past 24:00 allowed) is at or before now, and
validations whose time is at or before now.
"""

from __future__ import annotations

import csv
import sqlite3
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

from ..network import natural_key
from .records import day_number, day_of
from .schemas import (
    ComplaintCounts,
    DatedQty,
    DemandDay,
    DemandMonth,
    DemandMonthRecord,
    DemandPeaks,
    DemandPeaksRecord,
    DemandRecord,
    PeakDayMonth,
    ServiceAll,
    ServiceDay,
    TopLines,
    TopLinesByAgency,
    Videowall,
)

NETWORK = "cm"
TOP_LINES = 3
SERVICE_DAYS = 14
DELAYED_SECONDS = 5 * 60


@dataclass(frozen=True, slots=True)
class CalendarDay:
    """Calendar attributes of a date shown in demand records."""

    day_type: str
    holiday: str
    period: str
    notes: str


class Calendar:
    """Day type, holiday and period of dates: from a CM `dates.txt` when one is configured,
    else the weekday alone (1 weekday, 2 Saturday, 3 Sunday; no holiday, no period)."""

    def __init__(self, dates_file: Path | None = None) -> None:
        self._days: dict[str, CalendarDay] = {}
        if dates_file is not None:
            with open(dates_file, encoding="utf-8-sig", newline="") as f:
                for row in csv.DictReader(f):
                    self._days[row["date"]] = CalendarDay(
                        day_type=row.get("day_type", "") or "",
                        holiday=row.get("holiday", "") or "0",
                        period=row.get("period", "") or "",
                        notes=row.get("description", "") or "",
                    )

    def entry(self, day: date, qty: int) -> DemandDay:
        """The demand-record entry of a day."""
        known = self._days.get(day.strftime("%Y%m%d"))
        if known is None:
            weekday = day.weekday()
            day_type = "1" if weekday < 5 else ("2" if weekday == 5 else "3")
            return DemandDay(day_type=day_type, holiday="0", notes="", period="", qty=qty)
        return DemandDay(
            day_type=known.day_type,
            holiday=known.holiday,
            notes=known.notes,
            period=known.period,
            qty=qty,
        )


def iso_ms(ts: float) -> str:
    """ISO 8601 UTC with milliseconds, as the real service's `generated_at`."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{int(ts * 1000) % 1000:03d}Z"
    )


@dataclass(slots=True)
class Aggregates:
    """The aggregate views of one store generation and operational day."""

    by_agency_day: list[DemandRecord]
    by_agency_month: list[DemandMonthRecord]
    by_agency_records: list[DemandPeaksRecord]
    by_line: list[DemandRecord]
    line_index: dict[str, DemandRecord]
    top_lines: TopLinesByAgency
    by_stop: list[DemandRecord]
    service: ServiceAll
    complaints: list[ComplaintCounts]


def _series(
    rows: list[tuple[str, int, int]],
    metric: str,
    key: str,
    description: str,
    generated: str,
    calendar: Calendar,
) -> list[DemandRecord]:
    grouped: dict[str, dict[str, DemandDay]] = defaultdict(dict)
    for owner, op_day, qty in rows:
        day = day_of(op_day)
        grouped[owner][day.isoformat()] = calendar.entry(day, qty)
    return [
        DemandRecord(
            _id=f"{metric}-{owner}",
            data=grouped[owner],
            description=description.format(owner),
            generated_at=generated,
            metric=metric,
            properties={key: owner},
        )
        for owner in sorted(grouped, key=natural_key)
    ]


def _peak(items: dict[str, int]) -> DatedQty:
    # Highest count; ties go to the earliest date, so a figure never jumps to a later equal day.
    if not items:
        return DatedQty(date="", qty=0)
    best = min(items.items(), key=lambda kv: (-kv[1], kv[0]))
    return DatedQty(date=best[0], qty=best[1])


def compute_aggregates(
    conn: sqlite3.Connection,
    today: date,
    since: date,
    now: float,
    calendar: Calendar,
    by_stop_days: int = 0,
) -> Aggregates:
    """Demand, service and complaints views from the store.

    Per-stop demand covers only the last `by_stop_days` operational days up to today (0: none,
    the real service's "in preparation" `[]`): a whole network's stops times every day since
    2024 would be hundreds of megabytes of JSON.
    """
    generated = iso_ms(now)
    first = day_number(since)
    stop_first = max(first, day_number(today) - by_stop_days + 1)
    per_agency = conn.execute(
        "SELECT agency, op_day, sum(qty) FROM demand_day WHERE op_day >= ? "
        "GROUP BY agency, op_day ORDER BY agency, op_day",
        (first,),
    ).fetchall()
    by_agency_day = _series(
        per_agency,
        "demand_by_agency_day",
        "agency_id",
        "Valid validations per operational day of agency {}",
        generated,
        calendar,
    )
    months: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    days_of: dict[str, dict[str, int]] = defaultdict(dict)
    for agency, op_day, qty in per_agency:
        day = day_of(op_day)
        months[agency][day.isoformat()[:7]] += qty
        days_of[agency][day.isoformat()] = qty
    by_agency_month = [
        DemandMonthRecord(
            _id=f"demand_by_agency_month-{agency}",
            data={m: DemandMonth(qty=q) for m, q in sorted(months[agency].items())},
            description=f"Valid validations per month of agency {agency}",
            generated_at=generated,
            metric="demand_by_agency_month",
            properties={"agency_id": agency},
        )
        for agency in sorted(months, key=natural_key)
    ]
    total_days: dict[str, int] = defaultdict(int)
    total_months: dict[str, int] = defaultdict(int)
    peaks: dict[str, PeakDayMonth] = {}
    for agency in sorted(days_of, key=natural_key):
        for d, q in days_of[agency].items():
            total_days[d] += q
        for m, q in months[agency].items():
            total_months[m] += q
        peaks[agency] = PeakDayMonth(day=_peak(days_of[agency]), month=_peak(months[agency]))
    records = (
        [
            DemandPeaksRecord(
                _id="demand_by_agency_records",
                data=DemandPeaks(
                    agencies=peaks,
                    total=PeakDayMonth(day=_peak(total_days), month=_peak(total_months)),
                ),
                description="Highest day and month of valid validations, per agency and total",
                generated_at=generated,
                metric="demand_by_agency_records",
                properties={},
            )
        ]
        if peaks
        else []
    )

    by_line = _series(
        conn.execute(
            "SELECT line, op_day, sum(qty) FROM demand_day WHERE op_day >= ? "
            "GROUP BY line, op_day ORDER BY line, op_day",
            (first,),
        ).fetchall(),
        "demand_by_line_day",
        "line_id",
        "Valid validations per operational day of line {}",
        generated,
        calendar,
    )
    line_index = {r.properties["line_id"]: r for r in by_line}
    by_stop = _series(
        conn.execute(
            "SELECT stop, op_day, sum(qty) FROM demand_day WHERE op_day BETWEEN ? AND ? "
            "GROUP BY stop, op_day ORDER BY stop, op_day",
            (stop_first, day_number(today)),
        ).fetchall()
        if by_stop_days > 0
        else [],
        "demand_by_stop_day",
        "stop_id",
        "Valid validations per operational day at stop {}",
        generated,
        calendar,
    )

    # Top lines: a line counts for each agency with validations on it, ranked by that agency's
    # total since `since`; ties go to the lower line id (natural order), so the list is stable.
    ranked: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for agency, line, qty in conn.execute(
        "SELECT agency, line, sum(qty) FROM demand_day WHERE op_day >= ? GROUP BY agency, line",
        (first,),
    ):
        ranked[agency].append((qty, line))
    top = {}
    for agency in sorted(ranked, key=natural_key):
        best = sorted(ranked[agency], key=lambda ql: (-ql[0], natural_key(ql[1])))[:TOP_LINES]
        top[agency] = TopLines(lines=[line_index[line] for _, line in best if line in line_index])
    top_lines = TopLinesByAgency(
        lastUpdated=by_line[0].generated_at if by_line else None, topLinesByAgency=top
    )

    return Aggregates(
        by_agency_day=by_agency_day,
        by_agency_month=by_agency_month,
        by_agency_records=records,
        by_line=by_line,
        line_index=line_index,
        top_lines=top_lines,
        by_stop=by_stop,
        service=service_all(conn, today),
        complaints=complaints(conn, since),
    )


def service_all(conn: sqlite3.Connection, today: date) -> ServiceAll:
    """Rides per agency, line and operational day over the 14 complete days before today.

    A ride passes when it passed either check (one validation transaction, or the three
    events); today is left out because its rides are still running.
    """
    last = day_number(today) - 1
    rows = conn.execute(
        "SELECT agency, line, op_day, count(*), sum(one OR three) FROM rides "
        "WHERE op_day BETWEEN ? AND ? GROUP BY agency, line, op_day",
        (last - SERVICE_DAYS + 1, last),
    ).fetchall()
    rows.sort(key=lambda r: (-r[2], natural_key(r[0]), natural_key(r[1])))
    return ServiceAll(
        data=[
            ServiceDay(
                agency_id=agency,
                line_id=line,
                operational_date=day_of(op_day).strftime("%Y%m%d"),
                pass_trip_count=passed,
                pass_trip_percentage=round(100.0 * passed / total, 2),
                total_trip_count=total,
            )
            for agency, line, op_day, total, passed in rows
        ]
    )


def complaints(conn: sqlite3.Connection, since: date) -> list[ComplaintCounts]:
    """Counts by category and channel per line, per municipality and for the whole network."""
    select = (
        "SELECT {key}, sum(category = 'complaint'), sum(channel = 'email'), "
        "sum(category = 'info_request'), max(day), sum(category = 'other'), "
        "sum(channel = 'phone'), count(*) FROM complaints WHERE day >= ? {where} GROUP BY 1"
    )
    out: list[ComplaintCounts] = []
    first = day_number(since)
    for kind, key, where in (
        ("line", "line", "AND line != ''"),
        ("municipality", "municipality", "AND municipality != ''"),
        ("global", "'all'", ""),
    ):
        rows = conn.execute(select.format(key=key, where=where), (first,)).fetchall()
        for value, compl, email, info, last, other, phone, total in sorted(
            rows, key=lambda r: natural_key(r[0])
        ):
            out.append(
                ComplaintCounts(
                    _id=f"{kind}-{value}",
                    complaints=compl,
                    email=email,
                    filter_value=value,
                    info_requests=info,
                    last_update=day_of(last).strftime("%Y%m%d"),
                    other=other,
                    phone=phone,
                    total=total,
                    type=kind,
                )
            )
    return out


def is_network(agency: str) -> bool:
    """Whether an agency id spells the network key in another case (Carris Metropolitana's
    feed names its single agency `CM`): its figures are the network's, under `_cm_` only, so
    no key exists twice in two spellings."""
    return agency != NETWORK and agency.lower() == NETWORK


def _keyed(per_agency: dict[str, dict[str, float | int]]) -> dict[str, float | int]:
    data: dict[str, float | int] = {}
    for agency in sorted(per_agency, key=lambda a: (a == NETWORK, natural_key(a))):
        if is_network(agency):
            continue
        for measure, value in per_agency[agency].items():
            data[f"_{agency}_{measure}"] = value
    return data


def _with_total(rows: list[tuple], measures: tuple[str, ...]) -> dict[str, dict[str, float | int]]:
    out: dict[str, dict[str, float | int]] = {}
    total = [0] * len(measures)
    for agency, *values in rows:
        out[agency] = {m: (v or 0) for m, v in zip(measures, values, strict=True)}
        total = [t + (v or 0) for t, v in zip(total, values, strict=True)]
    out[NETWORK] = dict(zip(measures, total, strict=True))
    return out


def videowall(
    conn: sqlite3.Connection, today: date, now: float, agencies: Iterable[str] = ()
) -> dict[str, Videowall]:
    """The five videowall views for the operational day `today` as of Unix time `now`;
    every agency of `agencies` (the feed's) has its keys, zero until it has data."""
    stamp = int(now * 1000)
    d = day_number(today)
    t = int(now)

    rows = conn.execute(
        "SELECT agency, avg(delay), sum(delay > ?), count(*) FROM rides "
        "WHERE op_day = ? AND start_unix <= ? AND delay IS NOT NULL GROUP BY agency",
        (DELAYED_SECONDS, d, t),
    ).fetchall()
    delays: dict[str, dict[str, float | int]] = {}
    n_all = sum_all = late_all = 0
    for agency, avg, late, n in rows:
        delays[agency] = {
            "average_delay_minutes": round(avg / 60.0, 2),
            "delayed_for_more_than_five_minutes_count": late,
            "total_until_now_count": n,
        }
        n_all += n
        late_all += late
        sum_all += avg * n
    delays[NETWORK] = {
        "average_delay_minutes": round(sum_all / n_all / 60.0, 2) if n_all else 0,
        "delayed_for_more_than_five_minutes_count": late_all,
        "total_until_now_count": n_all,
    }

    # Emptiness is only known once a ride has ended, so this view shows the last complete
    # operational day (yesterday), not today so far.
    empty = _with_total(
        conn.execute(
            "SELECT agency, sum(empty), round(sum(CASE WHEN empty THEN dvkm ELSE 0 END), 3) "
            "FROM rides WHERE op_day = ? GROUP BY agency",
            (d - 1,),
        ).fetchall(),
        ("empty_rides_count", "empty_rides_vkm"),
    )

    sla = _with_total(
        conn.execute(
            "SELECT agency, count(*), sum(start_unix <= :t), "
            "sum(start_unix <= :t AND NOT one), sum(start_unix <= :t AND NOT three), "
            "sum(start_unix <= :t AND NOT one AND NOT three) FROM rides WHERE op_day = :d "
            "GROUP BY agency",
            {"t": t, "d": d},
        ).fetchall(),
        (
            "scheduled_rides_total",
            "scheduled_rides_until_now",
            "simple_one_validation_transaction_fail_until_now",
            "simple_three_events_fail_until_now",
            "simple_three_events_or_simple_one_validation_transaction_fail_until_now",
        ),
    )

    # Same weekday last week up to the same moment, so the two counters compare like for like.
    week = dict(
        conn.execute(
            "SELECT agency, sum(valid) FROM validations WHERE op_day = ? AND t <= ? "
            "GROUP BY agency",
            (d - 7, t - 7 * 86400),
        ).fetchall()
    )
    now_counts = dict(
        conn.execute(
            "SELECT agency, sum(valid) FROM validations WHERE op_day = ? AND t <= ? "
            "GROUP BY agency",
            (d, t),
        ).fetchall()
    )
    validations = _with_total(
        [(a, week.get(a, 0), now_counts.get(a, 0)) for a in set(week) | set(now_counts)],
        ("last_week_valid_count", "today_valid_count"),
    )

    vkm_rows = conn.execute(
        "SELECT agency, round(sum(svkm), 3), round(sum(CASE WHEN one THEN svkm ELSE 0 END), 3), "
        "round(sum(CASE WHEN one OR three THEN svkm ELSE 0 END), 3), "
        "round(sum(CASE WHEN three THEN svkm ELSE 0 END), 3) "
        "FROM rides WHERE op_day = ? AND start_unix <= ? GROUP BY agency",
        (d, t),
    ).fetchall()
    vkm = _with_total(
        vkm_rows,
        (
            "scheduled_vkm_until_now",
            "simple_one_validation_transaction_vkm_until_now",
            "simple_three_events_or_simple_one_validation_transaction_vkm_until_now",
            "simple_three_events_vkm_until_now",
        ),
    )
    for measures in vkm.values():
        for k, v in measures.items():
            measures[k] = round(float(v), 3)
    for measures in empty.values():
        measures["empty_rides_vkm"] = round(float(measures["empty_rides_vkm"]), 3)

    views = (delays, empty, sla, validations, vkm)
    for agency in agencies:
        for view in views:
            if agency not in view:
                view[agency] = {measure: 0 for measure in view[NETWORK]}
    return {
        name: Videowall(data=_keyed(view), timestamp_resource=stamp)
        for name, view in (
            ("delays", delays),
            ("empty-rides", empty),
            ("sla", sla),
            ("validations", validations),
            ("vkm", vkm),
        )
    }
