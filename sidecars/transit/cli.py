"""`python -m sidecars.transit validate`: the validation report of a feed before deploying it.

    python -m sidecars.transit validate [FEED] [--against SERVED_FEED]
        [--format text|json|mobilitydata] [--output FILE]

FEED defaults to TRANSIT_GTFS_SOURCE; the other TRANSIT_* settings (skipped and dropped
shares, distance unit, locations) apply as in the server. `--against` compares with the feed
being served, as a refresh does. The report is the one `/status/feed` serves: counts per notice
code and the first examples with file:line; `--format mobilitydata` writes it in the shape of
MobilityData's validator's `report.json` (`summary`, `notices[{code, severity, totalNotices,
sampleNotices}]`) for tools that read that. Exit status 0 when the server would serve the feed
(rows may have been skipped: see the report), 1 when it would reject it.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from .gtfs import FeedError
from .places.locations import Locations, LocationsError
from .schemas import ValidationReport, json_encoder
from .settings import SettingsError, TransitSettings
from .source import FeedFiles, SourceError, is_url, redact
from .store import build_network, source_report

# MobilityData has three severities; a fatal notice is one of its errors that rejects the feed.
MD_SEVERITY = {"fatal": "ERROR", "error": "ERROR", "warning": "WARNING", "info": "INFO"}
MD_COUNTS = {"Agencies": "agency.txt", "Stops": "stops.txt", "Routes": "routes.txt",
             "Trips": "trips.txt"}  # fmt: skip


# feed_info.txt and agency.txt columns under the names of MobilityData's report.json.
MD_FEED_INFO = {
    "publisherName": "feed_publisher_name",
    "publisherUrl": "feed_publisher_url",
    "feedLanguage": "feed_lang",
    "feedStartDate": "feed_start_date",
    "feedEndDate": "feed_end_date",
    "feedVersion": "feed_version",
    "feedEmail": "feed_contact_email",
    "feedContactUrl": "feed_contact_url",
}
MD_AGENCY = {"name": "agency_name", "url": "agency_url", "phone": "agency_phone",
             "email": "agency_email", "timezone": "agency_timezone"}  # fmt: skip


class Described(NamedTuple):
    """A validation report and what the feed says of itself (feed_info.txt, agency.txt)."""

    report: ValidationReport
    feed_info: dict[str, str]
    agencies: list[dict[str, str]]


def describe(files: FeedFiles) -> tuple[dict[str, str], list[dict[str, str]]]:
    """feed_info.txt's first row and agency.txt's rows, in MobilityData's names (a file
    missing or unreadable: empty; the report says why)."""

    def rows(name: str) -> list[dict[str, str]]:
        if name not in files.names():
            return []
        try:
            with files.open_text(name) as fh:
                return [{(k or "").strip(): (v or "").strip() for k, v in r.items()}
                        for r in csv.DictReader(fh)]  # fmt: skip
        except (csv.Error, UnicodeDecodeError, OSError, zipfile.BadZipFile):
            return []

    info = (rows("feed_info.txt") or [{}])[0]
    feed_info = {key: info.get(column, "") for key, column in MD_FEED_INFO.items()}
    agencies = [
        {key: row.get(column, "") for key, column in MD_AGENCY.items()}
        for row in rows("agency.txt")
    ]
    return feed_info, agencies


def validate(settings: TransitSettings, source: str, against: str | None = None) -> Described:
    """Validate a feed exactly as the server's refresh does; the report either way, and what
    the feed says of itself."""
    feed = settings.feed
    timeout = settings.http_timeout_seconds
    digest: str | None = None
    locations_dir = settings.places.locations_dir
    locations = Locations(Path(locations_dir)) if locations_dir else None
    # Run by the operator on their machine: a local path is shown whole, a URL redacted.
    shown = (redact(source) or source) if is_url(source) else source
    # The server's clock: a pinned TRANSIT_NOW decides, here as there, whether the feed's
    # calendars have expired.
    now = settings.now.timestamp() if settings.now is not None else time.time()
    feed_info: dict[str, str] = {}
    agencies: list[dict[str, str]] = []
    try:
        served = (
            build_network(FeedFiles.load(against, timeout, bounds=feed.bounds), feed)
            if against
            else None
        )
        files = FeedFiles.load(source, timeout, feed.headers, feed.bounds)
        digest = files.digest
        feed_info, agencies = describe(files)
        report = build_network(files, feed, served, locations, now).raw.report
    except FeedError as exc:
        report = exc.report
    except SourceError as exc:
        report = source_report(shown, exc)
    return Described(report.summary(shown, digest, int(now)), feed_info, agencies)


def mobilitydata(described: Described) -> dict[str, Any]:
    """The report in the shape of MobilityData's `report.json`, with its `feedInfo` and
    `agencies`."""
    report = described.report
    rows = {f.file: f.rows - f.skipped for f in report.files}
    summary = {
        "validatorVersion": "ratelimitd transit sidecar",
        "validatedAt": datetime.fromtimestamp(report.validated_at, UTC).isoformat(),
        "gtfsInput": report.source,
        "feedVersion": report.version,
        "accepted": report.accepted,
        "files": [f.file for f in report.files],
        "counts": {name: rows.get(file, 0) for name, file in MD_COUNTS.items()},
        "feedInfo": described.feed_info,
        "agencies": described.agencies,
    }
    notices = []
    for n in report.notices:
        samples = []
        for p in n.examples:
            sample: dict[str, Any] = {"filename": p.file, "message": p.message}
            if p.line is not None:
                sample["csvRowNumber"] = p.line
            if p.dropped:
                sample["droppedRows"] = p.dropped
            samples.append(sample)
        notices.append(
            {
                "code": n.code,
                "severity": MD_SEVERITY[n.severity],
                "totalNotices": n.count,
                "sampleNotices": samples,
            }
        )
    return {"summary": summary, "notices": notices}


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
        if n.dropped:
            with_it = ", ".join(f"{rows:,} of {file}" for file, rows in n.dropped.items())
            out.write(f"    (rows dropped with them: {with_it})\n")
        for p in n.examples:
            where = f"{p.file}:{p.line}" if p.line else p.file
            dropped = ""
            if p.dropped:
                dropped = (
                    " [with it: "
                    + ", ".join(f"{rows:,} of {file}" for file, rows in p.dropped.items())
                    + "]"
                )
            out.write(f"    {where}: {p.message}{dropped}\n")


def main(argv: list[str]) -> int:
    """Run `validate`."""
    parser = argparse.ArgumentParser(prog="python -m sidecars.transit validate")
    parser.add_argument("feed", nargs="?", help="URL, zip or directory (TRANSIT_GTFS_SOURCE)")
    parser.add_argument("--against", help="the feed being served, to check what a refresh drops")
    parser.add_argument(
        "--format",
        choices=("text", "json", "mobilitydata"),
        default="text",
        help="text for people, json as /status/feed serves it, mobilitydata as report.json",
    )
    parser.add_argument("--json", action="store_true", help="the same as --format json")
    parser.add_argument("--output", type=Path, help="write the report here, not to stdout")
    args = parser.parse_args(argv)
    try:
        settings = TransitSettings.from_env(feed_required=args.feed is None)
        described = validate(settings, args.feed or settings.feed.source, args.against)
    except (SettingsError, LocationsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = described.report
    fmt = "json" if args.json else args.format
    out = args.output.open("w", encoding="utf-8") if args.output else sys.stdout
    try:
        if fmt == "json":
            out.write(json_encoder.encode(report).decode() + "\n")
        elif fmt == "mobilitydata":
            out.write(json_encoder.encode(mobilitydata(described)).decode() + "\n")
        else:
            render(report, out)
    finally:
        if args.output:
            out.close()
    return 0 if report.accepted else 1
