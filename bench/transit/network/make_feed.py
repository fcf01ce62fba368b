"""Generate a synthetic GTFS feed of Carris Metropolitana's size (CM-extended columns).

Defaults: 12,000 stops, 800 lines x 2 directions, ~100,000 trips of 40 stops, i.e. about four
million stop_times, with calendar_dates-only services like CM's feed. Output is a zip (fast
deflate) or, with --dir, a directory. `--stops-file` takes the stops from a real stops.txt
instead (Carris Metropolitana's, 12,580 stops with every CM column), and `--vehicles N OUT`
writes a GTFS-RT VehiclePositions message of N vehicles on trips of the feed, with CM's
`<area>|<number>` ids.

    .venv/bin/python bench/transit/network/make_feed.py /tmp/cm_synth.zip
    .venv/bin/python bench/transit/network/make_feed.py /tmp/cm.zip \
        --stops-file ../shared/data/gtfs/carrismetropolitana_partial/stops.txt \
        --lines 760 --trips-per-route 15 --stops-per-trip 38 --vehicles 1024 /tmp/cm_vp.pb
"""

from __future__ import annotations

import argparse
import csv
import io
import random
import time
import zipfile
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo


def generate(
    stops: int,
    lines: int,
    trips_per_route: int,
    stops_per_trip: int,
    seed: int,
    stops_file: Path | None = None,
) -> dict:
    """Build the feed's files as {name: text}."""
    rnd = random.Random(seed)
    files: dict[str, list[str]] = {}
    files["agency.txt"] = [
        "agency_id,agency_name,agency_url,agency_timezone,agency_lang",
        "CM,Carris Metropolitana,https://www.carrismetropolitana.pt,Europe/Lisbon,pt",
    ]
    if stops_file is not None:
        text = stops_file.read_text(encoding="utf-8-sig")
        files["stops.txt"] = text.rstrip("\n").split("\n")
        stop_ids = [row["stop_id"] for row in csv.DictReader(io.StringIO(text))]
    else:
        stop_rows = [
            "stop_id,stop_name,stop_lat,stop_lon,stop_short_name,tts_stop_name,region_id,"
            "district_id,municipality_id,locality,wheelchair_boarding,near_school,train"
        ]
        stop_ids = [f"{100000 + i:06d}" for i in range(stops)]
        for i, sid in enumerate(stop_ids):
            lat = 38.5 + rnd.random() * 0.5
            lon = -9.4 + rnd.random() * 0.6
            stop_rows.append(
                f"{sid},Paragem {i},{lat:.6f},{lon:.6f},,Paragem {i},PT170,11,{1101 + i % 20},"
                f"Local {i % 400},{i % 2},{int(i % 7 == 0)},{int(i % 50 == 0)}"
            )
        files["stops.txt"] = stop_rows
    # Services: weekday / saturday / sunday for a year, calendar_dates only (like CM).
    start = date(2026, 1, 1)
    cal = ["service_id,date,exception_type"]
    for d in range(365):
        day = start + timedelta(days=d)
        sid = "DU" if day.weekday() < 5 else "SAB" if day.weekday() == 5 else "DOM"
        cal.append(f"{sid},{day:%Y%m%d},1")
    files["calendar_dates.txt"] = cal
    routes = [
        "route_id,agency_id,route_short_name,route_long_name,route_type,route_color,"
        "route_text_color,line_id,line_short_name,line_long_name"
    ]
    trips = ["route_id,service_id,trip_id,trip_headsign,direction_id,shape_id,pattern_id"]
    shapes = ["shape_id,shape_pt_lat,shape_pt_lon,shape_pt_sequence,shape_dist_traveled"]
    stop_times = [
        "trip_id,arrival_time,departure_time,stop_id,stop_sequence,pickup_type,drop_off_type,"
        "shape_dist_traveled"
    ]
    services = ("DU", "SAB", "DOM")
    for n in range(lines):
        line_id = f"{1001 + n}"
        route_id = f"{line_id}_0"
        routes.append(
            f"{route_id},CM,{line_id},Linha {line_id},3,ED1C24,FFFFFF,{line_id},"
            f"{line_id},Linha {line_id}"
        )
        for direction in (0, 1):
            pattern_id = f"{route_id}_{direction + 1}"
            shape_id = f"{n}_{direction}"
            path = rnd.sample(stop_ids, stops_per_trip)
            for k in range(stops_per_trip):
                shapes.append(
                    f"{shape_id},{38.5 + k / 1000:.6f},{-9.1 + k / 1000:.6f},{k + 1},{k * 0.4:.3f}"
                )
            for t in range(trips_per_route):
                service = services[t % 3]
                start_s = 5 * 3600 + (t * 20 * 60 * 3 // trips_per_route) * 60 % (21 * 3600)
                trip_id = f"{pattern_id}_{t:04d}_{service}"
                trips.append(
                    f"{route_id},{service},{trip_id},Destino {line_id}/{direction},"
                    f"{direction},{shape_id},{pattern_id}"
                )
                for k, sid in enumerate(path):
                    secs = start_s + k * 90
                    hh, rem = divmod(secs, 3600)
                    text = f"{hh:02d}:{rem // 60:02d}:{rem % 60:02d}"
                    stop_times.append(f"{trip_id},{text},{text},{sid},{k + 1},0,0,{k * 0.4:.3f}")
    files["routes.txt"] = routes
    files["trips.txt"] = trips
    files["shapes.txt"] = shapes
    files["stop_times.txt"] = stop_times
    return files


def vehicles(files: dict, count: int, now: str, seed: int) -> bytes:
    """A GTFS-RT VehiclePositions message: `count` vehicles on trips of the feed running at
    `now` (an ISO time), heard from in the last 30 s, ids `<41..44>|<number>` as CM's."""
    from google.transit import gtfs_realtime_pb2 as rt

    rnd = random.Random(seed)
    at = datetime.fromisoformat(now)
    local = at.astimezone(ZoneInfo("Europe/Lisbon"))
    service = "DU" if local.weekday() < 5 else "SAB" if local.weekday() == 5 else "DOM"
    trips = [line.split(",") for line in files["trips.txt"][1:]]
    trips = [t for t in trips if t[1] == service]
    message = rt.FeedMessage()
    message.header.gtfs_realtime_version = "2.0"
    message.header.timestamp = int(at.timestamp())
    for k, trip in enumerate(rnd.sample(trips, min(count, len(trips)))):
        entity = message.entity.add()
        vid = f"{41 + k % 4}|{1000 + k}"
        entity.id = f"{vid}-{trip[2]}"
        vp = entity.vehicle
        vp.trip.trip_id, vp.trip.route_id = trip[2], trip[0]
        vp.vehicle.id = vid
        vp.position.latitude = 38.5 + rnd.random() * 0.5
        vp.position.longitude = -9.4 + rnd.random() * 0.6
        vp.position.bearing = rnd.randrange(360)
        vp.position.speed = rnd.random() * 15
        vp.current_stop_sequence = rnd.randrange(1, 20)
        vp.timestamp = int(at.timestamp()) - rnd.randrange(30)
    return message.SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--stops", type=int, default=12_000)
    parser.add_argument("--lines", type=int, default=800)
    parser.add_argument("--trips-per-route", type=int, default=63)
    parser.add_argument("--stops-per-trip", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", action="store_true", help="write a directory, not a zip")
    parser.add_argument("--stops-file", type=Path, help="a real stops.txt to use")
    parser.add_argument(
        "--vehicles", nargs=2, metavar=("N", "OUT"), help="also write N vehicle positions"
    )
    parser.add_argument("--now", default="2026-03-24T08:00:00+00:00", help="the vehicles' time")
    args = parser.parse_args()
    t0 = time.perf_counter()
    files = generate(
        args.stops,
        args.lines,
        args.trips_per_route,
        args.stops_per_trip,
        args.seed,
        args.stops_file,
    )
    if args.vehicles:
        count, out = args.vehicles
        Path(out).write_bytes(vehicles(files, int(count), args.now, args.seed))
    if args.dir:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, rows in files.items():
            (args.out / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    else:
        with zipfile.ZipFile(args.out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
            for name, rows in files.items():
                buf = io.StringIO()
                buf.write("\n".join(rows))
                buf.write("\n")
                archive.writestr(name, buf.getvalue())
    counts = {name: len(rows) - 1 for name, rows in files.items()}
    print(f"wrote {args.out} in {time.perf_counter() - t0:.1f}s: {counts}")


if __name__ == "__main__":
    main()
