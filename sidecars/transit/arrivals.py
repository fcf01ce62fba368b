"""Arrivals (by stop, by pattern) and PIP panel estimates.

A service day's trips do not stay inside its calendar day: `25:30:00` runs after midnight,
while the next service day's `00:30:00` trips run before the operational day that shows them
starts (04:00). What can still come "now" is therefore taken from every service day that can
have a departure during the operational day (`times.days_around`), each row keeping its own
service day (for its times, its TripUpdate and its cancellation).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Collection
from datetime import date, datetime, timedelta
from functools import partial
from typing import Any, NamedTuple

from .network import Network
from .realtime import Realtime
from .schemas import Arrival, PatternArrival, PipEstimate
from .times import clock_string, days_around, next_horizon, service_time_unix, wall_clock_unix
from .tripupdates import CANCELED, SCHEDULED, SKIPPED, trip_headsign

PIP_MAX_ROWS = 8
# How late a trip may run and still be looked at for a panel (TripUpdates), and how early.
PIP_LATE_SECONDS = 3 * 3600
PIP_EARLY_SECONDS = 30 * 60
# Panel rows the real service sends for its special stop ids and when nothing is coming.
PIP_TEST = (
    PipEstimate(estimatedTimeString="TEST", lineId="0000", stopHeadsign="Olá :)"),
    PipEstimate(estimatedTimeString="›››"),
)
PIP_NO_SERVICE_INFO = (
    PipEstimate(
        estimatedTimeString="1 min",
        lineId="INFO",
        stopHeadsign="Sem estimativas. Consulte site para +info.",
    ),
)
PIP_DEACTIVATED = (
    PipEstimate(estimatedTimeString="", lineId="INFO", stopHeadsign="Paragem desativada."),
    PipEstimate(estimatedTimeString="", lineId="INFO", stopHeadsign="Painel inativo."),
)
PIP_EMPTY = (
    PipEstimate(
        estimatedTimeString="1 min", lineId="INFO", stopHeadsign="Sem estimativas em tempo real."
    ),
    PipEstimate(
        estimatedTimeString="1 min",
        journeyId="0000_0_1|teste",
        lineId="INFO",
        observedVehicleId="0001",
        patternId="0000_0_1",
        stopHeadsign="Consulte o site para +info.",
    ),
)
PIP_SPECIAL = {"000000": PIP_TEST, "000001": PIP_NO_SERVICE_INFO, "no-service": PIP_DEACTIVATED}


class Scheduled(NamedTuple):
    """One scheduled arrival with everything the response needs that realtime cannot change.
    An added trip's arrival (from a TripUpdate) has `trip` -1 and `position` -1 - its index
    in `Realtime.added`."""

    unix: int
    trip_id: str
    position: int
    trip: int
    time: str
    stop_sequence: int
    headsign: str
    line_id: str
    pattern_id: str | None
    route_id: str
    stop_id: str
    day: date  # the service day whose timetable the row is from
    # An added trip's estimate (its time as the TripUpdate gives it; `unix` is its
    # timetable where it has one, a DUPLICATED copy's shifted times).
    estimate: int | None = None


def scheduled_rows(net: Network, positions: list[int], day: date) -> list[Scheduled]:
    """The scheduled arrivals at some stop_time positions on a service day, in time order.

    Callers memoise this per (stop or pattern, day) with `Network.day_memo`: it is the costly
    part of an arrivals request and does not depend on realtime.
    """
    raw = net.raw
    tz = net.tz
    st_trip, st_time, st_seq, st_stop = raw.st_trip, raw.st_time, raw.st_seq, raw.st_stop
    times, seconds, trip_ids = raw.time_strings, raw.time_seconds, raw.trip_ids
    unix_of: dict[int, int] = {}
    rows = []
    for p in positions:
        ti = st_trip[p]
        tid = st_time[p]
        unix = unix_of.get(tid)
        if unix is None:
            unix = unix_of[tid] = service_time_unix(day, seconds[tid], tz)
        rows.append(
            Scheduled(
                unix,
                trip_ids[ti],
                p,
                ti,
                times[tid],
                st_seq[p],
                trip_headsign(net, ti),
                net.trip_line[ti],
                net.trip_pattern[ti],
                net.pattern_route[net.trip_pattern[ti]],
                raw.stop_ids[st_stop[p]],
                day,
            )
        )
    rows.sort()
    return rows


def stop_schedule(net: Network, stop: int, day: date) -> list[Scheduled]:
    """A stop's scheduled arrivals on a service day, memoised per feed version."""
    return net.day_memo(
        ("stop", stop, day), lambda: scheduled_rows(net, net.stop_arrivals(stop, day), day)
    )


