"""Feed validation that protects the public, on broken copies of the real
Cairns feed: fatal problems reject a feed (the previous one keeps serving, /health and
/status/feed say why with file:line), row-level problems skip the row and serve the rest, a
refresh that drops too much is fatal, and the same report comes from the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import falcon.testing
import pytest
from support import Clock
from support.process import REPO

from sidecars.transit.settings import FeedSettings
from sidecars.transit.store import TransitStore

from ..helpers import BRISBANE, CAIRNS_ZIP, local_ts, write_feed

NOW = local_ts("2014-06-10T08:00", BRISBANE)


def cairns_files() -> dict[str, str]:
    """The real Cairns feed's files as text."""
    with zipfile.ZipFile(CAIRNS_ZIP) as z:
        return {n: z.read(n).decode("utf-8-sig") for n in z.namelist() if n.endswith(".txt")}


CAIRNS = cairns_files()


def drop_column(text: str, column: str) -> str:
    """A CSV text without one column (the files have no quoted commas in these columns)."""
    lines = text.splitlines()
    header = lines[0].split(",")
    i = header.index(column)
    out = []
    for line in lines:
        cells = _split(line)
        del cells[i]
        out.append(",".join(cells))
    return "\n".join(out) + "\n"


def _split(line: str) -> list[str]:
    import csv

    [cells] = list(csv.reader([line]))
    return [f'"{c}"' if "," in c else c for c in cells]


def replace_line(text: str, number: int, fn: Callable[[list[str]], list[str]]) -> str:
    """`text` with line `number` (1 = header) rewritten cell by cell."""
    lines = text.splitlines()
    lines[number - 1] = ",".join(fn(_split(lines[number - 1])))
    return "\n".join(lines) + "\n"


def broken(tmp_path: Path, name: str, **files: str | None) -> Path:
    """A copy of the Cairns feed with some files replaced (None drops one)."""
    return write_feed(tmp_path / name, dict(files), base=CAIRNS)


@pytest.fixture
def store(tmp_path: Path, make_store: Callable[..., TransitStore]) -> TransitStore:
    """A store serving the real Cairns feed from a path the tests rewrite."""
    path = write_feed(tmp_path / "feed.zip", {}, base=CAIRNS)
    store = make_store(path, clock=Clock(NOW))
    assert store.load_static()
    return store


def refresh_with(store: TransitStore, **files: str | None) -> bool:
    write_feed(Path(store.settings.feed.source), dict(files), base=CAIRNS)
    return store.load_static()


@pytest.mark.parametrize(
    ("file", "column", "message"),
    [
        ("stops.txt", "stop_lat", "stop_lat"),
        ("stops.txt", "stop_name", "stop_name"),
        ("routes.txt", "route_type", "route_type"),
        ("agency.txt", "agency_url", "agency_url"),
        ("stop_times.txt", "departure_time", "departure_time"),
    ],
)
def test_missing_required_column_rejects_a_refresh_and_the_old_feed_keeps_serving(
    store: TransitStore, client_for, file: str, column: str, message: str
) -> None:  # type: ignore[no-untyped-def]
    client: falcon.testing.TestClient = client_for(store)
    serving = store.network
    stops_before = client.simulate_get("/v2/stops").content
    assert refresh_with(store, **{file: drop_column(CAIRNS[file], column)}) is False
    assert store.network is serving
    # Nothing was published at 0,0: the stops are the old ones.
    assert client.simulate_get("/v2/stops").content == stops_before
    health = client.simulate_get("/health").json
    assert health["feed"]["status"] == "degraded"
    [problem] = health["feed"]["problems"]
    assert (problem["file"], problem["line"]) == (file, 1)
    assert message in problem["message"] and f"{file}:1:" in health["feed"]["last_error"]
    status = client.simulate_get("/status/feed")
    assert status.status_code == 200 and status.headers["cache-control"] == "no-store"
    attempt, serving_report = status.json["last_attempt"], status.json["serving"]
    assert attempt["accepted"] is False and attempt["fatal"] == 1
    [notice] = [n for n in attempt["notices"] if n["severity"] == "fatal"]
    assert notice["code"] == "missing_required_column"
    assert notice["examples"] == [problem]
    assert serving_report["accepted"] is True and serving_report["version"] == serving.version  # type: ignore[union-attr]


def test_both_route_names_missing_is_fatal(tmp_path: Path) -> None:
    routes = drop_column(drop_column(CAIRNS["routes.txt"], "route_short_name"), "route_long_name")
    report = validate_cli(broken(tmp_path, "f.zip", **{"routes.txt": routes}))[1]
    assert report["accepted"] is False
    # Only the header problem: the trips of the unusable routes.txt are not read.
    [notice] = [n for n in report["notices"] if n["severity"] != "warning"]
    assert notice["examples"][0]["message"].endswith("route_short_name or route_long_name")


