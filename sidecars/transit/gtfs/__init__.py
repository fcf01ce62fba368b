"""The static GTFS feed: parsed and validated into compact columns (`read_feed`), and the
agency timezone of a local feed without parsing it (`feed_timezone`).

- notices.py: the validation report (`Report`, the notice codes and their severities) and
  `FeedError`, raised with it when a feed is rejected;
- tables.py: the validated feed (`RawFeed`), CSV tables and the field checks;
- reader.py: `read_feed` and the small files; calendars.py: the service days (calendar,
  calendar_dates, feed_info) and their checks against today;
- stop_times.py: the four-million-row stop_times as `array` columns, and frequencies.
"""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..source import SourceError
from .notices import FeedError, Report
from .reader import read_feed
from .tables import NO_DROP_OFF, NO_PICKUP, RawFeed

__all__ = [
    "NO_DROP_OFF",
    "NO_PICKUP",
    "FeedError",
    "RawFeed",
    "Report",
    "feed_timezone",
    "read_feed",
]


def feed_timezone(source: str) -> ZoneInfo:
    """The agency timezone of a local GTFS zip or directory, read without parsing the feed
    (the metrics CLI has no loaded feed)."""
    path = Path(source)
    try:
        if path.is_dir():
            data = (path / "agency.txt").read_bytes()
        else:
            with zipfile.ZipFile(path) as z:
                name = next(n for n in z.namelist() if n.rsplit("/", 1)[-1] == "agency.txt")
                data = z.read(name)
    except (OSError, zipfile.BadZipFile, StopIteration) as exc:
        raise SourceError(f"{source}: no readable agency.txt ({exc})") from exc
    rows = list(csv.DictReader(io.StringIO(data.decode("utf-8-sig"))))
    tz = next((r.get("agency_timezone", "").strip() for r in rows if r.get("agency_timezone")), "")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise SourceError(f"{source}: no usable agency_timezone ({tz!r})") from None
