"""GTFS-Realtime: vehicles, trip updates and alerts, joined to the static network.

A `Realtime` is an immutable snapshot built by the poller from the last good message of each
source; requests read the snapshot the store holds at that moment.
"""

from __future__ import annotations

import csv
import io
import struct
from dataclasses import dataclass
from datetime import date
from typing import Any

import msgspec
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.transit import gtfs_realtime_pb2 as rt

from .bodies import Body
from .network import Network, natural_key
from .schemas import Alert, Vehicle, json_encoder
from .times import BadTime, format_time, parse_time, service_time_unix

_VP = rt.VehiclePosition
_TD = rt.TripDescriptor
_STU = rt.TripUpdate.StopTimeUpdate
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


class RealtimeError(ValueError):
    """A GTFS-RT message or metadata file that cannot be used."""


def parse_feed(data: bytes) -> rt.FeedMessage:
    """Decode a GTFS-RT FeedMessage."""
    message = rt.FeedMessage()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise RealtimeError(f"not a GTFS-RT FeedMessage: {exc}") from exc
    if not message.header.gtfs_realtime_version:
        raise RealtimeError("not a GTFS-RT FeedMessage: header.gtfs_realtime_version missing")
    return message


def parse_vehicle_metadata(text: str) -> dict[str, dict[str, Any]]:
    """Vehicle metadata CSV (`id` or `vehicle_id` column, then any Vehicle metadata columns)."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
    fields = set(reader.fieldnames or ())
    key = "id" if "id" in fields else "vehicle_id" if "vehicle_id" in fields else None
    if key is None:
        raise RealtimeError("vehicle metadata CSV needs an `id` or `vehicle_id` column")
    out: dict[str, dict[str, Any]] = {}
    for line, row in enumerate(reader, 2):
        meta: dict[str, Any] = {}
        try:
            for name in ("make", "model", "owner", "propulsion", "license_plate", "door_status"):
                if row.get(name):
                    meta[name] = row[name].strip()
            if row.get("registration_date"):
                meta["registration_date"] = row["registration_date"].strip().replace("-", "")
            for name in ("capacity_seated", "capacity_standing", "capacity_total"):
                if row.get(name):
                    meta[name] = int(row[name])
            for name in ("bikes_allowed", "wheelchair_accessible"):
                if row.get(name):
                    meta[name] = row[name].strip().lower() in ("1", "true", "yes")
        except ValueError as exc:
            raise RealtimeError(f"vehicle metadata line {line}: {exc}") from exc
        out[row[key].strip()] = meta
    return out


@dataclass(slots=True)
class _TripUpdate:
    vehicle: str | None
    delay: int | None
    by_seq: dict[int, rt.TripUpdate.StopTimeUpdate]
    by_stop: dict[str, rt.TripUpdate.StopTimeUpdate]


@dataclass(slots=True)
class _Position:
    vehicle_id: str
    stop_sequence: int | None


class Realtime:
    """One consistent view of every realtime source."""

    def __init__(
        self,
        network: Network | None,
        vehicles: rt.FeedMessage | None,
        trip_updates: rt.FeedMessage | None,
        alerts: rt.FeedMessage | None,
        metadata: dict[str, dict[str, Any]] | None,
        now: float,
        pb_max_age: float,
    ) -> None:
        self.network = network
        self.metadata = metadata or {}
        self.positions: dict[str, _Position] = {}
        self.updates: dict[str, _TripUpdate] = {}
        self._estimates: dict[tuple[int, date], list[int | None]] = {}
        self._pb_extras: list[tuple[int | None, int | None]] = []
        self.vehicles = self._vehicles(vehicles) if vehicles is not None else []
        self.vehicles_body = Body(json_encoder.encode(self.vehicles))
        self.vehicles_pb = Body(self._vehicles_pb(now, pb_max_age))
        if trip_updates is not None:
            self._trip_updates(trip_updates)
        alert_list, alert_pb = self._alerts(alerts)
        self.alerts_body = Body(json_encoder.encode(alert_list))
        self.alerts_pb = Body(alert_pb)
        self.alert_count = len(alert_list)

    def _trip_id(self, trip: rt.TripDescriptor) -> str:
        """The static trip a descriptor names; a frequency-based trip is its template id plus
        start_time, which the parser expanded to `<trip_id>@<HH:MM:SS>`."""
        trip_id = trip.trip_id
        net = self.network
        if trip_id and trip.start_time and net is not None:
            try:
                expanded = f"{trip_id}@{format_time(parse_time(trip.start_time))}"
            except BadTime:
                return trip_id
            if expanded in net.trip_index:
                return expanded
        return trip_id

    # -- vehicles ---------------------------------------------------------------------------

    def vehicle_id(
        self, number: str, route_id: str | None, trip: int | None = None
    ) -> tuple[str, str]:
        """(agency_id, `agency|number`) of a vehicle: the agency of its trip's route, else of
        the GTFS route it names, else the feed's (first) agency."""
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
        for entity in feed.entity:
            if not entity.HasField("vehicle"):
                continue
            vp = entity.vehicle
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
                timestamp=vp.timestamp or feed.header.timestamp or None,
                trip_id=trip_id,
                wheelchair_accessible=wheelchair,
            )
            out.append((vehicle, direction, occupancy))
            if trip_id:
                seq = vp.current_stop_sequence if vp.HasField("current_stop_sequence") else None
                self.positions[trip_id] = _Position(vid, seq)
        out.sort(key=lambda item: natural_key(item[0].id))
        # What vehicles.pb carries beyond the JSON fields, in the same order.
        self._pb_extras = [(direction, occupancy) for _, direction, occupancy in out]
        return [vehicle for vehicle, _, _ in out]

    def _vehicles_pb(self, now: float, max_age: float) -> bytes:
        """Vehicle positions as GTFS-RT, rebuilt from the JSON list the way the real service
        does: only vehicles on a trip and heard from in the last `max_age` seconds (0: all),
        with their direction and occupancy."""
        feed = rt.FeedMessage()
        feed.header.gtfs_realtime_version = "2.0"
        feed.header.incrementality = rt.FeedHeader.FULL_DATASET
        feed.header.timestamp = int(now)
        for v, (direction, occupancy) in zip(self.vehicles, self._pb_extras, strict=True):
            if not v.trip_id or (max_age and (v.timestamp or 0) < now - max_age):
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
        for entity in feed.entity:
            if not entity.HasField("trip_update"):
                continue
            tu = entity.trip_update
            if not tu.trip.trip_id:
                continue
            by_seq: dict[int, Any] = {}
            by_stop: dict[str, Any] = {}
            for stu in tu.stop_time_update:
                if stu.HasField("stop_sequence"):
                    by_seq[stu.stop_sequence] = stu
                elif stu.stop_id:
                    by_stop[stu.stop_id] = stu
            trip_id = self._trip_id(tu.trip)
            vehicle = None
            if tu.HasField("vehicle") and (tu.vehicle.id or tu.vehicle.label) and self.network:
                ti = self.network.trip_index.get(trip_id)
                number = tu.vehicle.id or tu.vehicle.label
                vehicle = self.vehicle_id(number, tu.trip.route_id, ti)[1]
            delay = tu.delay if tu.HasField("delay") else None
            self.updates[trip_id] = _TripUpdate(vehicle, delay, by_seq, by_stop)

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

    def estimates(self, net: Network, trip: int, day: date) -> list[int | None] | None:
        """Estimated Unix arrival per stop of a trip on a service day (None where unknown), or
        None without a TripUpdate. A delay carries on to later stops without an update, as
        GTFS-RT specifies; a skipped or NO_DATA stop has no estimate and stops the carry."""
        raw = net.raw
        update = self.updates.get(raw.trip_ids[trip])
        if update is None:
            return None
        key = (trip, day)
        cached = self._estimates.get(key)
        if cached is not None:
            return cached
        first, count = raw.trip_first[trip], raw.trip_count[trip]
        delay = update.delay
        out: list[int | None] = []
        for pos in range(first, first + count):
            scheduled = service_time_unix(day, raw.time_seconds[raw.st_time[pos]], net.tz)
            stu = update.by_seq.get(raw.st_seq[pos]) or update.by_stop.get(
                raw.stop_ids[raw.st_stop[pos]]
            )
            estimate = None
            if stu is not None:
                if stu.schedule_relationship in (_STU.SKIPPED, _STU.NO_DATA):
                    delay = None
                else:
                    event = stu.arrival if stu.HasField("arrival") else stu.departure
                    if event.HasField("time") and event.time:
                        estimate = event.time
                        delay = estimate - scheduled
                    elif event.HasField("delay"):
                        delay = event.delay
            if (
                estimate is None
                and delay is not None
                and (stu is None or stu.schedule_relationship == _STU.SCHEDULED)
            ):
                estimate = scheduled + delay
            out.append(estimate)
        if len(self._estimates) > 20_000:
            self._estimates.clear()
        self._estimates[key] = out
        return out

    # -- alerts -----------------------------------------------------------------------------

    def _alerts(self, feed: rt.FeedMessage | None) -> tuple[list[Alert], bytes]:
        out_feed = rt.FeedMessage()
        out_feed.header.gtfs_realtime_version = "2.0"
        alerts: list[Alert] = []
        if feed is None:
            return alerts, out_feed.SerializeToString()
        out_feed.header.CopyFrom(feed.header)
        for entity in feed.entity:
            if not entity.HasField("alert"):
                continue
            out_feed.entity.add().CopyFrom(entity)
            data = json_format.MessageToDict(entity.alert, preserving_proto_field_name=True)
            data["alert_id"] = entity.id
            try:
                alerts.append(msgspec.convert(data, Alert, strict=False))
            except msgspec.ValidationError as exc:
                raise RealtimeError(f"alert {entity.id!r}: {exc}") from exc
        return alerts, out_feed.SerializeToString()
