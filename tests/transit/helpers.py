"""Helpers shared by the transit tests: the embedded feeds, a small built feed, local times, a
settable clock and a local HTTP server for feeds fetched by URL."""

from __future__ import annotations

import threading
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
from support.sidecar import Gunicorn, transit_sidecar

from sidecars.transit.settings import DATA_DIR

CAIRNS_ZIP = DATA_DIR / "cairns_gtfs.zip"
BULLRUNNER_ZIP = DATA_DIR / "bullrunner_gtfs.zip"
BULLRUNNER_VP = DATA_DIR / "bullrunner_vehicle_positions.pb"
BRISBANE = ZoneInfo("Australia/Brisbane")
LISBON = ZoneInfo("Europe/Lisbon")

# A small feed in Lisbon time. 2026-03-25 (a Wednesday) is removed by calendar_dates,
# 2026-03-28 (Saturday) and 2026-03-29 (Sunday, the spring DST change) are added. TLATE runs
# past midnight; stop 100009 is served by no trip.
SMALL_FEED: dict[str, str] = {
    "agency.txt": "agency_id,agency_name,agency_url,agency_timezone\n"
    "A,Test Agency,http://example.org,Europe/Lisbon\n",
    "stops.txt": "stop_id,stop_name,stop_lat,stop_lon,wheelchair_boarding\n"
    "100001,First,38.700000,-9.100000,1\n"
    "100002,Second,38.710000,-9.110000,0\n"
    "100003,Third,38.720000,-9.120000,\n"
    "100009,Lonely,38.730000,-9.130000,\n",
    "routes.txt": "route_id,agency_id,route_short_name,route_long_name,route_type,route_color,"
    "route_text_color\n"
    "R1,A,1,One Line,3,FF0000,\n",
    "calendar.txt": "service_id,monday,tuesday,wednesday,thursday,friday,saturday,sunday,"
    "start_date,end_date\n"
    "WK,1,1,1,1,1,0,0,20260301,20260430\n",
    "calendar_dates.txt": "service_id,date,exception_type\n"
    "WK,20260325,2\n"
    "WK,20260328,1\n"
    "WK,20260329,1\n"
    "EXTRA,20260326,1\n",
    "shapes.txt": "shape_id,shape_pt_lat,shape_pt_lon,shape_pt_sequence\n"
    "S1,38.700000,-9.100000,1\n"
    "S1,38.710000,-9.110000,2\n"
    "S1,38.720000,-9.120000,3\n",
    "trips.txt": "route_id,service_id,trip_id,trip_headsign,direction_id,shape_id,block_id\n"
    "R1,WK,T1,Third,0,S1,B1\n"
    "R1,EXTRA,T1X,Third,0,S1,B1\n"
    "R1,WK,T2,Third,0,S1,B1\n"
    "R1,WK,TLATE,Third,0,S1,B2\n"
    "R1,WK,TBACK,First,1,,B3\n",
    "stop_times.txt": "trip_id,arrival_time,departure_time,stop_id,stop_sequence,pickup_type,"
    "drop_off_type,shape_dist_traveled\n"
    "T1,08:00:00,08:00:00,100001,1,0,1,0\n"
    "T1,08:10:00,08:10:00,100002,2,0,0,1.5\n"
    "T1,08:20:00,08:20:00,100003,3,1,0,3.0\n"
    "T1X,08:00:00,08:00:00,100001,1,0,1,0\n"
    "T1X,08:10:00,08:10:00,100002,2,0,0,1.5\n"
    "T1X,08:20:00,08:20:00,100003,3,1,0,3.0\n"
    "T2,9:00:00,9:00:00,100001,1,0,1,0\n"
    "T2,09:10:00,09:10:00,100002,2,0,0,1.5\n"
    "T2,09:20:00,09:20:00,100003,3,1,0,3.0\n"
    "TLATE,23:50:00,23:50:00,100001,1,0,1,0\n"
    "TLATE,24:05:00,24:05:00,100002,2,0,0,1.5\n"
    "TLATE,26:30:00,26:30:00,100003,3,1,0,3.0\n"
    "TBACK,10:00:00,10:00:00,100003,1,,,\n"
    "TBACK,10:30:00,10:30:00,100001,2,,,\n",
}


def local_ts(text: str, tz: ZoneInfo = LISBON) -> float:
    """Unix time of a local wall-clock `YYYY-MM-DDTHH:MM[:SS]`."""
    return datetime.fromisoformat(text).replace(tzinfo=tz).timestamp()


def write_feed(
    path: Path,
    files: dict[str, str | None],
    base: dict[str, str] | None = None,
    as_zip: bool = True,
) -> Path:
    """Write a feed (zip or directory) from `base` (SMALL_FEED by default) with overrides;
    a None value drops that file."""
    merged: dict[str, str | None] = {**(SMALL_FEED if base is None else base), **files}
    if as_zip:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, text in merged.items():
                if text is not None:
                    archive.writestr(name, text)
    else:
        path.mkdir(parents=True, exist_ok=True)
        for name, text in merged.items():
            if text is not None:
                (path / name).write_text(text, encoding="utf-8")
    return path


@contextmanager
def http_files(
    files: dict[str, bytes],
    authorize: Callable[[str, Message], bool] | None = None,
    redirects: dict[str, str] | None = None,
) -> Iterator[str]:
    """A local HTTP server (in a thread) answering GET `path` with `files[path]` and 404 for any
    other path; yields its base URL, `http://127.0.0.1:<port>`. With `authorize(path, headers)`
    (the path with its query string), a request it refuses is answered 401. `redirects` maps
    a path (without its query) to the Location of a 302."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            location = (redirects or {}).get(self.path.partition("?")[0])
            payload = files.get(self.path.partition("?")[0] if authorize else self.path)
            if payload is None and location is None:
                self.send_error(404)
                return
            if authorize is not None and not authorize(self.path, self.headers):
                self.send_error(401)
                return
            if location is not None:
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            assert payload is not None
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def serving(
    env: dict[str, str], log: Path, ready: Callable[[httpx.Response], bool]
) -> Iterator[Gunicorn]:
    """`python -m sidecars.transit` (2 workers, port 0) with `env`, yielded once each worker's
    `/health` is `ready` (a worker loads its feed in the background and answers 503 until then;
    the workers are told apart by the Transit-Worker header)."""
    gunicorn = transit_sidecar(env, log)
    try:
        gunicorn.wait_ready(60)
        gunicorn.wait_each_worker("/health", ready, header="transit-worker")
        yield gunicorn
    finally:
        gunicorn.terminate(30)
