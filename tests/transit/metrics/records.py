"""Record files of the metrics tests (validations, rides, complaints) in Lisbon time."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from sidecars.transit.metrics.records import COLUMNS

from ..helpers import LISBON


def iso(text: str, tz: ZoneInfo = LISBON) -> str:
    """ISO 8601 with the UTC offset of a wall-clock time in `tz`."""
    return datetime.fromisoformat(text).replace(tzinfo=tz).isoformat()


def write_csv(path: Path, rows: Iterable[Sequence[object]], kind: str | None = None) -> Path:
    """A CSV record file with the kind's header (from the file name unless given)."""
    kind = kind or path.name.split(".")[0].split("-")[0]
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS[kind])
        w.writerows(rows)
    return path


def append_lines(path: Path, lines: Iterable[str]) -> None:
    """Append raw lines (each gets a newline)."""
    with open(path, "a", encoding="utf-8", newline="") as f:
        for line in lines:
            f.write(line + "\n")


def write_jsonl(path: Path, objects: Iterable[dict]) -> Path:
    """A JSON Lines record file."""
    with open(path, "w", encoding="utf-8") as f:
        for obj in objects:
            f.write(json.dumps(obj) + "\n")
    return path


def validation(when: str, agency: str, line: str, stop: str, valid: int = 1) -> tuple:
    """A validations.csv row at a Lisbon wall-clock time."""
    return (iso(when), agency, line, stop, f"{agency}|1", valid)


def ride(
    day: str,
    agency: str,
    line: str,
    trip: str,
    start: str,
    one: int = 1,
    three: int = 1,
    svkm: float = 10.0,
    dvkm: float = 10.0,
    delay: object = 60,
    empty: int = 0,
) -> tuple:
    """A rides.csv row."""
    return (day, agency, line, trip, start, one, three, svkm, dvkm, delay, empty)
