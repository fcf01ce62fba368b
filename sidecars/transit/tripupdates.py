"""GTFS-RT TripUpdates joined to the static trips: what happens to each stop of a trip on one
service day, after the GTFS-Realtime reference's rules.

- trip `CANCELED`: every stop of the trip is cancelled (the rows stay, marked, so a rider
  sees the bus is not coming); `DELETED`: the trip is not shown at all;
- stop `SKIPPED`: that stop is not served; the delay before it carries on past it (SKIPPED is
  not propagated); `NO_DATA`: no estimate for that stop nor for the later stops without an
  update of their own (NO_DATA is propagated);
- a delay (or an absolute time, read as a delay) carries on to the later stops without an
  update, the departure's when the update has one; before the first update only the trip's
  own `delay` applies;
- `ADDED` / `NEW` trips (not in the static feed) are extra arrivals at the stops their
  updates name, at the times given (`scheduled_time` when the update has it);
- `DUPLICATED`: a copy of the static trip it names, on `trip_properties`' start date and
  time (the static times shifted to start then), under `trip_properties.trip_id`; the static
  trip itself still runs as scheduled;
- `UNSCHEDULED` (a frequency-based trip running without a timetable): arrivals at the times
  its updates give, with the static trip's route, headsign and pattern when it names one;
- `REPLACEMENT` (deprecated by the reference, kept for old producers): applied to the static
  trip it names, as a scheduled trip's update;
- an update is about one service day: its `start_date`, else the service day on which the
  static trip runs nearest to now (the reference: the current service day); an update or a
  whole message older than the age limit is not used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from google.transit import gtfs_realtime_pb2 as rt

from .network import Network
from .times import (
    clock_string,
    day_origin,
    days_around,
    operational_day,
    parse_time,
    parse_yyyymmdd,
    service_time_unix,
    yyyymmdd,
)

_TD = rt.TripDescriptor
_STU = rt.TripUpdate.StopTimeUpdate
SCHEDULED, CANCELED, SKIPPED, ADDED = "SCHEDULED", "CANCELED", "SKIPPED", "ADDED"
DUPLICATED, UNSCHEDULED = "DUPLICATED", "UNSCHEDULED"


@dataclass(slots=True)
class TripUpdate:
    """The update of one static trip."""

    vehicle: str | None
    delay: int | None
    by_seq: dict[int, Any]
    by_stop: dict[str, Any]
    relationship: int
    start_date: date | None
    # Seconds the trip runs after its timetable (a DUPLICATED copy starting later).
    shift: int = 0


@dataclass(slots=True)
class TripEstimate:
    """Per stop of a trip on one day: the estimated Unix arrival (None where unknown) and
    whether the stop is served (False: skipped, or the whole trip cancelled)."""

    times: list[int | None]
    served: list[bool]
    canceled: bool


@dataclass(slots=True)
class AddedStop:
    """One arrival of an added trip at a stop: `unix` the time the update gives,
    `scheduled` its timetable (a DUPLICATED copy's shifted static time; else `unix`)."""

    unix: int
    trip_id: str
    stop: int
    stop_sequence: int
    last: bool  # the trip's last stop (a panel does not show it)
    scheduled: int = 0

    def __post_init__(self) -> None:
        if not self.scheduled:
            self.scheduled = self.unix


@dataclass(slots=True)
class AddedTrip:
    """A trip the static feed does not have, from its TripUpdate."""

    trip_id: str
    day: date
    route: int | None
    headsign: str
    vehicle: str | None
    stops: list[AddedStop] = field(default_factory=list)
    pattern_id: str | None = None
    # How the arrivals name it: ADDED, DUPLICATED or UNSCHEDULED.
    relationship: str = ADDED


def _event_time(event: Any, scheduled: int | None) -> int | None:
    """The absolute time of a StopTimeEvent: `time`, else scheduled + `delay`."""
    if event.HasField("time") and event.time:
        return int(event.time)
    if event.HasField("delay") and scheduled is not None:
        return scheduled + event.delay
    return None


def estimate_trip(net: Network, trip: int, update: TripUpdate, day: date) -> TripEstimate:
    """Apply one update to the static trip `trip` on `day` (see the module docstring)."""
    raw = net.raw
    first, count = raw.trip_first[trip], raw.trip_count[trip]
    if update.relationship == _TD.CANCELED:
        return TripEstimate([None] * count, [False] * count, True)
    delay = update.delay
    times: list[int | None] = []
    served: list[bool] = []
    for pos in range(first, first + count):
        scheduled = service_time_unix(day, raw.time_seconds[raw.st_time[pos]], net.tz)
        scheduled += update.shift
        stu = update.by_seq.get(raw.st_seq[pos]) or update.by_stop.get(
            raw.stop_ids[raw.st_stop[pos]]
        )
        estimate = None
        skipped = False
        if stu is None:
            estimate = scheduled + delay if delay is not None else None
        elif stu.schedule_relationship == _STU.SKIPPED:
            skipped = True
        elif stu.schedule_relationship == _STU.NO_DATA:
            delay = None
        else:
            arrival = _event_time(stu.arrival, scheduled) if stu.HasField("arrival") else None
            departure = _event_time(stu.departure, scheduled) if stu.HasField("departure") else None
            estimate = arrival if arrival is not None else departure
            if estimate is None and delay is not None:
                estimate = scheduled + delay
            # What the next stops inherit: the departure's delay when given.
            latest = departure if departure is not None else estimate
            if latest is not None:
                delay = latest - scheduled
        times.append(estimate)
        served.append(not skipped)
    return TripEstimate(times, served, False)


def update_day(trip: rt.TripDescriptor | rt.TripUpdate.TripProperties) -> date | None:
    """The service day a TripDescriptor (or TripProperties) names (`start_date`), or None."""
    if not trip.start_date:
        return None
    try:
        return parse_yyyymmdd(trip.start_date)
    except ValueError:
        return None


# How long after its scheduled end a run is still the one an update without start_date is
# about (a late bus finishing).
RUN_GRACE_SECONDS = 3600


def running_day(net: Network, trip: int, now: float, start_hour: int) -> date:
    """The service day an update without `start_date` is about (the reference: the current
    one): of the days around now on which the static trip runs, the first whose run has not
    ended more than RUN_GRACE_SECONDS ago; the operational day when there is none. At 00:20,
    a 00:30 trip's update is about today's run, not yesterday's 24 hours ago."""
    raw = net.raw
    op_day = operational_day(now, net.tz, start_hour)
    last = raw.trip_first[trip] + raw.trip_count[trip] - 1
    end = raw.time_seconds[raw.st_time[last]]
    service = raw.trip_service[trip]
    for day in days_around(op_day, net.span_days):
        if net.active_services(day)[service] and day_origin(day, net.tz) + end >= (
            now - RUN_GRACE_SECONDS
        ):
            return day
    return op_day


def duplicated_trip(
    net: Network, tu: rt.TripUpdate, trip: int, update: TripUpdate, vehicle: str | None
) -> AddedTrip | None:
    """A DUPLICATED trip: the static trip's stops at its times shifted to the copy's start
    (`trip_properties.start_time`, else the static start) on the copy's service day, with
    what the update says of each stop."""
    props = tu.trip_properties
    raw = net.raw
    first = raw.trip_first[trip]
    if props.start_time:
        try:
            update.shift = parse_time(props.start_time) - raw.time_seconds[raw.st_time[first]]
        except ValueError:
            return None
    day = update_day(props) or update.start_date
    if day is None:
        return None
    update.start_date = day
    estimate = estimate_trip(net, trip, update, day)
    trip_id = props.trip_id or f"{raw.trip_ids[trip]}@{yyyymmdd(day)}"
    route = raw.trip_route[trip]
    copy = AddedTrip(
        trip_id, day, route, trip_headsign(net, trip), vehicle, relationship=DUPLICATED
    )
    copy.pattern_id = net.trip_pattern[trip] or None
    origin = day_origin(day, net.tz) + update.shift
    timed = [
        (unix, raw.st_stop[p], raw.st_seq[p], origin + raw.time_seconds[raw.st_time[p]])
        for p, unix in enumerate(estimate.times, first)
        if estimate.served[p - first]
    ]
    for i, (unix, stop, seq, scheduled) in enumerate(timed):
        last = i == len(timed) - 1
        copy.stops.append(AddedStop(unix or scheduled, trip_id, stop, seq, last, scheduled))
    return copy if copy.stops else None


def trip_headsign(net: Network, trip: int) -> str:
    """A static trip's headsign; feeds without trip_headsign (the Google sample): the name
    of its last stop."""
    raw = net.raw
    last = raw.trip_first[trip] + raw.trip_count[trip] - 1
    return raw.trip_headsign[trip] or raw.stops[raw.st_stop[last]].name


def added_trip(
    net: Network, tu: rt.TripUpdate, vehicle: str | None, start_hour: int
) -> AddedTrip | None:
    """An ADDED / NEW trip from its update: its stops (by stop_id) with a time, on the
    service day of `start_date` or, without it, the operational day of its first time."""
    raw = net.raw
    timed: list[tuple[int, int, int]] = []  # (unix, stop, sequence)
    for k, stu in enumerate(tu.stop_time_update):
        stop = raw.stop_index.get(stu.stop_id)
        if stop is None or stu.schedule_relationship in (_STU.SKIPPED, _STU.NO_DATA):
            continue
        at = None
        for event_name in ("arrival", "departure"):
            if stu.HasField(event_name):
                event = getattr(stu, event_name)
                at = event.time or event.scheduled_time or None
                if at:
                    break
        if at:
            seq = stu.stop_sequence if stu.HasField("stop_sequence") else k + 1
            timed.append((int(at), stop, seq))
    if not timed:
        return None
    timed.sort()
    day = update_day(tu.trip) or operational_day(timed[0][0], net.tz, start_hour)
    route = raw.route_index.get(tu.trip.route_id)
    headsign = tu.trip_properties.trip_headsign if tu.HasField("trip_properties") else ""
    added = AddedTrip(
        trip_id=tu.trip.trip_id,
        day=day,
        route=route,
        headsign=headsign or raw.stops[timed[-1][1]].name,
        vehicle=vehicle,
    )
    for i, (unix, stop, seq) in enumerate(timed):
        added.stops.append(AddedStop(unix, added.trip_id, stop, seq, i == len(timed) - 1))
    if route is not None:
        # The route's pattern with exactly these stops, if there is one.
        stops = [s for _, s, _ in timed]
        for pattern_id in net.route_patterns.get(raw.routes[route].route_id, ()):
            versions = net.patterns.get(pattern_id, [])
            if any(_path_stops(net, v.first_trip) == stops for v in versions):
                added.pattern_id = pattern_id
                break
    return added


def _path_stops(net: Network, trip: int) -> list[int]:
    raw = net.raw
    first = raw.trip_first[trip]
    return list(raw.st_stop[first : first + raw.trip_count[trip]])


def added_time(unix: int, day: date, net: Network) -> str:
    """The `HH:MM:SS` of an added trip's time relative to its service day."""
    return clock_string(unix, day, net.tz)


def start_time_trip(net: Network, trip: rt.TripDescriptor) -> str:
    """The static trip a descriptor names; a frequency-based trip is its template id plus
    start_time, which the parser expanded to `<trip_id>@<HH:MM:SS>`."""
    trip_id = trip.trip_id
    if trip_id and trip.start_time:
        try:
            seconds = parse_time(trip.start_time)
        except ValueError:
            return trip_id
        h, rest = divmod(seconds, 3600)
        expanded = f"{trip_id}@{h:02d}:{rest // 60:02d}:{rest % 60:02d}"
        if expanded in net.trip_index:
            return expanded
    return trip_id


def day_after(day: date) -> date:
    """The next calendar day."""
    return day + timedelta(days=1)
