"""Arrivals for one operational day (by stop, by pattern) and PIP panel estimates."""

from __future__ import annotations

from datetime import date, datetime

from sidecars.schemas import Arrival, PatternArrival, PipEstimate

from .network import Network
from .realtime import Realtime
from .times import clock_string, service_time_unix

PIP_MAX_ROWS = 8
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


def _headsign(net: Network, trip: int) -> str:
    raw = net.raw
    headsign = raw.trip_headsign[trip]
    if headsign:
        return headsign
    # Feeds without trip_headsign (the Google sample): name the trip's last stop.
    last = raw.trip_first[trip] + raw.trip_count[trip] - 1
    return raw.stops[raw.st_stop[last]].name


def build_arrivals(
    net: Network,
    rt: Realtime,
    positions: list[int],
    day: date,
    now: float,
    with_stop: bool,
) -> list[Arrival] | list[PatternArrival]:
    """One arrival per stop_time position, realtime merged, sorted by scheduled time."""
    raw = net.raw
    tz = net.tz
    st_trip, st_time, st_seq, st_stop = raw.st_trip, raw.st_time, raw.st_seq, raw.st_stop
    times, seconds = raw.time_strings, raw.time_seconds
    rows = []
    for p in positions:
        ti = st_trip[p]
        tid = st_time[p]
        scheduled = service_time_unix(day, seconds[tid], tz)
        trip_id = raw.trip_ids[ti]
        estimate = observed = None
        estimates = rt.estimates(net, ti, day) if rt.updates else None
        seq = st_seq[p]
        if estimates is not None:
            estimate = estimates[p - raw.trip_first[ti]]
            if estimate is not None:
                passed = rt.passed_sequence(trip_id)
                if estimate <= now or (passed is not None and seq < passed):
                    observed = estimate
        rows.append((scheduled, trip_id, p, ti, tid, seq, estimate, observed))
    rows.sort()
    out = []
    cls = PatternArrival if with_stop else Arrival
    for scheduled, trip_id, p, ti, tid, seq, estimate, observed in rows:
        fields = dict(
            estimated_arrival=clock_string(estimate, day, tz) if estimate is not None else None,
            estimated_arrival_unix=estimate,
            headsign=_headsign(net, ti),
            line_id=net.trip_line[ti],
            observed_arrival=clock_string(observed, day, tz) if observed is not None else None,
            observed_arrival_unix=observed,
            pattern_id=net.trip_pattern[ti],
            route_id=raw.routes[raw.trip_route[ti]].route_id,
            scheduled_arrival=times[tid],
            scheduled_arrival_unix=scheduled,
            stop_sequence=seq,
            trip_id=trip_id,
            vehicle_id=rt.trip_vehicle(trip_id) if rt.updates or rt.positions else None,
        )
        if with_stop:
            fields["stop_id"] = raw.stop_ids[st_stop[p]]
        out.append(cls(**fields))
    return out


def pip_estimates(
    net: Network, rt: Realtime, stops: list[str], day: date, now: float
) -> list[PipEstimate]:
    """What a passenger information panel shows for some stops: the next 8 departures
    (realtime when known, else scheduled), skipping trips that end at the stop."""
    raw = net.raw
    tz = net.tz
    rows: list[PipEstimate] = []
    for stop_id in stops:
        stop = net.stop_index.get(stop_id)
        if stop is None:
            continue
        for p in net.stop_arrivals(stop, day):
            ti = raw.st_trip[p]
            first = raw.trip_first[ti]
            if p == first + raw.trip_count[ti] - 1:
                continue
            tid = raw.st_time[p]
            timetabled = raw.time_strings[tid]
            scheduled = service_time_unix(day, raw.time_seconds[tid], tz)
            estimates = rt.estimates(net, ti, day) if rt.updates else None
            estimate = estimates[p - first] if estimates is not None else None
            trip_id = raw.trip_ids[ti]
            common = dict(
                lineId=net.trip_line[ti],
                patternId=net.trip_pattern[ti],
                stopHeadsign=_headsign(net, ti),
                timetabledArrivalTime=timetabled,
                timetabledDepartureTime=timetabled,
            )
            if estimate is not None:
                if estimate < now:
                    continue
                minutes = int(estimate - now) // 60
                at = datetime.fromtimestamp(estimate, tz).strftime("%H:%M:%S")
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