def test_one_bad_stop_time_is_skipped_on_a_first_start(
    tmp_path: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    # Line 3 of stop_times.txt: trip 4165878 at stop 750000 gets an impossible time.
    stop_times = replace_line(CAIRNS["stop_times.txt"], 3, lambda c: [c[0], "05:7x:00", *c[2:]])
    store = make_store(broken(tmp_path, "f.zip", **{"stop_times.txt": stop_times}), Clock(NOW))
    assert store.load_static()  # served: no 503 anywhere
    client = client_for(store)
    assert client.simulate_get("/v2/stops").status_code == 200
    assert client.simulate_get("/v2/arrivals/by_stop/750000").status_code == 200
    assert len(store.network.raw.st_trip) == 37790 - 1  # type: ignore[union-attr]
    health = client.simulate_get("/health").json
    assert health["status"] == "ok" and health["feed"]["skipped_rows"] == 1
    report = client.simulate_get("/status/feed").json["serving"]
    assert report["accepted"] is True and report["errors"] == 1
    [notice] = [n for n in report["notices"] if n["severity"] == "error"]
    assert (notice["code"], notice["severity"], notice["count"]) == ("invalid_time", "error", 1)
    assert notice["examples"] == [
        {"file": "stop_times.txt", "line": 3, "message": "'05:7x:00' is not H:MM:SS"}
    ]
    assert {"file": "stop_times.txt", "rows": 37790, "skipped": 1} in report["files"]


def test_conditional_requirements_and_ranges_skip_rows(
    tmp_path: Path, make_store: Callable[..., TransitStore]
) -> None:  # type: ignore[no-untyped-def]
    stops = CAIRNS["stops.txt"]
    # location_type 0 without coordinates, latitude out of range, an unknown location_type,
    # a stop at 0,0; a generic node (location_type 3) needs no coordinates but a parent.
    stops = replace_line(stops, 2, lambda c: [*c[:4], "", *c[5:]])
    stops = replace_line(stops, 3, lambda c: [*c[:4], "95.1", *c[5:]])
    stops = replace_line(stops, 4, lambda c: [*c[:8], "7", *c[9:]])
    stops = replace_line(stops, 5, lambda c: [*c[:4], "0", "0", *c[6:]])
    stops += "NODE1,,Walkway,,,,,,3,750010\n"
    routes = replace_line(CAIRNS["routes.txt"], 2, lambda c: [*c[:6], "GREEN1", *c[7:]])
    path = broken(tmp_path, "f.zip", **{"stops.txt": stops, "routes.txt": routes})
    store = make_store(path, Clock(NOW), feed=FeedSettings(max_skipped_share=1.0))
    assert store.load_static()
    raw = store.network.raw  # type: ignore[union-attr]
    report = raw.report
    assert {key: n for key, n in report.counts.items() if key[0] != "missing_recommended_file"} == {
        ("missing_required_field", "error"): 1,
        ("number_out_of_range", "error"): 1,
        ("unexpected_enum_value", "error"): 1,  # location_type: the API uses it
        ("point_near_origin", "error"): 1,
        ("invalid_color", "warning"): 1,  # the route is served, with the default colour
    }
    [missing] = report.examples[("missing_required_field", "error")]
    assert (missing.file, missing.line) == ("stops.txt", 2)
    assert "stop_lat is empty" in missing.message
    # The four stops are gone, and the stop_times at them with them: counted under each
    # stop's notice (the root cause), not as foreign key violations of their own.
    assert len(raw.stop_ids) == 416 - 4 and "NODE1" not in raw.stop_index
    assert (
        sum(d["stop_times.txt"] for d in report.dropped.values())
        == report.skipped["stop_times.txt"]
        > 0
    )
    assert missing.dropped == {"stop_times.txt": 71}
    # A bad colour is served as the default, not as a missing route.
    route = raw.routes[raw.route_index["110-423"]]
    assert route.color == "" and report.examples[("invalid_color", "warning")][0].line == 2


def test_a_time_going_backwards_costs_one_row(
    tmp_path: Path, make_store: Callable[..., TransitStore]
) -> None:  # type: ignore[no-untyped-def]
    # Line 4 (third stop of the first trip) typed 15:52 instead of 05:52: later rows are fine.
    stop_times = replace_line(
        CAIRNS["stop_times.txt"], 4, lambda c: [c[0], "15:52:00", "15:52:00", *c[3:]]
    )
    store = make_store(broken(tmp_path, "f.zip", **{"stop_times.txt": stop_times}), Clock(NOW))
    assert store.load_static()
    report = store.network.raw.report  # type: ignore[union-attr]
    [example] = report.examples[("stop_time_with_arrival_before_previous_departure_time", "error")]
    assert (example.file, example.line) == ("stop_times.txt", 4)
    assert report.skipped == {"stop_times.txt": 1}


def test_too_many_skipped_rows_are_fatal(tmp_path: Path) -> None:
    # Every trip of route 110-423 (more than a tenth of trips and stop_times) loses its route.
    routes = "\n".join(
        line for line in CAIRNS["routes.txt"].splitlines() if not line.startswith("110-423,")
    )
    code, report = validate_cli(broken(tmp_path, "f.zip", **{"routes.txt": routes + "\n"}))
    assert code == 1 and report["accepted"] is False
    fatal = [n for n in report["notices"] if n["severity"] == "fatal"]
    assert {n["code"] for n in fatal} == {"too_many_rows_skipped"}
    assert any(e["file"] == "stop_times.txt" for n in fatal for e in n["examples"])


def test_a_refresh_dropping_too_much_is_fatal(
    store: TransitStore, client_for, make_store: Callable[..., TransitStore]
) -> None:  # type: ignore[no-untyped-def]
    # Half of stop_times.txt, cut at a trip boundary: every row left is valid.
    lines = CAIRNS["stop_times.txt"].splitlines()
    cut = len(lines) // 2
    while lines[cut].split(",")[0] == lines[cut - 1].split(",")[0]:
        cut += 1
    half = "\n".join(lines[:cut]) + "\n"
    serving = store.network
    assert refresh_with(store, **{"stop_times.txt": half}) is False
    assert store.network is serving
    [problem] = client_for(store).simulate_get("/health").json["feed"]["problems"]
    assert (
        problem["file"] == "stop_times.txt" and "TRANSIT_FEED_MAX_DROP_SHARE" in problem["message"]
    )
    # The same feed is fine as a first load, or with a looser share.
    loose = make_store(
        store.settings.feed.source, Clock(NOW), feed=FeedSettings(max_drop_share=1.0)
    )
    assert loose.load_static()


def validate_cli(path: Path, *args: str, **settings: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    """`python -m sidecars.transit validate --json` (with `TRANSIT_<name>` settings): exit
    status and report."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    env.update({f"TRANSIT_{name}": value for name, value in settings.items()})
    done = subprocess.run(
        [sys.executable, "-m", "sidecars.transit", "validate", "--json", str(path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_cli_report_before_deploying(tmp_path: Path) -> None:
    code, report = validate_cli(CAIRNS_ZIP)
    # Accepted, but not silently: Cairns' calendars ended in 2014 (the real clock is later).
    assert code == 0 and report["accepted"] is True and report["errors"] == 0
    assert {n["code"]: n["count"] for n in report["notices"]} == {
        "expired_calendar": 4,
        "no_service_today": 1,
        "missing_recommended_file": 1,
    }
    stops = drop_column(CAIRNS["stops.txt"], "stop_lon")
    path = broken(tmp_path, "f.zip", **{"stops.txt": stops})
    code, report = validate_cli(path)
    assert code == 1 and report["fatal"] == 1
    assert report["notices"][0]["examples"] == [
        {"file": "stops.txt", "line": 1, "message": "missing required column(s): stop_lon"}
    ]
    # Against the served feed, as a refresh would be checked; and as text for people.
    # A consistent feed with a fifth of the trips (and their stop times).
    trips = CAIRNS["trips.txt"].splitlines()[:270]
    kept = {line.split(",")[2] for line in trips[1:]}
    stop_times = [
        line
        for i, line in enumerate(CAIRNS["stop_times.txt"].splitlines())
        if i == 0 or line.split(",")[0] in kept
    ]
    smaller = broken(
        tmp_path,
        "g.zip",
        **{"trips.txt": "\n".join(trips) + "\n", "stop_times.txt": "\n".join(stop_times) + "\n"},
    )
    assert validate_cli(smaller)[0] == 0
    code, report = validate_cli(smaller, "--against", str(CAIRNS_ZIP))
    assert code == 1 and {n["code"] for n in report["notices"] if n["severity"] == "fatal"} == {
        "feed_shrunk"
    }
    text = subprocess.run(
        [sys.executable, "-m", "sidecars.transit", "validate", str(path)],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert text.returncode == 1
    assert (
        "REJECTED" in text.stdout
        and "stops.txt:1: missing required column(s): stop_lon" in text.stdout
    )


def test_cli_reads_the_clock_the_server_does() -> None:
    # TRANSIT_NOW inside Cairns' service: not expired, as the server pinned there says.
    code, report = validate_cli(CAIRNS_ZIP, NOW="2014-06-10T08:00:00+10:00")
    assert code == 0
    assert {n["code"] for n in report["notices"]} == {"missing_recommended_file"}
    assert report["validated_at"] == int(NOW)
