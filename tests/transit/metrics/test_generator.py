"""The synthetic record generator: its output loads cleanly and matches what it reports."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sidecars.transit.metrics.db import MetricsDB, input_files
from sidecars.transit.metrics.schemas import IngestReport

from ..helpers import BRISBANE, CAIRNS_ZIP

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "transit" / "metrics" / "generate.py"


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("transit_metrics_generate", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generate_and_ingest(tmp_path: Path, *options: str) -> tuple[MetricsDB, IngestReport | None]:
    """Run the generator on the Cairns feed up to 2026-11-20 with `options` (into
    tmp_path/records), then ingest what it wrote into a new MetricsDB; (db, ingest report)."""
    out = tmp_path / "records"
    args = [str(out), "--gtfs", str(CAIRNS_ZIP), "--end", "2026-11-20", *options]
    assert _generator().main(args) == 0
    db = MetricsDB(tmp_path / "m.sqlite", BRISBANE)
    return db, db.ingest(input_files(out))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_generated_records_load_without_rejects(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db, report = generate_and_ingest(
        tmp_path, "--days", "9", "--validations", "3000", "--complaints", "50", "--format", fmt
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["agencies"] == ["41", "42", "43", "44"] and summary["lines"] == 22
    assert report is not None and report.rejected == 0
    assert report.accepted == {
        "validations": summary["validations"],
        "rides": summary["rides"],
        "complaints": 50,
    }
    assert summary["validations"] == 3000
    days = db.conn.execute("SELECT min(op_day), max(op_day) FROM rides").fetchone()
    assert days[1] - days[0] == 8
    # Every validation is at a stop of the feed.
    stops = {r[0] for r in db.conn.execute("SELECT DISTINCT stop FROM validations")}
    assert all(s.startswith("75") and len(s) == 6 for s in stops)
    db.close()


def test_bad_rows_option_makes_rejects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, report = generate_and_ingest(
        tmp_path, "--days", "2", "--validations", "2000", "--complaints", "0", "--bad-rows", "0.05"
    )
    capsys.readouterr()
    assert report is not None and 50 <= report.rejected <= 150
    assert report.rejected + report.accepted["validations"] == 2000
    db.close()
