"""`MetricsService`: one worker's view of the metrics store, kept fresh by a thread.

Every gunicorn worker runs the same loop; the writer lock of the store lets one of them ingest
at a time and the others skip, and every worker re-renders its bodies when the store's
generation (or the operational day) moves. Requests only read ready-made bytes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from zoneinfo import ZoneInfo

from ..bodies import Body
from ..schemas import json_encoder
from ..settings import MetricsSettings
from ..times import operational_day
from .db import MetricsDB, MetricsDBError, generation
from .schemas import IngestReport
from .views import Aggregates, Calendar, compute_aggregates, videowall

log = logging.getLogger("sidecars.transit.metrics")

# The Aggregates fields served as bodies of the same name.
AGGREGATE_VIEWS = (
    "by_agency_day",
    "by_agency_month",
    "by_agency_records",
    "by_line",
    "top_lines",
    "by_stop",
    "service",
    "complaints",
)


class MetricsService:
    """Ingests on a schedule and serves the encoded metrics bodies."""

    def __init__(
        self,
        settings: MetricsSettings,
        *,
        start_hour: int,
        timezone: Callable[[], ZoneInfo | None],
        clock: Callable[[], float],
        agencies: Callable[[], list[str]] = list,
    ) -> None:
        """`start_hour` and `timezone` are the feed's (arrivals and metrics count the same
        operational day); `agencies`: the feed's agency ids, each given videowall keys (zero
        without data)."""
        self.settings = settings
        self.db_path = settings.db_path
        self.records_dir = Path(settings.records_dir) if settings.records_dir else None
        self.start_hour = start_hour
        self.timezone = timezone
        self.clock = clock
        self.calendar = Calendar(Path(settings.dates_file) if settings.dates_file else None)
        self.agencies = agencies
        self.db: MetricsDB | None = None
        self.error: str | None = None
        self.last_report: IngestReport | None = None
        self.bodies: dict[str, Body] = {}
        self.aggregates: Aggregates | None = None
        self._line_bodies: dict[str, Body] = {}
        self._rendered: tuple[int, date] | None = None
        self._last_ingest = -float("inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        """Whether a store is configured at all (else the endpoints answer 404 `[]`)."""
        return self.db_path is not None

    def _open(self) -> MetricsDB | None:
        if self.db is not None:
            return self.db
        tz = self.timezone()
        if tz is None or self.db_path is None:
            return None  # the feed (and so the agency timezone) is not loaded yet
        try:
            self.db = MetricsDB(self.db_path, tz, self.start_hour)
        except MetricsDBError as exc:
            self.error = str(exc)
            log.error("metrics store unusable: %s", exc)
        return self.db

    def ingest(self, wait: bool = False) -> IngestReport | None:
        """Load new records from the records directory now (None if another worker is)."""
        db = self._open()
        if db is None or self.records_dir is None:
            return None
        report = db.ingest_dir(self.records_dir, wait=wait)
        if report is not None:
            self._last_ingest = time.monotonic()
            self.last_report = report
            if report.rejected or any(report.accepted.values()):
                log.info(
                    "metrics ingest: %s accepted, %d rejected, %d duplicates in %.2fs (+ "
                    "%.2fs aggregate)",
                    report.accepted,
                    report.rejected,
                    report.duplicates,
                    report.seconds,
                    report.refresh_seconds,
                )
        return report

    def refresh(self, ingest: bool | None = None) -> None:
        """One tick: ingest when due, re-render aggregates if the store or day moved, and
        recompute the videowall views."""
        with self._lock:
            db = self._open()
            if db is None:
                return
            due = time.monotonic() - self._last_ingest >= self.settings.ingest_interval
            if ingest or (ingest is None and self.settings.ingest_interval > 0 and due):
                self.ingest()
            now = self.clock()
            today = operational_day(now, db.tz, self.start_hour)
            state = (generation(db.conn), today)
            bodies = dict(self.bodies)
            if state != self._rendered:
                agg = compute_aggregates(
                    db.conn,
                    today,
                    self.settings.since,
                    now,
                    self.calendar,
                    self.settings.by_stop_days,
                )
                bodies.update({name: _body(getattr(agg, name)) for name in AGGREGATE_VIEWS})
                # Unused by the real service: always an empty list.
                bodies["by_agency_year"] = Body(b"[]")
                self.aggregates = agg
                self._line_bodies = {}
                self._rendered = state
            for name, view in videowall(db.conn, today, now, self.agencies()).items():
                bodies["videowall/" + name] = _body(view)
            # One assignment: a request sees the old set or the new one, never a mix.
            self.bodies = bodies

    def line_body(self, line_id: str) -> Body | None:
        """`[record]` of one line, `[]` for a line with no validations; None if not ready."""
        agg = self.aggregates
        if agg is None:
            return None
        body = self._line_bodies.get(line_id)
        if body is None:
            record = agg.line_index.get(line_id)
            body = _body([record] if record is not None else [])
            if len(self._line_bodies) < 10_000:
                self._line_bodies[line_id] = body
        return body

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the refresh thread."""
        if self._thread is not None or not self.enabled:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="transit-metrics", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the refresh thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # a bad tick must not end the loop; the next one retries
                log.exception("metrics refresh failed")
            # Until the store can be opened (feed not loaded yet), retry every second.
            wait = self.settings.refresh_interval if self.db is not None else 1.0
            if self._stop.wait(max(wait, 0.05)):
                return


def _body(value: object) -> Body:
    return Body(json_encoder.encode(value))
