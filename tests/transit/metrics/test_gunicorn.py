"""Metrics under real gunicorn with 2 uvicorn workers: both workers ingest on their schedule
(one at a time, through the store's lock), pick up appended records, and never double count."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from .records import append_lines, validation, write_csv

REPO = Path(__file__).resolve().parents[3]
FRESH = {"Connection": "close"}
LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")


def _until(check: Callable[[], bool], what: str, log: list[str], seconds: float = 60) -> None:
    """Until `check` holds 10 times in a row (fresh connections reach both workers)."""
    deadline = time.monotonic() + seconds
    streak = 0
    while streak < 10:
        assert time.monotonic() < deadline, f"{what}:\n" + "".join(log[-30:])
        try:
            ok = check()
        except httpx.TransportError:
            ok = False
        streak = streak + 1 if ok else 0
        if not ok:
            time.sleep(0.1)


def test_two_workers_ingest_on_schedule(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    rows = [validation("2026-11-20T08:00", "41", "1001", "010001")] * 5
    write_csv(records / "validations.csv", rows)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore::DeprecationWarning",
        "TRANSIT_NOW": "2026-11-20T10:00:00+00:00",
        "TRANSIT_TIMEZONE": "Europe/Lisbon",
        "TRANSIT_VEHICLES_SOURCE": "",
        "TRANSIT_RECORDS_DIR": str(records),
        "TRANSIT_INGEST_INTERVAL": "0.3",
        "TRANSIT_METRICS_REFRESH": "0.2",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-k",
            "uvicorn.workers.UvicornWorker",
            "-w",
            "2",
            "-b",
            "127.0.0.1:0",
            "sidecars.transit.asgi:app()",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    log: list[str] = []
    port: list[str] = []
    found = threading.Event()

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            match = LISTENING.search(line)
            if match and not port:
                port.append(match.group(1))
                found.set()
        found.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert found.wait(60) and port, "gunicorn did not start:\n" + "".join(log)
        url = f"http://127.0.0.1:{port[0]}/v2/metrics/demand/by_agency/day"

        def qty(n: int) -> Callable[[], bool]:
            def check() -> bool:
                r = httpx.get(url, headers=FRESH, timeout=5)
                return r.status_code == 200 and r.json()[0]["data"]["2026-11-20"]["qty"] == n

            return check

        _until(qty(5), "first ingest not served by both workers", log)
        append_lines(records / "validations.csv", [",".join(map(str, rows[0]))] * 2)
        _until(qty(7), "appended records not picked up", log)
        r = httpx.get(f"http://127.0.0.1:{port[0]}/v2/locations/districts", headers=FRESH)
        assert len(r.json()["data"]) == 20
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        status = proc.wait(30)
        reader.join(10)
        assert proc.stderr is not None
        proc.stderr.close()
    assert status == 0, "".join(log[-30:])
    conn = sqlite3.connect(records / "metrics.sqlite")
    assert conn.execute("SELECT count(*) FROM validations").fetchone()[0] == 7
    assert conn.execute("SELECT sum(qty) FROM demand_day").fetchone()[0] == 7
    conn.close()
