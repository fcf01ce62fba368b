"""The metrics store: raw records and their aggregates in one SQLite file.

Why SQLite and not DuckDB: it ships with Python (no dependency for the lead to carry in the
sidecar image), several gunicorn workers can read one file while one process writes it (WAL),
and the one heavy aggregate (valid validations per day, agency, line and stop) is a table SQLite
maintains during ingest by upserting each chunk's counts (see bench/transit/metrics). DuckDB
would group faster but adds a 50 MB wheel and allows only one writing process per file.

Ingest is incremental and idempotent: every input file is known by its *identity* (a hash of
its first record, so a renamed or re-delivered copy is recognised) and by how far it has been
read (byte offset, line count and a hash of the bytes just before the offset). Rows and the new
offset are committed in one transaction, so a crash never loads a row twice. A file whose
content before the offset changed was rewritten: its validations are dropped and it is read
again from the start. Rides and complaints also have natural keys and are upserted.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

import msgspec

from .records import (
    COLUMNS,
    KINDS,
    OPTIONAL,
    BadRow,
    DayClock,
    kind_of,
    parse_complaint,
    parse_ride,
    parse_validation,
)
from .schemas import IngestReject, IngestReport

log = logging.getLogger("sidecars.transit.metrics")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS files(
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, identity TEXT NOT NULL UNIQUE, path TEXT NOT NULL,
    header TEXT, offset INTEGER NOT NULL, lines INTEGER NOT NULL, tail TEXT NOT NULL,
    accepted INTEGER NOT NULL DEFAULT 0, rejected INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS validations(
    file_id INTEGER NOT NULL, t INTEGER NOT NULL, op_day INTEGER NOT NULL, agency TEXT NOT NULL,
    line TEXT NOT NULL, stop TEXT NOT NULL, vehicle TEXT NOT NULL, valid INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS validations_day ON validations(op_day);
CREATE TABLE IF NOT EXISTS rides(
    op_day INTEGER NOT NULL, agency TEXT NOT NULL, line TEXT NOT NULL, trip TEXT NOT NULL,
    start TEXT NOT NULL, start_unix INTEGER NOT NULL, one INTEGER NOT NULL, three INTEGER NOT NULL,
    svkm REAL NOT NULL, dvkm REAL NOT NULL, delay INTEGER, empty INTEGER NOT NULL,
    PRIMARY KEY(op_day, agency, trip)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS complaints(
    id TEXT PRIMARY KEY, day INTEGER NOT NULL, category TEXT NOT NULL, channel TEXT NOT NULL,
    line TEXT NOT NULL, municipality TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rejects(file TEXT NOT NULL, line INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS demand_day(
    op_day INTEGER NOT NULL, agency TEXT NOT NULL, line TEXT NOT NULL, stop TEXT NOT NULL,
    qty INTEGER NOT NULL, invalid INTEGER NOT NULL,
    PRIMARY KEY(op_day, agency, line, stop)) WITHOUT ROWID;
"""

INSERT = {
    "validations": "INSERT INTO validations VALUES (?,?,?,?,?,?,?,?)",
    "rides": "INSERT OR REPLACE INTO rides VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
    "complaints": "INSERT OR REPLACE INTO complaints VALUES (?,?,?,?,?,?)",
}
# Bytes read per step: bounds memory on a multi-gigabyte file.
CHUNK = 8 << 20
TAIL = 256
# The report and the log list this many rejected rows; all are counted and kept in `rejects`.
REPORT_REJECTS = 100
LOG_REJECTS = 20

_jsonl = msgspec.json.Decoder()


class MetricsDBError(Exception):
    """The store cannot be used with these settings (e.g. created for another timezone)."""


@dataclass
class _Run:
    accepted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    rejected: int = 0
    duplicates: int = 0
    files: int = 0
    rejects: list[IngestReject] = field(default_factory=list)
    merge_seconds: float = 0.0
    changed: bool = False
    log_limit: int = LOG_REJECTS

    def reject(self, file: str, line: int, reason: str) -> None:
        self.rejected += 1
        if len(self.rejects) < REPORT_REJECTS:
            self.rejects.append(IngestReject(file=file, line=line, reason=reason))
        if self.rejected <= self.log_limit:
            log.warning("%s:%d: %s", file, line, reason)


