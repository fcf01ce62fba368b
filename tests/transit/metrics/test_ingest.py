"""Metrics ingest: operational days, idempotence, appends, rewrites, malformed rows, the CLI."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from datetime import date
from pathlib import Path

import pytest

from sidecars.transit.metrics.db import MetricsDB, MetricsDBError, input_files
from sidecars.transit.metrics.records import day_number

from ..helpers import BRISBANE, LISBON
from .records import append_lines, iso, validation, write_csv, write_jsonl

REPO = Path(__file__).resolve().parents[3]


def demand(db: MetricsDB) -> dict[tuple[date, str, str, str], int]:
    rows = db.conn.execute(
        "SELECT op_day, agency, line, stop, qty FROM demand_day WHERE qty > 0"
    ).fetchall()
    return {
        (date.fromordinal(d + date(1970, 1, 1).toordinal()), a, li, s): q for d, a, li, s, q in rows
    }


def test_operational_day_boundaries_dst_and_months(tmp_path: Path) -> None:
    rows = [
        # 03:59 still belongs to the day before; 04:00 starts the new operational day.
        validation("2026-11-20T03:59:59", "41", "1001", "010001"),
        validation("2026-11-20T04:00:00", "41", "1001", "010001"),
        # 2 a.m. on the 1st of the month counts for the last day of the previous month.
        validation("2026-11-01T02:00:00", "41", "1001", "010001"),
        validation("2026-11-01T05:00:00", "41", "1001", "010001"),
        # Invalid validations are stored but are not demand.
        validation("2026-11-20T05:00:00", "41", "1001", "010001", valid=0),
    ]
    # DST ends on 2026-10-25 in Lisbon (02:00 WEST -> 01:00 WET): 03:30 WET is still the 24th,
    # 04:30 WET is the 25th; the offsets are written explicitly.
    rows += [
        ("2026-10-25T03:30:00+00:00", "42", "2002", "020002", "", 1),
        ("2026-10-25T04:30:00+00:00", "42", "2002", "020002", "", 1),
        # Unix seconds are accepted too: 2026-10-25T03:59:00Z is 03:59 WET.
        (str(1792900740), "42", "2002", "020002", "", "true"),
    ]
    path = write_csv(tmp_path / "validations.csv", rows)
    db = MetricsDB(tmp_path / "m.sqlite", LISBON)
    report = db.ingest([path])
    assert report is not None and report.rejected == 0
    assert report.accepted["validations"] == 8
    assert demand(db) == {
        (date(2026, 11, 19), "41", "1001", "010001"): 1,
        (date(2026, 11, 20), "41", "1001", "010001"): 1,
        (date(2026, 10, 31), "41", "1001", "010001"): 1,
        (date(2026, 11, 1), "41", "1001", "010001"): 1,
        (date(2026, 10, 24), "42", "2002", "020002"): 2,
        (date(2026, 10, 25), "42", "2002", "020002"): 1,
    }
    invalid = db.conn.execute("SELECT sum(invalid) FROM demand_day").fetchone()[0]
    assert invalid == 1


def test_aggregates_match_an_independent_count(tmp_path: Path) -> None:
    """A few hundred validations spread over days, agencies, lines and stops."""
    rows = []
    expected: Counter[tuple[date, str, str, str]] = Counter()
    for i in range(600):
        day = 1 + i % 9
        hour = (i * 7) % 24
        agency = ("41", "42", "43")[i % 3]
        line, stop = f"{agency[1]}00{i % 4}", f"0{i % 5}0000"
        valid = 0 if i % 11 == 0 else 1
        rows.append(
            validation(f"2026-11-{day:02d}T{hour:02d}:{i % 60:02d}:00", agency, line, stop, valid)
        )
        op = (
            date(2026, 11, day if hour >= 4 else day - 1)
            if not (day == 1 and hour < 4)
            else date(2026, 10, 31)
        )
        if valid:
            expected[(op, agency, line, stop)] += 1
    path = write_csv(tmp_path / "validations.csv", rows)
    db = MetricsDB(tmp_path / "m.sqlite", LISBON)
    db.ingest([path])
    assert demand(db) == dict(expected)
    # A full recompute gives the same table as the incremental refresh.
    db.refresh(None)
    assert demand(db) == dict(expected)


def test_reingest_copy_append_partial_line_and_rewrite(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "validations.csv",
        [validation("2026-11-20T08:00", "41", "1001", "010001") for _ in range(3)],
    )
    db = MetricsDB(tmp_path / "m.sqlite", LISBON)
    assert db.ingest([path]).accepted["validations"] == 3  # type: ignore[union-attr]
    # The same file again: nothing new.
    again = db.ingest([path])
    assert again is not None and again.accepted["validations"] == 0
    # The same records under another name (a re-delivered copy): recognised, not counted.
    copy = tmp_path / "validations-copy.csv"
    shutil.copy(path, copy)
    dup = db.ingest([copy])
    assert dup is not None and dup.accepted["validations"] == 0 and dup.duplicates == 3
    # Appended lines are read from the saved offset; a line without its newline yet (a writer
    # in the middle of an append) waits for the next run.
    row = ",".join(map(str, validation("2026-11-20T09:00", "41", "1001", "010001")))
    append_lines(path, [row])
    with open(path, "a", encoding="utf-8") as f:
        f.write(row[:10])
    more = db.ingest([path])
    assert more is not None and more.accepted["validations"] == 1 and more.rejected == 0
    with open(path, "a", encoding="utf-8") as f:
        f.write(row[10:] + "\n")
    assert db.ingest([path]).accepted["validations"] == 1  # type: ignore[union-attr]
    total = db.conn.execute("SELECT sum(qty) FROM demand_day").fetchone()[0]
    assert total == 5
    # Rewritten in place (same first record, different content before the offset): the
    # file's old rows are dropped and it is read again, so nothing is counted twice.
    write_csv(
        path,
        [validation("2026-11-20T08:00", "41", "1001", "010001")]
        + [validation("2026-11-20T10:00", "41", "1001", "010009") for _ in range(2)],
    )
    db.ingest([path])
    assert demand(db) == {
        (date(2026, 11, 20), "41", "1001", "010009"): 2,
        (date(2026, 11, 20), "41", "1001", "010001"): 1,
    }


def test_rides_and_complaints_are_upserted_by_natural_key(tmp_path: Path) -> None:
    rides = write_csv(
        tmp_path / "rides.csv",
        [("20261120", "41", "1001", "T1", "08:00:00", 1, 1, 10, 10, 30, 0)],
    )
    complaints = write_csv(
        tmp_path / "complaints.csv", [("C1", "20261120", "complaint", "email", "1001", "")]
    )
    db = MetricsDB(tmp_path / "m.sqlite", LISBON)
    db.ingest([rides, complaints])
    # A corrected ride and the same complaint in a later file replace, not add.
    rides2 = write_csv(
        tmp_path / "rides-2.csv",
        [("20261120", "41", "1001", "T1", "08:00:00", 0, 1, 10, 10, 400, 0)],
    )
    complaints2 = write_csv(
        tmp_path / "complaints-2.csv", [("C1", "20261120", "complaint", "phone", "1001", "")]
    )
    report = db.ingest([rides2, complaints2])
    assert report is not None and report.duplicates == 2
    assert db.conn.execute("SELECT one, delay FROM rides").fetchall() == [(0, 400)]
    assert db.conn.execute("SELECT channel FROM complaints").fetchall() == [("phone",)]
    # A start past 24:00 is on the next calendar day (01:10 Lisbon on the 21st).
    late = write_csv(
        tmp_path / "rides-3.csv",
        [("20261120", "41", "1001", "T9", "25:10:00", 1, 1, 10, 10, "", 0)],
    )
    db.ingest([late])
    start, delay = db.conn.execute(
        "SELECT start_unix, delay FROM rides WHERE trip = 'T9'"
    ).fetchone()
    assert start == 1795223400 and delay is None


def test_malformed_rows_are_reported_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "validations.csv"
    good = ",".join(map(str, validation("2026-11-20T08:00", "41", "1001", "010001")))
    path.write_text(
        "time,agency_id,line_id,stop_id,vehicle_id,valid\n"
        + good
        + "\n"
        + "2026-11-20T08:00:00,41,1001,010001,41|1,1,extra\n"  # 3
        + "yesterday,41,1001,010001,41|1,1\n"  # 4
        + "2026-11-20T08:00:00,41,1001,010001,41|1,1\n"  # 5: no offset
        + iso("2026-11-20T08:00")
        + ",,1001,010001,41|1,1\n"  # 6
        + iso("2026-11-20T08:00")
        + ",41,1001,010001,41|1,maybe\n"  # 7
        + "\n"  # 8
        + iso("2026-11-20T08:00")
        + ',41,"1001,010001,41|1,1\n'  # 9: open quote
        + good
        + "\n",  # 10
        encoding="utf-8",
    )
    db = MetricsDB(tmp_path / "m.sqlite", LISBON)
    report = db.ingest([path])
    assert report is not None
    assert report.accepted["validations"] == 2 and report.rejected == 7
    got = [(r.line, r.reason) for r in report.rejects]
    assert got == [
        (3, "expected 6 fields, got 7"),
        (4, "time='yesterday' is not ISO 8601 or Unix seconds"),
        (5, "time='2026-11-20T08:00:00' has no UTC offset"),
        (6, "agency_id is empty"),
        (7, "valid='maybe' is not a boolean (0/1/true/false)"),
        (8, "empty line"),
        (9, got[6][1]),
    ]
    assert got[6][1].startswith("bad CSV quoting")
    assert all(r.file == str(path) for r in report.rejects)
    # Every reject is kept in the store too, and counted on the file.
    assert db.conn.execute("SELECT count(*) FROM rejects").fetchone()[0] == 7
    assert db.conn.execute("SELECT accepted, rejected FROM files").fetchone() == (2, 7)


def test_jsonl_records_and_their_errors(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "validations.jsonl",
        [
            {
                "time": iso("2026-11-20T08:00"),
                "agency_id": "41",
                "line_id": "1001",
                "stop_id": "010001",
                "valid": True,
            },
            {
                "time": 1795680000,
                "agency_id": 41,
                "line_id": 1001,
                "stop_id": "010001",
                "vehicle_id": "41|2",
                "valid": 1,
            },
            {"time": iso("2026-11-20T08:00"), "agency_id": "41", "line_id": "1001", "valid": True},
            [1, 2],
        ],
    )
    append_lines(path, ["{not json"])
    db = MetricsDB(tmp_path / "m.sqlite", LISBON)
    report = db.ingest([path])
    assert report is not None and report.accepted["validations"] == 2
    assert [(r.line, r.reason.split(":")[0]) for r in report.rejects] == [
        (3, "missing field(s) stop_id"),
        (4, "a JSON Lines record must be an object"),
        (5, "invalid JSON"),
    ]
    rows = db.conn.execute("SELECT agency, line, vehicle FROM validations ORDER BY t").fetchall()
    assert rows == [("41", "1001", ""), ("41", "1001", "41|2")]


def test_bad_header_and_unknown_names(tmp_path: Path) -> None:
    bad = tmp_path / "rides.csv"
    bad.write_text("operational_date,agency_id\n20261120,41\n", encoding="utf-8")
    other = tmp_path / "notes.csv"
    other.write_text("a\n", encoding="utf-8")
    db = MetricsDB(tmp_path / "m.sqlite", LISBON)
    report = db.ingest([bad, other])
    assert report is not None and report.rejected == 2
    assert (
        report.rejects[0].line == 1 and "header lacks column(s) line_id" in report.rejects[0].reason
    )
    assert input_files(tmp_path) == [bad]


def test_store_is_pinned_to_its_timezone(tmp_path: Path) -> None:
    MetricsDB(tmp_path / "m.sqlite", LISBON).close()
    with pytest.raises(MetricsDBError, match="timezone"):
        MetricsDB(tmp_path / "m.sqlite", BRISBANE)


def test_writer_lock_lets_one_process_ingest(tmp_path: Path) -> None:
    db = MetricsDB(tmp_path / "m.sqlite", LISBON)
    other = MetricsDB(tmp_path / "m.sqlite", LISBON)
    with db.writer_lock(wait=False) as got:
        assert got
        assert other.ingest([], wait=False) is None


def test_cli_ingest_reports_rejects_and_is_idempotent(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    write_csv(records / "validations.csv", [validation("2026-11-20T08:00", "41", "1001", "010001")])
    append_lines(records / "validations.csv", ["garbage"])
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "TRANSIT_RECORDS_DIR": str(records),
        "TRANSIT_TIMEZONE": "Europe/Lisbon",
    }
    cmd = [sys.executable, "-m", "sidecars.transit.metrics", "ingest"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 2, first.stderr
    assert f"{records / 'validations.csv'}:3: expected 6 fields, got 1" in first.stderr
    assert '"validations":1' in first.stdout
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and '"validations":0' in second.stdout
    conn = sqlite3.connect(records / "metrics.sqlite")
    assert conn.execute("SELECT count(*) FROM validations").fetchone()[0] == 1
    assert conn.execute("SELECT op_day FROM demand_day").fetchone()[0] == day_number(
        date(2026, 11, 20)
    )
    conn.close()
