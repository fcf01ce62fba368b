"""The validation report on the real Cairns feed: the root cause first (a skipped route is the
notice, its trips and stop times counted under it), MobilityData's severities (a route_type
the API does not serve is a warning and the route is served), feed_info and expiry checks,
unknown files as information, MobilityData's report.json shape, and a rejected version that
is not parsed again until the source changes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support import Clock

from sidecars.transit import store as store_module
from sidecars.transit.settings import FeedSettings
from sidecars.transit.store import TransitStore

from ..helpers import BRISBANE, local_ts
from .test_validation import CAIRNS, REPO, broken, replace_line, validate_cli

NOW = local_ts("2014-06-10T08:00", BRISBANE)


def test_a_route_type_the_api_does_not_serve_is_a_warning(tmp_path: Path) -> None:
    routes = replace_line(CAIRNS["routes.txt"], 2, lambda c: [*c[:4], "99", *c[5:]])
    code, report = validate_cli(broken(tmp_path, "f.zip", **{"routes.txt": routes}))
    assert code == 0 and report["accepted"] is True and report["errors"] == 0
    assert all(f["skipped"] == 0 for f in report["files"])
    [notice] = [n for n in report["notices"] if n["code"] == "unexpected_enum_value"]
    assert notice["severity"] == "warning"
    assert (
        notice["examples"][0]["line"] == 2 and "route_type 99" in notice["examples"][0]["message"]
    )


def test_the_root_cause_comes_first_with_its_dependants(tmp_path: Path) -> None:
    # Route 110-423 (line 2) names an agency the feed does not have: the route is skipped,
    # and with it its 125 trips and their stop times.
    code, report = validate_cli(
        broken(tmp_path, "f.zip", **{"routes.txt": _with_agency(CAIRNS["routes.txt"])})
    )
    assert code == 1 and report["accepted"] is False
    fatal, cause = report["notices"][0], report["notices"][1]
    # The headline names the cause of most of the skipped rows.
    assert fatal["code"] == "too_many_rows_skipped"
    assert "dropped with routes.txt:2" in fatal["examples"][0]["message"]
    assert cause["code"] == "foreign_key_violation" and cause["count"] == 1
    [example] = cause["examples"]
    assert (example["file"], example["line"]) == ("routes.txt", 2)
    assert example["dropped"] == cause["dropped"]
    assert cause["dropped"]["trips.txt"] == 125 and cause["dropped"]["stop_times.txt"] > 4000
    # Not thousands of foreign key violations: one notice, the route's.
    assert sum(n["count"] for n in report["notices"] if n["code"] == "foreign_key_violation") == 1
    files = {f["file"]: f["skipped"] for f in report["files"]}
    assert (
        files["trips.txt"] == 125 and files["stop_times.txt"] == cause["dropped"]["stop_times.txt"]
    )


def _with_agency(routes: str) -> str:
    """Cairns' routes.txt with an agency_id column, route 110-423 naming an unknown agency."""
    lines = routes.splitlines()
    out = ["agency_id," + lines[0]]
    for i, line in enumerate(lines[1:]):
        out.append(("NOPE," if i == 0 else ",") + line)
    return "\n".join(out) + "\n"


def test_feed_info_expiry_and_unknown_files(
    tmp_path: Path, make_store: Callable[..., TransitStore]
) -> None:  # type: ignore[no-untyped-def]
    def report_of(end: str, **files: str) -> dict[str, dict]:
        info = (
            "feed_publisher_name,feed_publisher_url,feed_lang,feed_start_date,feed_end_date\n"
            f"Translink,https://translink.com.au,en,20140526,{end}\n"
        )
        path = broken(tmp_path, f"f{end}.zip", **{"feed_info.txt": info, **files})
        store = make_store(path, Clock(NOW))
        assert store.load_static()
        serving = store.feed_status().serving
        assert serving is not None
        return {n.code: json.loads(json.dumps(n.examples[0].message)) for n in serving.notices}

    assert "feed_expiration_date7_days" in report_of("20140614")
    assert "feed_expiration_date30_days" in report_of("20140701")
    far = report_of("20141228", **{"notes.txt": "a,b\n1,2\n"})
    assert not any(code.startswith("feed_expiration") for code in far)
    assert far["unknown_file"] == "not a GTFS file"
    assert "missing_recommended_file" not in far
    one_date = broken(tmp_path, "g.zip", **{"feed_info.txt": (
        "feed_publisher_name,feed_publisher_url,feed_lang,feed_start_date\nT,https://t,en,20140526\n"
    )})  # fmt: skip
    code, report = validate_cli(one_date)
    assert code == 0 and "missing_feed_info_date" in {n["code"] for n in report["notices"]}


