"""The demo's vehicle positions: synthetic GTFS-RT for the bundled Cairns feed at the demo's
pinned clock, so the demo's vehicles run on the demo's routes (and `vehicles.pb` lists them).

No licence-clean realtime sample of Cairns exists; these positions are made from its
timetable: each trip under way at the instant is a vehicle between the stops it left and is
heading to, placed by the share of the time between them. `python -m sidecars.transit.demo`
writes `data/cairns_vehicle_positions.pb` again; a test checks the shipped file is this
function's output.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

from google.transit import gtfs_realtime_pb2 as rt

from .network import Network
from .settings import DEFAULT_GTFS, DEFAULT_VEHICLES, FeedSettings
from .source import FeedFiles
from .store import build_network
from .times import day_origin, operational_day

# The demo's pinned clock (README: TRANSIT_NOW).
DEMO_NOW = "2014-06-10T08:00:00+10:00"
# How long before the instant each position was sent.
HEARD_BEFORE_SECONDS = 10


def demo_vehicles(net: Network, now: float) -> bytes:
    """A VehiclePositions message of the trips under way at `now` (one vehicle each)."""
    raw = net.raw
    day = operational_day(now, net.tz, 4)
    origin = day_origin(day, net.tz)
    active = net.active_services(day)
    message = rt.FeedMessage()
    message.header.gtfs_realtime_version = "2.0"
    message.header.incrementality = rt.FeedHeader.FULL_DATASET
    message.header.timestamp = int(now)
    number = 0
    for ti, trip_id in enumerate(raw.trip_ids):
        if not active[raw.trip_service[ti]]:
            continue
        first, count = raw.trip_first[ti], raw.trip_count[ti]
        times = [origin + raw.time_seconds[raw.st_time[p]] for p in range(first, first + count)]
        if count < 2 or not times[0] <= now < times[-1]:
            continue
        k = next(i for i in range(1, count) if times[i] > now)
        share = (now - times[k - 1]) / (times[k] - times[k - 1])
        before, after = raw.stops[raw.st_stop[first + k - 1]], raw.stops[raw.st_stop[first + k]]
        number += 1
        entity = message.entity.add()
        entity.id = f"demo-{number}"
        vp = entity.vehicle
        vp.trip.trip_id = trip_id
        vp.trip.route_id = raw.routes[raw.trip_route[ti]].route_id
        vp.trip.start_date = day.strftime("%Y%m%d")
        vp.vehicle.id = f"{number:03d}"
        vp.position.latitude = before.lat + share * (after.lat - before.lat)
        vp.position.longitude = before.lon + share * (after.lon - before.lon)
        vp.current_stop_sequence = raw.st_seq[first + k]
        vp.stop_id = raw.stop_ids[raw.st_stop[first + k]]
        vp.current_status = rt.VehiclePosition.IN_TRANSIT_TO
        vp.timestamp = int(now) - HEARD_BEFORE_SECONDS
    return message.SerializeToString()


def main() -> int:
    """Write the demo's positions for the bundled feed at the demo's clock."""
    net = build_network(FeedFiles.load(DEFAULT_GTFS, 30.0), FeedSettings(source=DEFAULT_GTFS))
    now = datetime.fromisoformat(DEMO_NOW).timestamp()
    Path(DEFAULT_VEHICLES).write_bytes(demo_vehicles(net, now))
    print(f"wrote {DEFAULT_VEHICLES}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
