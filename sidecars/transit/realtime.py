"""GTFS-Realtime: vehicles, trip updates and alerts, joined to the static network.

A `Realtime` is an immutable snapshot built by the poller from the last good message of each
source; requests read the snapshot the store holds at that moment. Only what is current is in
it: a vehicle position, a trip update or a whole message older than the age limit, and an
alert outside its active periods, are left out (and `problems` says so, for `/health`). The
snapshot knows when that set next changes (`expires_at`); the store builds a new one then.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import msgspec
from google.protobuf import json_format
from google.transit import gtfs_realtime_pb2 as rt

from .bodies import Body
from .network import Network, natural_key
from .rtsources import RealtimeError
from .schemas import Alert, Vehicle, json_encoder
from .tripupdates import (
    UNSCHEDULED,
    AddedTrip,
    TripEstimate,
    TripUpdate,
    added_trip,
    duplicated_trip,
    estimate_trip,
    running_day,
    start_time_trip,
    trip_headsign,
    update_day,
)

# Relationships of trips the static feed is not expected to have.
_NEW = (rt.TripDescriptor.ADDED, rt.TripDescriptor.NEW, rt.TripDescriptor.UNSCHEDULED)
# A realtime message naming more unknown trips than this share is flagged in /health.
UNKNOWN_TRIPS_SHARE = 0.1
# The vehicle fields `/v2/vehicles` filters on.
VEHICLE_FILTERS = ("line_id", "route_id")
# Filtered vehicle lists kept per snapshot (any more and the memo starts again).
FILTERED_BODIES = 4096
_VP = rt.VehiclePosition
_TD = rt.TripDescriptor
_WHEELCHAIR = {
    rt.VehicleDescriptor.WHEELCHAIR_ACCESSIBLE: True,
    rt.VehicleDescriptor.WHEELCHAIR_INACCESSIBLE: False,
}


def _f32(value: float) -> float:
    """A GTFS-RT float (32 bits) as the shortest decimal that reads back to it: the
    precision the source has, without the noise of widening it to 64 bits
    (28.059175 rather than 28.059175491333008)."""
    packed = struct.pack("<f", value)
    for digits in range(6, 10):
        short = float(f"{value:.{digits}g}")
        if struct.pack("<f", short) == packed:
            return short
    return value


def iso_utc(ts: float) -> str:
    """A Unix time as `YYYY-MM-DDTHH:MM:SSZ`."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class _Position:
    vehicle_id: str
    stop_sequence: int | None


