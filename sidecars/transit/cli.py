"""`python -m sidecars.transit validate`: the validation report of a feed before deploying it.

    python -m sidecars.transit validate [FEED] [--against SERVED_FEED] [--json]

FEED defaults to TRANSIT_GTFS_SOURCE; the other TRANSIT_* settings (skipped and dropped
shares, distance unit, locations) apply as in the server. `--against` compares with the feed
being served, as a refresh does. The report is the one `/status/feed` serves: counts per notice
code and the first examples with file:line. Exit status 0 when the server would serve the feed
(rows may have been skipped: see the report), 1 when it would reject it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

from .gtfs import FeedError, Report
from .places.locations import Locations, LocationsError
from .schemas import ValidationReport, json_encoder
from .settings import SettingsError, TransitSettings
from .source import FeedFiles, SourceError
from .store import build_network


def validate(
    settings: TransitSettings, source: str, against: str | None = None
) -> ValidationReport:
    """Validate a feed exactly as the server's refresh does; the report either way."""
    feed = settings.feed
    timeout = settings.http_timeout_seconds
    digest: str | None = None
    locations_dir = settings.places.locations_dir
    locations = Locations(Path(locations_dir)) if locations_dir else None
    try:
        served = build_network(FeedFiles.load(against, timeout), feed) if against else None
        files = FeedFiles.load(source, timeout)
        digest = files.digest
        report = build_network(files, feed, served, locations, time.time()).raw.report
    except FeedError as exc:
        report = exc.report
    except SourceError as exc:
        report = Report()
        report.add("unreadable_file", source, None, str(exc))
    return report.summary(source, digest, int(time.time()))


def render(report: ValidationReport, out: TextIO) -> None:
    """The report as text: verdict, rows per file, then each notice code with examples."""
    verdict = "ACCEPTED" if report.accepted else "REJECTED"
    out.write(
        f"{report.source}: {verdict} ({report.fatal} fatal, {report.errors} row(s) skipped "
        f"for errors, {report.warnings} warning(s))\n"
    )
    for f in report.files:
        out.write(f"  {f.file}: {f.rows:,} rows, {f.skipped:,} skipped\n")
    for n in report.notices:
        out.write(f"{n.severity:<8}{n.code} x{n.count}: {n.description}\n")
        for p in n.examples:
            where = f"{p.file}:{p.line}" if p.line else p.file
            out.write(f"    {where}: {p.message}\n")


def main(argv: list[str]) -> int:
    """Run `validate`."""
    parser = argparse.ArgumentParser(prog="python -m sidecars.transit validate")
    parser.add_argument("feed", nargs="?", help="URL, zip or directory (TRANSIT_GTFS_SOURCE)")
    parser.add_argument("--against", help="the feed being served, to check what a refresh drops")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        settings = TransitSettings.from_env(feed_required=args.feed is None)
        report = validate(settings, args.feed or settings.feed.source, args.against)
    except (SettingsError, LocationsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json_encoder.encode(report).decode() + "\n")
    else:
        render(report, sys.stdout)
    return 0 if report.accepted else 1