def test_mobilitydata_report_shape(tmp_path: Path) -> None:
    stops = CAIRNS["stops.txt"].replace("stop_lon", "longitude", 1)
    path = broken(tmp_path, "f.zip", **{"stops.txt": stops})
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "sidecars.transit", "validate", str(path), "--format",
         "mobilitydata", "--output", str(out)],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(out.read_text())
    assert set(report) == {"summary", "notices"}
    assert report["summary"]["gtfsInput"] == str(path) and report["summary"]["accepted"] is False
    notices = {n["code"]: n for n in report["notices"]}
    missing = notices["missing_required_column"]
    assert set(missing) == {"code", "severity", "totalNotices", "sampleNotices"}
    assert missing["severity"] == "ERROR" and missing["totalNotices"] == 1
    assert missing["sampleNotices"] == [
        {"filename": "stops.txt", "message": "missing required column(s): stop_lon",
         "csvRowNumber": 1}
    ]  # fmt: skip
    assert {n["severity"] for n in report["notices"]} <= {"ERROR", "WARNING", "INFO"}
    # What the feed says of itself: Cairns has no feed_info.txt, one agency.
    assert set(report["summary"]["feedInfo"].values()) == {""}
    [agency] = report["summary"]["agencies"]
    assert agency["timezone"] == "Australia/Brisbane" and agency["name"]
    assert set(agency) == {"name", "url", "phone", "email", "timezone"}
    described = tmp_path / "g.zip"
    broken(tmp_path, "g.zip", **{"feed_info.txt": (
        "feed_publisher_name,feed_publisher_url,feed_lang,feed_start_date,feed_end_date,"
        "feed_version,feed_contact_email\n"
        "TransLink,https://translink.example,en,20140526,20141228,v7,data@translink.example\n"
    )})  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "sidecars.transit", "validate", str(described), "--format",
         "mobilitydata"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
             "TRANSIT_NOW": "2014-06-10T08:00:00+10:00"},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["feedInfo"] == {
        "publisherName": "TransLink",
        "publisherUrl": "https://translink.example",
        "feedLanguage": "en",
        "feedStartDate": "20140526",
        "feedEndDate": "20141228",
        "feedVersion": "v7",
        "feedEmail": "data@translink.example",
        "feedContactUrl": "",
    }


def test_a_rejected_version_is_not_parsed_again(
    tmp_path: Path, make_store: Callable[..., TransitStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = broken(tmp_path, "f.zip", **{"stops.txt": CAIRNS["stops.txt"].replace("stop_lon", "x")})
    parsed: list[str] = []
    real = store_module.build_network

    def counting(files, *args, **kwargs):  # type: ignore[no-untyped-def]
        parsed.append(files.digest)
        return real(files, *args, **kwargs)

    monkeypatch.setattr(store_module, "build_network", counting)
    store = make_store(path, Clock(NOW), feed=FeedSettings(refresh_seconds=0))
    assert not store.load_static() and not store.load_static() and not store.load_static()
    assert len(parsed) == 1
    assert store.health().feed.problems[0].file == "stops.txt"  # the report stands
    broken(tmp_path, "f.zip")  # the source changes (fixed)
    assert store.load_static() and len(parsed) == 2
