"""`python -m sidecars.transit.metrics`: load records into the metrics store.

    python -m sidecars.transit.metrics ingest [FILE ...]  # default: all of TRANSIT_RECORDS_DIR
    python -m sidecars.transit.metrics refresh            # recompute every aggregate

Settings come from the same `TRANSIT_*` variables as the server (options override them). The
timezone is TRANSIT_TIMEZONE, else the agency timezone of TRANSIT_GTFS_SOURCE (a local file).
Every rejected row is printed to stderr as `file:line: reason`; the JSON report goes to stdout.
Exit status: 0, or 2 when rows were rejected (the good rows are loaded either way).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from zoneinfo import ZoneInfo

from ..gtfs import feed_timezone
from ..schemas import json_encoder
from ..settings import SettingsError, TransitSettings
from ..source import SourceError
from .db import MetricsDB, MetricsDBError, input_files


def main(argv: list[str] | None = None) -> int:
    """Run the CLI."""
    parser = argparse.ArgumentParser(prog="python -m sidecars.transit.metrics")
    parser.add_argument("command", choices=("ingest", "refresh"))
    parser.add_argument("files", nargs="*", type=Path, help="input files (default: records dir)")
    parser.add_argument("--records-dir", type=Path, help="overrides TRANSIT_RECORDS_DIR")
    parser.add_argument("--db", type=Path, help="overrides TRANSIT_METRICS_DB")
    parser.add_argument("--timezone", help="overrides TRANSIT_TIMEZONE / the feed timezone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        # The feed is only read for its timezone, when none is given.
        settings = TransitSettings.from_env(feed_required=False)
        feed = settings.feed
        # The options override the settings, the store's default place included.
        metrics = dataclasses.replace(
            settings.metrics,
            records_dir=str(args.records_dir) if args.records_dir else settings.metrics.records_dir,
            db=str(args.db) if args.db else settings.metrics.db,
        )
        records_dir = Path(metrics.records_dir) if metrics.records_dir else None
        db_path = metrics.db_path
        if db_path is None:
            parser.error("no store: set TRANSIT_METRICS_DB or TRANSIT_RECORDS_DIR (or --db)")
        tz_name = args.timezone or feed.timezone
        if not tz_name and not feed.source:
            parser.error("no timezone: set TRANSIT_TIMEZONE or TRANSIT_GTFS_SOURCE (or --timezone)")
        tz = ZoneInfo(tz_name) if tz_name else feed_timezone(feed.source)
        db = MetricsDB(db_path, tz, feed.operational_day_start_hour)
    except (SettingsError, SourceError, MetricsDBError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        if args.command == "refresh":
            seconds = db.refresh(None)
            db._bump_generation()
            print(json_encoder.encode({"refresh_seconds": round(seconds, 3)}).decode())
            return 0
        files = args.files or (input_files(records_dir) if records_dir else [])
        if not files:
            print("error: no input files", file=sys.stderr)
            return 1
        db.log_rejects = sys.maxsize
        report = db.ingest(files, wait=True)
        assert report is not None  # waited for the lock
        print(json_encoder.encode(report).decode())
        return 2 if report.rejected else 0
    finally:
        db.close()


if __name__ == "__main__":
    sys.exit(main())
