"""Ingest rate and aggregate refresh time of the metrics store.

    python bench/transit/metrics/ingest.py RECORDS_DIR [--db /tmp/bench.sqlite]
        [--timezone Australia/Brisbane]

Starts from an empty store, ingests every file of RECORDS_DIR (as the CLI and the server do:
parse, validate, insert, then refresh `demand_day` for the touched days), then times a full
recompute of the aggregate, a one-day refresh, the rendering of every aggregate body, one
videowall tick and a no-op re-ingest. Prints one JSON object describing the machine too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sqlite3
import sys
import time
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[3]

from sidecars.transit.gtfs import feed_timezone  # noqa: E402
from sidecars.transit.metrics.db import MetricsDB, input_files  # noqa: E402
from sidecars.transit.metrics.records import day_of  # noqa: E402
from sidecars.transit.metrics.service import AGGREGATE_VIEWS  # noqa: E402
from sidecars.transit.metrics.views import Calendar, compute_aggregates, videowall  # noqa: E402
from sidecars.transit.schemas import json_encoder  # noqa: E402
from sidecars.transit.settings import DEFAULT_GTFS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("records", type=Path)
    parser.add_argument("--db", type=Path, default=Path("/tmp/transit_metrics_bench.sqlite"))
    parser.add_argument("--timezone", default=None)
    parser.add_argument(
        "--refresh-only", action="store_true", help="time the recomputes on an existing --db"
    )
    args = parser.parse_args(argv)
    if args.refresh_only:
        tz = ZoneInfo(args.timezone) if args.timezone else feed_timezone(DEFAULT_GTFS)
        db = MetricsDB(args.db, tz)
        full = db.refresh(None)
        last_day = db.conn.execute("SELECT max(op_day) FROM validations").fetchone()[0]
        one_day = db.refresh({last_day})
        rows = db.conn.execute("SELECT count(*) FROM validations").fetchone()[0]
        print(
            json.dumps(
                {
                    "validations": rows,
                    "full_refresh_seconds": round(full, 2),
                    "one_day_refresh_seconds": round(one_day, 3),
                    "load_average_at_end": os.getloadavg(),
                }
            )
        )
        return 0
    for suffix in ("", "-wal", "-shm", ".lock"):
        Path(str(args.db) + suffix).unlink(missing_ok=True)
    tz = ZoneInfo(args.timezone) if args.timezone else feed_timezone(DEFAULT_GTFS)
    files = input_files(args.records)
    sizes = {p.name: p.stat().st_size for p in files}
    db = MetricsDB(args.db, tz)

    t0 = time.monotonic()
    report = db.ingest(files)
    wall = time.monotonic() - t0
    assert report is not None
    records = sum(report.accepted.values()) + report.rejected

    full = db.refresh(None)
    last_day = db.conn.execute("SELECT max(op_day) FROM validations").fetchone()[0]
    one_day = db.refresh({last_day})

    today = day_of(last_day)
    now = time.time()
    t0 = time.monotonic()
    agg = compute_aggregates(db.conn, today, day_of(0), now, Calendar())
    # The service's aggregate bodies (by_agency_year is a constant `[]` there).
    encoded = sum(len(json_encoder.encode(getattr(agg, name))) for name in AGGREGATE_VIEWS)
    render = time.monotonic() - t0
    t0 = time.monotonic()
    videowall(db.conn, today, now)
    wall_tick = time.monotonic() - t0

    t0 = time.monotonic()
    again = db.ingest(files)
    noop = time.monotonic() - t0
    assert again is not None and sum(again.accepted.values()) == 0
    db.close()

    conn = sqlite3.connect(args.db)
    counts = {
        t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in ("validations", "rides", "complaints", "demand_day")
    }
    conn.close()
    print(
        json.dumps(
            {
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "sqlite": sqlite3.sqlite_version,
                    "load_average_at_end": os.getloadavg(),
                },
                "input_bytes": sizes,
                "accepted": report.accepted,
                "rejected": report.rejected,
                "ingest_seconds_total": round(wall, 2),
                "ingest_parse_insert_seconds": report.seconds,
                "ingest_aggregate_merge_seconds": report.refresh_seconds,
                "records_per_second": round(records / wall),
                "validations_per_second_parse_insert": round(
                    report.accepted["validations"] / report.seconds
                )
                if report.seconds
                else None,
                "full_refresh_seconds": round(full, 2),
                "one_day_refresh_seconds": round(one_day, 3),
                "render_aggregate_bodies_seconds": round(render, 2),
                "aggregate_body_bytes": encoded,
                "videowall_tick_seconds": round(wall_tick, 3),
                "noop_reingest_seconds": round(noop, 3),
                "store_rows": counts,
                "store_bytes": args.db.stat().st_size,
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
