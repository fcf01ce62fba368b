"""Metrics under real gunicorn with 2 uvicorn workers: both workers ingest on their schedule
(one at a time, through the store's lock), pick up appended records, and never double count."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from support.sidecar import transit_sidecar

from .records import append_lines, validation, write_csv


def test_two_workers_ingest_on_schedule(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    rows = [validation("2026-11-20T08:00", "41", "1001", "010001")] * 5
    write_csv(records / "validations.csv", rows)
    env = {
        "TRANSIT_NOW": "2026-11-20T10:00:00+00:00",
        "TRANSIT_TIMEZONE": "Europe/Lisbon",
        "TRANSIT_DEMO": "true",
        "TRANSIT_VEHICLES_SOURCE": "",
        "TRANSIT_RECORDS_DIR": str(records),
        "TRANSIT_INGEST_INTERVAL": "0.3",
        "TRANSIT_METRICS_REFRESH": "0.2",
    }
    gunicorn = transit_sidecar(env, tmp_path / "gunicorn.log")
    try:
        gunicorn.wait_ready(60)

        def qty(n: int) -> Callable[[], bool]:
            def check() -> bool:
                r = gunicorn.get("/v2/metrics/demand/by_agency/day")
                # A worker that rendered before the other's first ingest serves `[]`: not yet.
                days = r.json()[0]["data"] if r.status_code == 200 and r.json() else {}
                return days.get("2026-11-20", {}).get("qty") == n

            return check

        gunicorn.wait_steady(qty(5), "first ingest served by both workers")
        append_lines(records / "validations.csv", [",".join(map(str, rows[0]))] * 2)
        gunicorn.wait_steady(qty(7), "appended records picked up")
        r = gunicorn.get("/v2/locations/districts")
        assert len(r.json()["data"]) == 20
    finally:
        status = gunicorn.terminate(30)
    assert status == 0, gunicorn.log()[-3000:]
    conn = sqlite3.connect(records / "metrics.sqlite")
    assert conn.execute("SELECT count(*) FROM validations").fetchone()[0] == 7
    assert conn.execute("SELECT sum(qty) FROM demand_day").fetchone()[0] == 7
    conn.close()