class Realtime:
    """One consistent view of every realtime source, as current at `now`."""

    def __init__(
        self,
        network: Network | None,
        vehicles: rt.FeedMessage | None,
        trip_updates: rt.FeedMessage | None,
        alerts: rt.FeedMessage | None,
        metadata: dict[str, dict[str, Any]] | None,
        now: float,
        max_ages: Mapping[str, float] | None = None,
        start_hour: int = 4,
    ) -> None:
        """`max_ages`: the age limit of each kind (`vehicles`, `trip_updates`, `alerts`;
        0 or absent: none), the one staleness policy every endpoint serves."""
        self.network = network
        self.metadata = metadata or {}
        self.now = now
        self.max_ages = dict(max_ages or {})
        self.start_hour = start_hour
        # Why some of a source is not served as current, by source kind (for /health).
        self.problems: dict[str, str] = {}
        # The first moment something served here stops (or starts) being current.
        self.expires_at = float("inf")
        self.positions: dict[str, _Position] = {}
        self.updates: dict[str, TripUpdate] = {}
        self.added: list[AddedTrip] = []
        self._estimates: dict[tuple[int, date], TripEstimate] = {}
        self._pb_extras: list[tuple[int | None, int | None]] = []
        self.inactive_alerts = 0
        # Per agency: current positions, current trip updates, newest time heard.
        self.agency_vehicles: dict[str, int] = {}
        self.agency_updates: dict[str, int] = {}
        self.agency_heard: dict[str, float] = {}
        # Per kind: trips named that the served feed lacks (added trips aside), and of how
        # many named; a feed of another schedule version names mostly unknown ones.
        self.unknown_trips: dict[str, tuple[int, int, str]] = {}
        self.mismatch: dict[str, str] = {}
        # When each served family's data was sent by its source (the message's header
        # timestamp): the Last-Modified of its JSON list and protobuf.
        self.modified: dict[str, float] = {
            kind: feed.header.timestamp
            for kind, feed in (("vehicles", vehicles), ("alerts", alerts))
            if feed is not None and feed.header.timestamp
        }
        self.vehicles = self._vehicles(vehicles) if vehicles is not None else []
        self.vehicle_index = {v.id: v for v in self.vehicles}
        # Each vehicle encoded once: the list, and any filter of it, joins these bytes.
        self.vehicle_json = [json_encoder.encode(v) for v in self.vehicles]
        self.vehicles_body = Body(b"[" + b",".join(self.vehicle_json) + b"]")
        # The filters' index: field -> value -> the vehicles' positions in the list, so
        # `?line_id=` reads its few vehicles rather than testing every one.
        self.vehicle_filters: dict[str, dict[str | None, list[int]]] = {
            name: {} for name in VEHICLE_FILTERS
        }
        self._filtered: dict[tuple, Body] = {}
        for i, v in enumerate(self.vehicles):
            for name, index in self.vehicle_filters.items():
                index.setdefault(getattr(v, name), []).append(i)
        self.vehicles_pb = Body(self._vehicles_pb(now))
        if trip_updates is not None and self._current(trip_updates, "trip_updates"):
            self._trip_updates(trip_updates)
        alert_list, alert_pb = self._alerts(alerts)
        self.alerts = alert_list
        self.alerts_body = Body(json_encoder.encode(alert_list))
        self.alerts_pb = Body(alert_pb)
        self.alert_count = len(alert_list)

    @property
    def has_trips(self) -> bool:
        """Whether any trip has realtime data (else arrivals are the schedule alone)."""
        return bool(self.updates or self.positions or self.added)

    def vehicles_body_where(self, wanted: dict[str, str | None]) -> Body:
        """`vehicles_where` as a Body, kept for the life of this snapshot (the same filter
        asked again costs a dict lookup; its gzip is made once)."""
        key = tuple(wanted.items())
        body = self._filtered.get(key)
        if body is None:
            if len(self._filtered) >= FILTERED_BODIES:
                self._filtered.clear()
            body = self._filtered[key] = Body(self.vehicles_where(wanted))
        return body

    def vehicles_where(self, wanted: dict[str, str | None]) -> bytes:
        """The encoded vehicles whose fields equal the given values (None: any), in the
        list's order."""
        chosen: list[int] | None = None
        for name, value in wanted.items():
            if value is None:
                continue
            hits = self.vehicle_filters[name].get(value, [])
            chosen = hits if chosen is None else sorted(set(chosen) & set(hits))
        if chosen is None:
            return self.vehicles_body.data
        return b"[" + b",".join(self.vehicle_json[i] for i in chosen) + b"]"

    def _too_old(self, ts: float | None, kind: str) -> bool:
        """Whether a timestamp is past the age limit of its kind (no timestamp: not known
        to be)."""
        max_age = self.max_ages.get(kind, 0.0)
        if not max_age or not ts:
            return False
        if ts < self.now - max_age:
            return True
        self.expires_at = min(self.expires_at, ts + max_age)
        return False

    def _limit(self, kind: str) -> str:
        """The age limit of a kind as a reason names it."""
        return f"{self.max_ages.get(kind, 0.0):g} s (TRANSIT_{kind.upper()}_MAX_AGE_SECONDS)"

    def _current(self, feed: rt.FeedMessage, kind: str) -> bool:
        """Whether a whole message is recent enough to be used (its header timestamp)."""
        ts = feed.header.timestamp
        if self._too_old(ts, kind):
            self.problems[kind] = (
                f"the message is from {iso_utc(ts)}, {int(self.now - ts)} s ago, older than "
                f"{self._limit(kind)}: not served"
            )
            return False
        return True

    def _trip_id(self, trip: rt.TripDescriptor) -> str:
        """The static trip a descriptor names (frequency-based: with its start_time)."""
        net = self.network
        return start_time_trip(net, trip) if net is not None else trip.trip_id

    # -- vehicles ---------------------------------------------------------------------------

    def vehicle_id(
        self, number: str, route_id: str | None, trip: int | None = None
    ) -> tuple[str, str]:
        """(agency_id, `agency|number`) of a vehicle: the agency of its trip's route, else of
        the GTFS route it names, else the feed's (first) agency. An id that already has its
        agency (Carris Metropolitana's GTFS-RT sends `41|1160`) is served as it is."""
        if "|" in number:
            return number.split("|", 1)[0], number
        net = self.network
        assert net is not None
        raw = net.raw
        route = raw.trip_route[trip] if trip is not None else raw.route_index.get(route_id or "")
        agency = raw.routes[route].agency_id if route is not None else ""
        agency = agency or net.agency_id
        return agency, f"{agency}|{number}"

    def _vehicles(self, feed: rt.FeedMessage) -> list[Vehicle]:
        net = self.network
        if net is None:
            # Without the feed a vehicle's agency is unknown: nothing until it is loaded.
            return []
        out: list[tuple[Vehicle, int | None, int | None]] = []
        stale, newest = 0, 0
        if not self._current(feed, "vehicles"):
            return []
        for entity in feed.entity:
            if not entity.HasField("vehicle"):
                continue
            vp = entity.vehicle
            timestamp = vp.timestamp or feed.header.timestamp or None
            if self._too_old(timestamp, "vehicles"):
                stale += 1
                newest = max(newest, timestamp or 0)
                continue
            trip = vp.trip
            number = vp.vehicle.id or vp.vehicle.label or entity.id
            trip_id = self._trip_id(trip) or None
            ti = net.trip_index.get(trip_id) if trip_id else None
            route_id = trip.route_id or None
            line_id = pattern_id = block_id = None
            direction = trip.direction_id if trip.HasField("direction_id") else None
            if ti is not None:
                pattern_id = net.trip_pattern[ti] or None
                # The API's route (a GTFS route may be split into variants, see patterns.py).
                route_id = net.pattern_route.get(pattern_id or "") or route_id
                line_id = net.trip_line[ti]
                block_id = net.raw.trip_block[ti] or None
                if direction is None:
                    direction = net.raw.trip_direction[ti]
            elif route_id in net.raw.route_index:
                line_id = net.route_line(net.raw.route_index[route_id])
            agency, vid = self.vehicle_id(number, trip.route_id, ti)
            meta = self.metadata.get(vid) or self.metadata.get(number) or {}
            pos = vp.position if vp.HasField("position") else None
            wheelchair = meta.get("wheelchair_accessible")
            if wheelchair is None and vp.vehicle.HasField("wheelchair_accessible"):
                wheelchair = _WHEELCHAIR.get(vp.vehicle.wheelchair_accessible)
            status = (
                _VP.VehicleStopStatus.Name(vp.current_status)
                if vp.HasField("current_status")
                else None
            )
            relationship = None
            if trip.HasField("schedule_relationship"):
                relationship = _TD.ScheduleRelationship.Name(trip.schedule_relationship)
            elif trip_id:
                relationship = "SCHEDULED"
            occupancy = vp.occupancy_status if vp.HasField("occupancy_status") else None
            vehicle = Vehicle(
                agency_id=agency,
                bearing=_f32(pos.bearing) if pos is not None and pos.HasField("bearing") else None,
                bikes_allowed=meta.get("bikes_allowed"),
                block_id=block_id,
                capacity_seated=meta.get("capacity_seated"),
                capacity_standing=meta.get("capacity_standing"),
                capacity_total=meta.get("capacity_total"),
                current_status=status,
                door_status=meta.get("door_status"),
                event_id=entity.id,
                id=vid,
                lat=_f32(pos.latitude) if pos is not None else None,
                license_plate=vp.vehicle.license_plate or meta.get("license_plate"),
                line_id=line_id,
                lon=_f32(pos.longitude) if pos is not None else None,
                make=meta.get("make"),
                model=meta.get("model"),
                owner=meta.get("owner"),
                pattern_id=pattern_id,
                propulsion=meta.get("propulsion"),
                registration_date=meta.get("registration_date"),
                route_id=route_id,
                schedule_relationship=relationship,
                shift_id=None,
                speed=_f32(pos.speed) if pos is not None and pos.HasField("speed") else None,
                stop_id=vp.stop_id or None,
                timestamp=timestamp,
                trip_id=trip_id,
                wheelchair_accessible=wheelchair,
            )
            out.append((vehicle, direction, occupancy))
            # Health is per agency of the served feed: the agency of the vehicle's trip (CM's
            # `41|1160` names an operator area, not one of the feed's agencies).
            feed_agency = self._agency(ti, trip.route_id) or agency
            self._heard(feed_agency, timestamp, self.agency_vehicles)
            if trip_id:
                self._named(
                    "vehicles", ti is not None or trip.schedule_relationship in _NEW, trip_id
                )
            if trip_id:
                seq = vp.current_stop_sequence if vp.HasField("current_stop_sequence") else None
                self.positions[trip_id] = _Position(vid, seq)
        if stale:
            self.problems["vehicles"] = (
                f"{stale} of {stale + len(out)} vehicle positions older than "
                f"{self._limit('vehicles')} (newest of them {iso_utc(newest)}): not served"
            )
        self._flag_unknown("vehicles")
        out.sort(key=lambda item: natural_key(item[0].id))
        # What vehicles.pb carries beyond the JSON fields, in the same order.
        self._pb_extras = [(direction, occupancy) for _, direction, occupancy in out]
        return [vehicle for vehicle, _, _ in out]

    def _vehicles_pb(self, now: float) -> bytes:
        """Vehicle positions as GTFS-RT, rebuilt from the JSON list the way the real service
        does: the current vehicles (the same age limit as the list) that are on a trip, with
        their direction and occupancy."""
        feed = rt.FeedMessage()
        feed.header.gtfs_realtime_version = "2.0"
        feed.header.incrementality = rt.FeedHeader.FULL_DATASET
        feed.header.timestamp = int(now)
        for v, (direction, occupancy) in zip(self.vehicles, self._pb_extras, strict=True):
            if not v.trip_id:
                continue
            entity = feed.entity.add()
            entity.id = v.event_id or v.id
            vp = entity.vehicle
            vp.trip.trip_id = v.trip_id
            if v.route_id:
                vp.trip.route_id = v.route_id
            if direction is not None:
                vp.trip.direction_id = direction
            if v.schedule_relationship:
                vp.trip.schedule_relationship = _TD.ScheduleRelationship.Value(
                    v.schedule_relationship
                )
            if v.lat is not None and v.lon is not None:
                vp.position.latitude, vp.position.longitude = v.lat, v.lon
                if v.bearing is not None:
                    vp.position.bearing = v.bearing
                if v.speed is not None:
                    vp.position.speed = v.speed
            if v.current_status:
                vp.current_status = _VP.VehicleStopStatus.Value(v.current_status)
            if occupancy is not None:
                vp.occupancy_status = occupancy
            if v.stop_id:
                vp.stop_id = v.stop_id
            if v.timestamp:
                vp.timestamp = v.timestamp
            vp.vehicle.id = v.id
            vp.vehicle.label = v.id.split("|", 1)[-1]
            if v.license_plate:
                vp.vehicle.license_plate = v.license_plate
            if v.wheelchair_accessible is not None:
                vp.vehicle.wheelchair_accessible = (
                    rt.VehicleDescriptor.WHEELCHAIR_ACCESSIBLE
                    if v.wheelchair_accessible
                    else rt.VehicleDescriptor.WHEELCHAIR_INACCESSIBLE
                )
        return feed.SerializeToString()

    # -- trip updates -----------------------------------------------------------------------

    def _trip_updates(self, feed: rt.FeedMessage) -> None:
        net = self.network
        if net is None:
            return
        stale = 0
        for entity in feed.entity:
            if not entity.HasField("trip_update"):
                continue
            tu = entity.trip_update
            if tu.HasField("timestamp") and self._too_old(tu.timestamp, "trip_updates"):
                stale += 1
                continue
            relationship = tu.trip.schedule_relationship
            trip_id = self._trip_id(tu.trip)
            ti = net.trip_index.get(trip_id)
            if trip_id:
                self._named("trip_updates", ti is not None or relationship in _NEW, trip_id)
            agency = self._agency(ti, tu.trip.route_id) or net.agency_id
            heard = tu.timestamp if tu.HasField("timestamp") else feed.header.timestamp
            self._heard(agency, heard or None, self.agency_updates)
            vehicle = None
            if tu.HasField("vehicle") and (tu.vehicle.id or tu.vehicle.label):
                number = tu.vehicle.id or tu.vehicle.label
                vehicle = self.vehicle_id(number, tu.trip.route_id, ti)[1]
            if relationship == _TD.UNSCHEDULED or (
                ti is None and relationship in (_TD.ADDED, _TD.NEW) and trip_id
            ):
                added = added_trip(net, tu, vehicle, self.start_hour)
                if added is not None:
                    if relationship == _TD.UNSCHEDULED:
                        added.relationship = UNSCHEDULED
                        if ti is not None:
                            # Running without a timetable, on the static trip's route.
                            added.route = net.raw.trip_route[ti]
                            added.headsign = trip_headsign(net, ti)
                            added.pattern_id = net.trip_pattern[ti] or None
                    self.added.append(added)
                continue
            if ti is None:
                continue
            by_seq: dict[int, Any] = {}
            by_stop: dict[str, Any] = {}
            for stu in tu.stop_time_update:
                if stu.HasField("stop_sequence"):
                    by_seq[stu.stop_sequence] = stu
                elif stu.stop_id:
                    by_stop[stu.stop_id] = stu
            delay = tu.delay if tu.HasField("delay") else None
            # An update without start_date is about the trip's current run (one day only).
            day = update_day(tu.trip) or running_day(net, ti, self.now, self.start_hour)
            update = TripUpdate(vehicle, delay, by_seq, by_stop, relationship, day)
            if relationship == _TD.DUPLICATED:
                # A copy of the static trip; the static one runs as scheduled.
                copy = duplicated_trip(net, tu, ti, update, vehicle)
                if copy is not None:
                    self.added.append(copy)
                continue
            self.updates[trip_id] = update
        self._flag_unknown("trip_updates")
        if stale:
            self.problems["trip_updates"] = (
                f"{stale} trip update(s) older than {self._limit('trip_updates')}: not used"
            )

    def _agency(self, trip: int | None, route_id: str) -> str | None:
        """The served feed's agency of a trip, else of a route id (None: neither known)."""
        net = self.network
        assert net is not None
        raw = net.raw
        route = raw.trip_route[trip] if trip is not None else raw.route_index.get(route_id)
        if route is None:
            return None
        return raw.routes[route].agency_id or net.agency_id

    def _heard(self, agency: str, ts: float | None, counts: dict[str, int]) -> None:
        """Count one current entity of an agency and keep the newest time heard."""
        counts[agency] = counts.get(agency, 0) + 1
        if ts:
            self.agency_heard[agency] = max(self.agency_heard.get(agency, 0.0), ts)

    def _named(self, kind: str, known: bool, trip_id: str) -> None:
        """Count a trip a message names, and whether the served feed has it."""
        unknown, named, example = self.unknown_trips.get(kind, (0, 0, ""))
        if not known:
            unknown += 1
            example = example or trip_id
        self.unknown_trips[kind] = (unknown, named + 1, example)

    def _flag_unknown(self, kind: str) -> None:
        """Say so when more than UNKNOWN_TRIPS_SHARE of the trips a message names are not in
        the served feed: it follows another schedule version (or other trip ids), and its
        data joins nothing."""
        unknown, named, example = self.unknown_trips.get(kind, (0, 0, ""))
        if unknown and unknown > UNKNOWN_TRIPS_SHARE * named and self.network is not None:
            self.mismatch[kind] = (
                f"{unknown} of the {named} trips it names are not in the served feed "
                f"(version {self.network.version}; e.g. {example!r}): it may follow another "
                "schedule version"
            )

    def trip_vehicle(self, trip_id: str) -> str | None:
        """Id of the vehicle serving a trip, from TripUpdates or VehiclePositions."""
        update = self.updates.get(trip_id)
        if update is not None and update.vehicle:
            return update.vehicle
        position = self.positions.get(trip_id)
        return position.vehicle_id if position is not None else None

    def passed_sequence(self, trip_id: str) -> int | None:
        """The stop_sequence the trip's vehicle is at or heading to (stops before it passed)."""
        position = self.positions.get(trip_id)
        return position.stop_sequence if position is not None else None

    def estimates(self, net: Network, trip: int, day: date) -> TripEstimate | None:
        """What the trip's TripUpdate says of each of its stops on a service day, or None
        without one (or with one about another day)."""
        update = self.updates.get(net.raw.trip_ids[trip])
        if update is None or (update.start_date is not None and update.start_date != day):
            return None
        key = (trip, day)
        if key not in self._estimates:
            if len(self._estimates) > 20_000:
                self._estimates.clear()
            self._estimates[key] = estimate_trip(net, trip, update, day)
        return self._estimates[key]

    def deleted(self, trip_id: str, day: date) -> bool:
        """Whether a trip is DELETED on a day: not shown at all."""
        update = self.updates.get(trip_id)
        return (
            update is not None
            and update.relationship == _TD.DELETED
            and (update.start_date is None or update.start_date == day)
        )

    # -- alerts -----------------------------------------------------------------------------

    def _active(self, periods: Any) -> bool:
        """Whether an alert is active now: no period means always; else now in one of them."""
        if not periods:
            return True
        active = False
        for period in periods:
            start = period.start if period.HasField("start") else 0
            end = period.end if period.HasField("end") else float("inf")
            if start <= self.now < end:
                active = True
                self.expires_at = min(self.expires_at, end)
            elif start > self.now:
                self.expires_at = min(self.expires_at, start)
        return active

    def _targets(self, alert: rt.Alert) -> AlertTargets:
        """The routes, lines and stops an alert is about (the informed entities, with a trip's
        route, a route's line and stops), or everything for an agency-wide entity."""
        net = self.network
        targets = AlertTargets()
        for entity in alert.informed_entity:
            route_id = entity.route_id
            if not route_id and entity.HasField("trip") and net is not None:
                ti = net.trip_index.get(self._trip_id(entity.trip))
                if ti is not None:
                    route_id = net.raw.routes[net.raw.trip_route[ti]].route_id
            if route_id:
                targets.routes.add(route_id)
                if net is not None and route_id in net.raw.route_index:
                    targets.lines.add(net.route_line(net.raw.route_index[route_id]))
            if entity.stop_id:
                targets.stops.add(entity.stop_id)
            elif route_id:
                targets.route_wide.add(route_id)
            if not (route_id or entity.stop_id) and (entity.agency_id or entity.route_type):
                targets.everything = True
        return targets

    def _alerts(self, feed: rt.FeedMessage | None) -> tuple[list[Alert], bytes]:
        """The alerts active now, as JSON (each informed entity naming a route gets its
        `line_id`) and as GTFS-RT."""
        out_feed = rt.FeedMessage()
        out_feed.header.gtfs_realtime_version = "2.0"
        alerts: list[Alert] = []
        self.alert_targets: list[AlertTargets] = []
        if feed is None or not self._current(feed, "alerts"):
            return alerts, out_feed.SerializeToString()
        out_feed.header.CopyFrom(feed.header)
        net = self.network
        inactive = 0
        for entity in feed.entity:
            if not entity.HasField("alert"):
                continue
            if not self._active(entity.alert.active_period):
                inactive += 1
                continue
            out_feed.entity.add().CopyFrom(entity)
            data = json_format.MessageToDict(entity.alert, preserving_proto_field_name=True)
            data["alert_id"] = entity.id
            informed_entities = data.get("informed_entity", [])
            for informed in informed_entities:
                route_id = informed.get("route_id")
                if net is not None and route_id in net.raw.route_index:
                    informed["line_id"] = net.route_line(net.raw.route_index[route_id])
            # Keys in alphabetical order, as every body of the API.
            data["informed_entity"] = [dict(sorted(e.items())) for e in informed_entities]
            try:
                alerts.append(msgspec.convert(data, Alert, strict=False))
            except msgspec.ValidationError as exc:
                raise RealtimeError(f"alert {entity.id!r}: {exc}") from exc
            self.alert_targets.append(self._targets(entity.alert))
        if inactive:
            # Not a fault of the source: alerts announced ahead or ended.
            self.inactive_alerts = inactive
        return alerts, out_feed.SerializeToString()

    def alerts_for(
        self, route_id: str | None, line_id: str | None, stop_id: str | None
    ) -> list[Alert]:
        """The alerts about a route, a line and/or a stop (an alert about a whole route is
        about each of its stops; an agency-wide one about everything)."""
        net = self.network
        out = []
        for alert, t in zip(self.alerts, self.alert_targets, strict=True):
            if t.everything:
                out.append(alert)
                continue
            if route_id is not None and route_id not in t.routes:
                continue
            if line_id is not None and line_id not in t.lines:
                continue
            if stop_id is not None and stop_id not in t.stops:
                stop = net.stop_index.get(stop_id) if net is not None else None
                if stop is None or not (t.route_wide & net.stop_routes[stop]):  # type: ignore[union-attr]
                    continue
            out.append(alert)
        return out


@dataclass(slots=True)
class AlertTargets:
    """What one alert is about, for the `?route_id`, `?line_id` and `?stop_id` filters."""

    routes: set[str] = field(default_factory=set)
    lines: set[str] = field(default_factory=set)
    stops: set[str] = field(default_factory=set)
    # Routes named without a stop: the alert is about every stop of the route.
    route_wide: set[str] = field(default_factory=set)
    everything: bool = False