def connect(path: str | Path) -> sqlite3.Connection:
    """A connection with the store's schema and pragmas (WAL: readers never block the writer)."""
    conn = sqlite3.connect(str(path), timeout=60, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL under WAL: a power loss may lose the last commit, never corrupt the file; the
    # offsets roll back with the rows, so the next run reloads exactly what was lost.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA cache_size=-65536")
    conn.executescript(SCHEMA)
    return conn


class MetricsDB:
    """Writes records into the store and keeps the `demand_day` aggregate current."""

    def __init__(self, path: str | Path, tz: ZoneInfo, start_hour: int = 4) -> None:
        self.path = Path(path)
        self.tz = tz
        self.start_hour = start_hour
        # How many rejected rows one run logs one by one (the CLI logs them all).
        self.log_rejects = LOG_REJECTS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = connect(self.path)
        self._check_meta()

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def _check_meta(self) -> None:
        # Operational days are computed at ingest time; mixing two timezones or start hours in
        # one store would silently shift days, so the first ingest pins them.
        want = {"timezone": str(self.tz.key), "start_hour": str(self.start_hour)}
        have = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
        for key, value in want.items():
            if key in have and have[key] != value:
                raise MetricsDBError(
                    f"{self.path} was built with {key}={have[key]!r}, not {value!r}; "
                    "use another TRANSIT_METRICS_DB or rebuild it"
                )
        with transaction(self.conn):
            for key, value in want.items():
                self.conn.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (key, value))

    @contextlib.contextmanager
    def writer_lock(self, wait: bool) -> Iterator[bool]:
        """One ingesting process at a time (gunicorn workers each run the schedule)."""
        fd = os.open(str(self.path) + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    # -- ingest ---------------------------------------------------------------------------

    def ingest(self, paths: Iterable[Path], wait: bool = True) -> IngestReport | None:
        """Load new rows of the given files (the `demand_day` aggregate moves with them).

        Returns None when another process holds the writer lock and `wait` is false.
        """
        with self.writer_lock(wait) as locked:
            if not locked:
                return None
            started = time.monotonic()
            run = _Run(log_limit=self.log_rejects)
            for path in paths:
                kind = kind_of(path)
                if kind is None:
                    run.reject(str(path), 0, "not a metrics input file name")
                    continue
                run.files += 1
                self._ingest_file(kind, path, run)
            ingest_seconds = time.monotonic() - started - run.merge_seconds
            if run.changed:
                self._bump_generation()
            return IngestReport(
                files=run.files,
                accepted=run.accepted,
                rejected=run.rejected,
                duplicates=run.duplicates,
                seconds=round(ingest_seconds, 3),
                refresh_seconds=round(run.merge_seconds, 3),
                rejects=run.rejects,
            )

    def ingest_dir(self, records_dir: Path, wait: bool = True) -> IngestReport | None:
        """Ingest every input file of a directory (kinds by file name)."""
        return self.ingest(input_files(records_dir), wait)

    def _bump_generation(self) -> None:
        with transaction(self.conn):
            self.conn.execute(
                "INSERT INTO meta VALUES ('generation', '1') ON CONFLICT(key) DO UPDATE "
                "SET value = CAST(value AS INTEGER) + 1"
            )

    def _ingest_file(self, kind: str, path: Path, run: _Run) -> None:
        name = str(path)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below, across several branches
        except OSError as exc:
            run.reject(name, 0, f"cannot open: {exc.strerror}")
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            first = f.readline()
            header: list[str] | None = None
            if path.suffix == ".csv":
                identity_bytes = first + f.readline()
                if not first.endswith(b"\n"):
                    return  # no complete header yet: nothing to load
                header = _csv_header(first)
                missing = [c for c in COLUMNS[kind] if c not in header and c not in OPTIONAL[kind]]
                if missing:
                    run.reject(name, 1, f"header lacks column(s) {', '.join(missing)}")
                    return
            else:
                identity_bytes = first
            if not identity_bytes.endswith(b"\n") or (identity_bytes == first and header):
                return  # no complete record yet
            identity = kind + ":" + hashlib.sha256(identity_bytes).hexdigest()
            row = self.conn.execute(
                "SELECT id, path, offset, lines, tail FROM files WHERE identity = ?", (identity,)
            ).fetchone()
            if row is not None:
                file_id, known_path, offset, lines, tail = row
                if offset > size or _tail(f, offset) != tail:
                    log.warning("%s was rewritten since it was last read; reloading it", name)
                    stale = [
                        d
                        for (d,) in self.conn.execute(
                            "SELECT DISTINCT op_day FROM validations WHERE file_id = ?", (file_id,)
                        )
                    ]
                    with transaction(self.conn):
                        self.conn.execute("DELETE FROM validations WHERE file_id = ?", (file_id,))
                        # Same transaction: the aggregate never counts rows that are gone.
                        self._recompute(stale)
                        self.conn.execute(
                            "UPDATE files SET offset = 0, lines = 0, tail = '', accepted = 0, "
                            "rejected = 0 WHERE id = ?",
                            (file_id,),
                        )
                    offset, lines = 0, 0
                    run.changed = True
                elif known_path != name:
                    # The same records delivered again under another name: skip what is in.
                    run.duplicates += lines - (1 if header else 0)
                    log.info(
                        "%s holds the records of %s; only new lines are read", name, known_path
                    )
            else:
                with transaction(self.conn):
                    cur = self.conn.execute(
                        "INSERT INTO files(kind, identity, path, header, offset, lines, tail) "
                        "VALUES (?, ?, ?, ?, 0, 0, '')",
                        (kind, identity, name, ",".join(header) if header else None),
                    )
                file_id, offset, lines = cur.lastrowid, 0, 0
            if offset >= size:
                return
            self._read_from(kind, path, f, file_id, offset, lines, header, run)

    def _read_from(
        self,
        kind: str,
        path: Path,
        f,  # type: ignore[no-untyped-def]
        file_id: int,
        offset: int,
        lines: int,
        header: list[str] | None,
        run: _Run,
    ) -> None:
        name = str(path)
        columns = COLUMNS[kind]
        index = [header.index(c) if c in header else -1 for c in columns] if header else None
        width = len(header) if header else 0
        clock = DayClock(self.tz, self.start_hour)
        tz = self.tz
        # Columns in the canonical order (what the generator and most exports write): the
        # parsed CSV row is used as it is, without a reordering copy.
        direct = index == list(range(len(columns))) and width == len(columns)
        sql = INSERT[kind]
        f.seek(offset)
        rest = b""
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            buf = rest + chunk
            cut = buf.rfind(b"\n")
            if cut < 0:
                rest = buf
                continue
            data, rest = buf[: cut + 1], buf[cut + 1 :]
            text_lines = _decode_lines(data, lines)
            batch: list[tuple] = []
            # Validation counts of this chunk by (op_day, agency, line, stop): [valid, invalid].
            agg: dict[tuple[int, str, str, str], list[int]] = {}
            bad: list[tuple[str, int, str]] = []
            rejected = 0
            rows: Iterable = _csv_rows(text_lines) if header is not None else text_lines
            for n, raw in enumerate(rows, start=lines + 1):
                try:
                    if raw is None:
                        raise BadRow("not valid UTF-8")
                    if isinstance(raw, BadRow):
                        raise raw
                    if header is not None:
                        if n == 1:
                            continue  # the header line itself
                        if not raw:
                            raise BadRow("empty line")
                        if len(raw) != width:
                            raise BadRow(f"expected {width} fields, got {len(raw)}")
                        values = (
                            raw if direct else [raw[i] if i >= 0 else "" for i in index]  # type: ignore[union-attr]
                        )
                    else:
                        values = _json_values(raw, columns, OPTIONAL[kind])
                    if kind == "validations":
                        rec = parse_validation(values, clock)
                        batch.append((file_id, *rec))
                        key = (rec[1], rec[2], rec[3], rec[4])
                        counts = agg.get(key)
                        if counts is None:
                            counts = agg[key] = [0, 0]
                        counts[1 - rec[6]] += 1
                    elif kind == "rides":
                        batch.append(parse_ride(values, tz))
                    else:
                        batch.append(parse_complaint(values))
                except BadRow as exc:
                    rejected += 1
                    run.reject(name, n, str(exc))
                    bad.append((name, n, str(exc)))
            new_lines = len(text_lines)
            offset += len(data)
            lines += new_lines
            before = self._count(kind) if kind != "validations" else 0
            with transaction(self.conn):
                self.conn.executemany(sql, batch)
                self.conn.executemany("INSERT INTO rejects VALUES (?, ?, ?)", bad)
                if agg:
                    # The aggregate moves with the rows, in the same transaction: no re-scan.
                    merge_started = time.monotonic()
                    self.conn.executemany(
                        "INSERT INTO demand_day VALUES (?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT(op_day, agency, line, stop) DO UPDATE SET "
                        "qty = qty + excluded.qty, invalid = invalid + excluded.invalid",
                        [(*k, v[0], v[1]) for k, v in agg.items()],
                    )
                    run.merge_seconds += time.monotonic() - merge_started
                self.conn.execute(
                    "UPDATE files SET offset = ?, lines = ?, tail = ?, path = ?, "
                    "accepted = accepted + ?, rejected = rejected + ? WHERE id = ?",
                    (offset, lines, _tail(f, offset), name, len(batch), rejected, file_id),
                )
            if kind != "validations":
                run.duplicates += len(batch) - (self._count(kind) - before)
            run.accepted[kind] += len(batch)
            run.changed = True
            f.seek(offset + len(rest))

    def _count(self, kind: str) -> int:
        return self.conn.execute(f"SELECT count(*) FROM {kind}").fetchone()[0]

    # -- aggregates -----------------------------------------------------------------------

    def refresh(self, days: Iterable[int] | None = None) -> float:
        """Recompute `demand_day` from the raw validations for the given operational days (all
        when None); seconds. Ingest keeps the aggregate current by itself; this is the repair /
        audit path (`python -m sidecars.transit.metrics refresh`)."""
        started = time.monotonic()
        with transaction(self.conn):
            if days is None:
                self.conn.execute("DELETE FROM demand_day")
                # Day by day through the op_day index: each GROUP BY sorts one day's rows, so
                # the temporary sort space stays one day's worth (same CPU as one big GROUP BY).
                days = [d for (d,) in self.conn.execute("SELECT DISTINCT op_day FROM validations")]
            self._recompute(days)
        return time.monotonic() - started

    def _recompute(self, days: Iterable[int]) -> None:
        for day in sorted(set(days)):
            self.conn.execute("DELETE FROM demand_day WHERE op_day = ?", (day,))
            self.conn.execute(
                "INSERT INTO demand_day SELECT op_day, agency, line, stop, sum(valid), "
                "sum(1 - valid) FROM validations WHERE op_day = ? GROUP BY agency, line, stop",
                (day,),
            )


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One explicit transaction (the connection is in autocommit mode, where every statement
    of an executemany would otherwise commit on its own)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def input_files(records_dir: Path) -> list[Path]:
    """The input files of a records directory, by kind, then name (rotation order)."""
    if not records_dir.is_dir():
        return []
    found = [p for p in records_dir.iterdir() if p.is_file() and kind_of(p) is not None]
    return sorted(found, key=lambda p: (KINDS.index(kind_of(p) or ""), p.name))


def generation(conn: sqlite3.Connection) -> int:
    """How many ingests changed the store (readers re-render when it moves)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
    return int(row[0]) if row else 0


def _csv_header(line: bytes) -> list[str]:
    text = line.decode("utf-8-sig").rstrip("\r\n")
    return [c.strip() for c in next(csv.reader([text]))]


def _tail(f, offset: int) -> str:  # type: ignore[no-untyped-def]
    start = max(0, offset - TAIL)
    f.seek(start)
    return hashlib.sha256(f.read(offset - start)).hexdigest()


def _csv_rows(lines: list) -> Iterable:
    """One parsed row per physical line (a record never spans lines)."""
    if not any(line is None or '"' in line for line in lines):
        # Without quotes no field can run into the next line: the C reader does it all.
        return csv.reader(lines)
    return [_csv_line(line) for line in lines]


def _csv_line(line: str | None) -> list[str] | BadRow | None:
    if line is None:
        return None
    try:
        return next(csv.reader([line], strict=True), [])
    except csv.Error as exc:
        return BadRow(f"bad CSV quoting: {exc}")


def _decode_lines(data: bytes, before: int) -> list:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # Rare: find the offending lines and keep the others.
        out: list = []
        for raw in data.split(b"\n")[:-1]:
            try:
                out.append(raw.decode("utf-8").rstrip("\r"))
            except UnicodeDecodeError:
                out.append(None)
        return out
    lines = text.split("\n")
    lines.pop()  # the piece after the final newline is empty by construction
    if before == 0 and lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _json_values(line: str, columns: tuple[str, ...], optional: frozenset[str]) -> list:
    if not line.strip():
        raise BadRow("empty line")
    try:
        obj = _jsonl.decode(line)
    except msgspec.DecodeError as exc:
        raise BadRow(f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRow("a JSON Lines record must be an object")
    missing = [c for c in columns if c not in obj and c not in optional]
    if missing:
        raise BadRow(f"missing field(s) {', '.join(missing)}")
    return [obj.get(c) for c in columns]