def schedule_now(
    net: Network,
    key: tuple,
    positions: Callable[[date], list[int]],
    op_day: date,
    start_hour: int,
) -> list[Scheduled]:
    """The scheduled rows of every service day that can have a departure from operational
    day `op_day` to the end of the next one (`positions(day)`: a stop's or a pattern's
    stop_time positions on a day), in one time order up to that end (so no later day's row
    is missing before the last one); memoised per (stop or pattern, operational day)."""

    def merged() -> list[Scheduled]:
        days = days_around(op_day, net.span_days)
        horizon = next_horizon(op_day, start_hour, net.tz)
        return sorted(
            r for d in days for r in scheduled_rows(net, positions(d), d) if r.unix < horizon
        )

    return net.day_memo((*key, "now", op_day), merged)


def in_operational_day(
    net: Network, rows: list[Scheduled], op_day: date, start_hour: int, key: tuple | None = None
) -> list[Scheduled]:
    """The rows an operational day shows: its own service day's, and those of the other
    service days that run inside it (the next day's trips before `start_hour`, the previous
    days' past `24 + start_hour`); memoised per `key` (stop or pattern) when given."""

    def window() -> list[Scheduled]:
        start = wall_clock_unix(op_day, start_hour, net.tz)
        end = wall_clock_unix(op_day + timedelta(days=1), start_hour, net.tz)
        return [r for r in rows if r.day == op_day or start <= r.unix < end]

    return window() if key is None else net.day_memo((*key, "window", op_day), window)


def added_rows(
    net: Network,
    rt: Realtime,
    days: Collection[date],
    stop: int | None = None,
    pattern_id: str | None = None,
) -> list[Scheduled]:
    """Arrivals of the ADDED / NEW trips of the TripUpdates on some service days, at a stop
    or of a pattern."""
    rows = []
    raw = net.raw
    for k, added in enumerate(rt.added):
        if added.day not in days or (pattern_id is not None and added.pattern_id != pattern_id):
            continue
        route = added.route
        route_id = raw.routes[route].route_id if route is not None else ""
        line_id = net.route_line(route) if route is not None else ""
        for a in added.stops:
            if stop is not None and a.stop != stop:
                continue
            rows.append(
                Scheduled(
                    a.scheduled,
                    added.trip_id,
                    -1 - k,
                    -1,
                    clock_string(a.scheduled, added.day, net.tz),
                    a.stop_sequence,
                    added.headsign,
                    line_id,
                    added.pattern_id,
                    route_id,
                    raw.stop_ids[a.stop],
                    added.day,
                    a.unix,
                )
            )
    return rows


def with_added(rows: list[Scheduled], added: list[Scheduled]) -> list[Scheduled]:
    """The scheduled rows and the added trips' in one time order."""
    return sorted([*rows, *added]) if added else rows


def build_arrivals(
    net: Network,
    rt: Realtime,
    rows: list[Scheduled],
    now: float,
    with_stop: bool,
    limit: int | None = None,
) -> list[Arrival] | list[PatternArrival]:
    """The response rows: scheduled arrivals with what the TripUpdates say of them (estimate,
    cancelled, skipped; deleted trips left out), added trips, and observed times. With
    `limit`, only the next `limit` arrivals from `now` (by estimate, else schedule)."""
    tz = net.tz
    realtime = rt.has_trips
    first = net.raw.trip_first
    out: list[Any] = []
    if limit is not None:
        # A bus may run late by hours: start well before now, then keep what is still to come.
        rows = rows[bisect.bisect_left(rows, now - PIP_LATE_SECONDS, key=lambda r: r.unix) :]
    for r in rows:
        estimate = observed = None
        vehicle = None
        relationship = SCHEDULED
        if r.trip < 0:
            added = rt.added[-1 - r.position]
            relationship, vehicle = added.relationship, added.vehicle
            estimate = r.estimate if r.estimate is not None else r.unix
            observed = estimate if estimate <= now else None
        elif realtime:
            if rt.deleted(r.trip_id, r.day):
                continue
            trip = rt.estimates(net, r.trip, r.day) if rt.updates else None
            if trip is not None:
                k = r.position - first[r.trip]
                relationship = (
                    CANCELED if trip.canceled else SKIPPED if not trip.served[k] else SCHEDULED
                )
                estimate = trip.times[k]
                if estimate is not None:
                    passed = rt.passed_sequence(r.trip_id)
                    if estimate <= now or (passed is not None and r.stop_sequence < passed):
                        observed = estimate
            vehicle = rt.trip_vehicle(r.trip_id)
        if limit is not None:
            if (estimate if estimate is not None else r.unix) < now or observed is not None:
                continue
            if len(out) == limit:
                break
        estimated_text = clock_string(estimate, r.day, tz) if estimate is not None else None
        observed_text = clock_string(observed, r.day, tz) if observed is not None else None
        fields: dict[str, Any] = {
            "estimated_arrival": estimated_text,
            "estimated_arrival_unix": estimate,
            "headsign": r.headsign,
            "line_id": r.line_id,
            "observed_arrival": observed_text,
            "observed_arrival_unix": observed,
            "pattern_id": r.pattern_id,
            "route_id": r.route_id,
            "schedule_relationship": relationship,
            "scheduled_arrival": r.time,
            "scheduled_arrival_unix": r.unix,
            "stop_sequence": r.stop_sequence,
            "trip_id": r.trip_id,
            "vehicle_id": vehicle,
        }
        # A pattern's arrivals span its stops, so each names its stop; a stop's do not.
        out.append(PatternArrival(stop_id=r.stop_id, **fields) if with_stop else Arrival(**fields))
    return out


def pip_estimates(
    net: Network, rt: Realtime, stops: list[str], op_day: date, now: float, start_hour: int
) -> list[PipEstimate]:
    """What a passenger information panel shows for some stops: the next 8 departures
    (realtime when known, else scheduled) of every service day that can still have one,
    skipping trips that end at the stop."""
    days = days_around(op_day, net.span_days)
    raw = net.raw
    tz = net.tz
    rows: list[PipEstimate] = []
    # Scheduled rows before now are never shown; with TripUpdates a late bus may still come.
    since = now - PIP_LATE_SECONDS if rt.updates else now
    for stop_id in stops:
        stop = net.stop_index.get(stop_id)
        if stop is None:
            continue
        schedule = with_added(
            schedule_now(net, ("stop", stop), partial(net.stop_arrivals, stop), op_day, start_hour),
            added_rows(net, rt, days, stop),
        )
        start = bisect.bisect_left(schedule, since, key=lambda r: r.unix)
        # The panel shows the 8 soonest: once this stop has 8 rows, a trip scheduled later
        # than the 8th by more than PIP_EARLY_SECONDS cannot be among them (a bus runs early
        # by minutes, not that much), so the rest of the day is not looked at.
        soonest: list[int] = []  # the 8 smallest times of this stop's rows, negated (a heap)
        for r in itertools.islice(schedule, start, None):
            if len(soonest) == PIP_MAX_ROWS and r.unix > -soonest[0] + PIP_EARLY_SECONDS:
                break
            ti = r.trip
            timetabled = r.time
            scheduled = r.unix
            trip_id = r.trip_id
            if ti < 0:
                # An added trip: its time is the estimate; its last stop is not shown.
                added = rt.added[-1 - r.position]
                if any(a.last and a.stop == stop for a in added.stops):
                    continue
                estimate: int | None = r.estimate
            else:
                first = raw.trip_first[ti]
                if r.position == first + raw.trip_count[ti] - 1:
                    continue
                if rt.deleted(trip_id, r.day):
                    continue
                trip = rt.estimates(net, ti, r.day) if rt.updates else None
                k = r.position - first
                # A cancelled trip or a skipped stop is not coming: not on the panel.
                if trip is not None and (trip.canceled or not trip.served[k]):
                    continue
                estimate = trip.times[k] if trip is not None else None
            common = dict(
                lineId=r.line_id,
                patternId=r.pattern_id or "",
                stopHeadsign=r.headsign,
                timetabledArrivalTime=timetabled,
                timetabledDepartureTime=timetabled,
            )
            if estimate is not None:
                if estimate < now:
                    continue
                minutes = int(estimate - now) // 60
                at = datetime.fromtimestamp(estimate, tz).strftime("%H:%M:%S")
                _keep(soonest, estimate)
                rows.append(
                    PipEstimate(
                        estimatedArrivalTime=at,
                        estimatedDepartureTime=at,
                        estimatedTimeString="A chegar" if minutes < 1 else f"\u2022 {minutes} min",
                        estimatedTimeUnixSeconds=estimate,
                        journeyId=trip_id,
                        observedVehicleId=rt.trip_vehicle(trip_id),
                        **common,
                    )
                )
            else:
                minutes = int(scheduled - now) // 60
                if minutes <= 0:
                    continue
                _keep(soonest, scheduled)
                rows.append(
                    PipEstimate(
                        estimatedArrivalTime=timetabled,
                        estimatedDepartureTime=timetabled,
                        estimatedTimeString=datetime.fromtimestamp(scheduled, tz).strftime("%H:%M"),
                        estimatedTimeUnixSeconds=scheduled,
                        journeyId=None,
                        observedVehicleId=None,
                        **common,
                    )
                )
    rows.sort(key=lambda r: r.estimatedTimeUnixSeconds)
    return rows[:PIP_MAX_ROWS] or list(PIP_EMPTY)


def _keep(soonest: list[int], unix: int) -> None:
    """Track the PIP_MAX_ROWS smallest times (a max-heap of negated values)."""
    if len(soonest) < PIP_MAX_ROWS:
        heapq.heappush(soonest, -unix)
    elif unix < -soonest[0]:
        heapq.heapreplace(soonest, -unix)
