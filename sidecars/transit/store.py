"""The live data of one worker: the current network and realtime snapshot, and the threads
that refresh them off the request path.

Requests read `store.network` and `store.realtime` once and use that object throughout, so a
swap (a plain attribute assignment, atomic under the GIL) never shows a half-built state.
"""

from __future__ import annotations

import bisect
import logging
import os
import tempfile
import threading
import time
from array import array
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from .gtfs import FeedError, Report, read_feed
from .network import Network, StopLocations
from .realtime import Realtime, iso_utc
from .rtsources import RealtimeError, parse_feed, parse_vehicle_metadata
from .schemas import (
    AgencyHealth,
    FeedHealth,
    FeedProblem,
    FeedStatus,
    RealtimeHealth,
    TransitHealth,
    ValidationReport,
)
from .settings import FeedSettings, TransitSettings
from .source import FeedFiles, SourceError, read_bytes, redact
from .times import day_origin, days_around, operational_day, yyyymmdd

log = logging.getLogger("sidecars.transit")

RT_KINDS = ("vehicles", "trip_updates", "alerts", "vehicle_metadata")


class _SourceState:
    """Last good payload of one realtime source and how the last fetch went."""

    __slots__ = ("entities", "error", "fetched_at", "headers", "payload", "source")

    def __init__(self, source: str | None, headers: dict[str, str] | None = None) -> None:
        self.source = source
        self.headers = headers or {}
        self.payload: Any = None
        self.fetched_at: float | None = None
        self.entities = 0
        self.error: str | None = None

    def health(self, reason: str | None, mismatch: str | None = None) -> RealtimeHealth:
        """`reason`: why some of the last good payload is not served as current;
        `mismatch`: why its trips do not join the served feed."""
        if self.source is None:
            status = "disabled"
        elif self.error is not None:
            status = "stale" if self.payload is not None else "error"
        elif self.payload is None:
            status = "pending"
        else:
            status = "stale" if reason else "mismatch" if mismatch else "ok"
        return RealtimeHealth(
            status=status,
            source=redact(self.source),
            fetched_at=int(self.fetched_at) if self.fetched_at else None,
            entities=self.entities,
            last_error=self.error,
            reason=reason or mismatch,
        )


class TransitStore:
    """Holds what the resources serve and keeps it fresh."""

    def __init__(
        self,
        settings: TransitSettings,
        clock: Callable[[], float] | None = None,
        locations: StopLocations | None = None,
    ) -> None:
        """`locations` resolve the stops' district, municipality and locality ids to those of
        `/v2/locations/*` (None: the feed's ids are served as they are)."""
        self.settings = settings
        self.locations = locations
        if clock is None:
            fixed = settings.now.timestamp() if settings.now is not None else None
            clock = (lambda: fixed) if fixed is not None else time.time  # type: ignore[assignment,return-value]
        self.now: Callable[[], float] = clock  # type: ignore[assignment]
        self.network: Network | None = None
        self.realtime = Realtime(None, None, None, None, None, self.now())
        self._load_lock = threading.Lock()
        self._rt_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._serving_report: ValidationReport | None = None
        self._attempt_report: ValidationReport | None = None
        self._last_error: str | None = None
        self._last_attempt: float | None = None
        self._load_seconds: float | None = None
        # The version last rejected: the same bytes are not parsed again.
        self._rejected_version: str | None = None
        self._refresh = threading.Event()
        # The newest position or trip update heard per agency (kept across snapshots, so
        # a silent agency's last sign of life is known), and the trips running per agency
        # of one (feed version, operational day).
        self._heard: dict[str, float] = {}
        self._running: tuple[tuple[str, date], dict[str, tuple[array, array]]] | None = None
        headers = settings.realtime.headers
        self._sources = {
            kind: _SourceState(getattr(settings.realtime, f"{kind}_source"), headers.get(kind))
            for kind in RT_KINDS
        }

    # -- static feed ------------------------------------------------------------------------

    def load_static(self, source: str | None = None) -> bool:
        """Fetch, validate and index the static feed, then swap it in. Returns whether a new
        version is now served; on a fatal problem the previous version keeps serving."""
        raw_source = source or self.settings.feed.source
        feed = self.settings.feed
        if not raw_source:
            raise ValueError("no static GTFS source configured (TRANSIT_GTFS_SOURCE)")
        # What is shown and logged: no credentials.
        source = redact(raw_source) or raw_source
        with self._load_lock:
            self._last_attempt = self.now()
            started = time.monotonic()
            current = self.network
            digest: str | None = None
            try:
                files = FeedFiles.load(
                    raw_source, self.settings.http_timeout_seconds, feed.headers, feed.bounds
                )
                digest = files.digest
                if current is not None and current.version == files.digest:
                    log.debug("static feed %s unchanged (version %s)", source, files.digest)
                    return False
                if digest == self._rejected_version:
                    # Rejected already: its report stands until the source changes.
                    log.debug("static feed %s still the rejected version %s", source, digest)
                    return False
                network = build_network(files, feed, current, self.locations, self.now())
                raw = network.raw
            except FeedError as exc:
                self._reject(source, digest, exc.report)
                return False
            except SourceError as exc:
                self._reject(source, digest, source_report(source, exc))
                return False
            except Exception as exc:  # a bug must not take the serving feed down with it
                log.exception("static feed %s: unexpected error while loading", source)
                report = Report()
                report.add("unreadable_file", source, None, f"unexpected error: {exc!r}")
                self._reject(source, digest, report)
                return False
            self._load_seconds = time.monotonic() - started
            summary = raw.report.summary(source, network.version, int(self.now()))
            self.network = network
            self._serving_report = self._attempt_report = summary
            self._last_error = None
            self._rejected_version = None
            log.info(
                "static feed %s loaded: version %s, %d stops, %d lines, %d routes, %d patterns, "
                "%d trips, %d stop_times in %.2fs; %d row(s) skipped, %d warning(s)",
                source,
                network.version,
                len(network.raw.stop_ids),
                network.line_count,
                network.route_count,
                len(network.patterns),
                len(network.raw.trip_ids),
                len(network.raw.st_trip),
                self._load_seconds,
                sum(f.skipped for f in summary.files),
                summary.warnings,
            )
            for notice in summary.notices:
                log.warning(
                    "  %s (%s) x%d, e.g. %s",
                    notice.code,
                    notice.severity,
                    notice.count,
                    _where(notice.examples[0]) if notice.examples else "-",
                )
        self.rebuild_realtime()
        return True

    def _reject(self, source: str, version: str | None, report: Report) -> None:
        self._rejected_version = version
        summary = report.summary(source, version, int(self.now()))
        self._attempt_report = summary
        first = report.first_fatal()
        self._last_error = _where(first) if first is not None else "invalid feed"
        serving = self.network.version if self.network is not None else "none"
        log.error(
            "static feed %s rejected (%d fatal problem(s)); still serving version %s",
            source,
            summary.fatal,
            serving,
        )
        for p in report.fatal_examples():
            log.error("  %s", _where(p))

    def feed_status(self) -> FeedStatus:
        """The validation reports of the served feed and of the last attempt."""
        return FeedStatus(serving=self._serving_report, last_attempt=self._attempt_report)

    # -- realtime ---------------------------------------------------------------------------

    def poll_realtime(self) -> None:
        """Fetch every configured realtime source once and publish a new snapshot."""
        timeout = self.settings.http_timeout_seconds
        for kind, state in self._sources.items():
            if state.source is None:
                continue
            try:
                data = read_bytes(state.source, timeout, state.headers)
                if kind == "vehicle_metadata":
                    payload: Any = parse_vehicle_metadata(data.decode("utf-8"))
                    entities = len(payload)
                else:
                    payload = parse_feed(data)
                    entities = len(payload.entity)
            except (SourceError, RealtimeError, UnicodeDecodeError) as exc:
                state.error = str(exc)
                log.warning(
                    "realtime %s from %s: %s (keeping the last good one)",
                    kind,
                    redact(state.source),
                    exc,
                )
                continue
            state.payload, state.entities, state.error = payload, entities, None
            state.fetched_at = self.now()
        self.rebuild_realtime()

    def rebuild_realtime(self) -> None:
        """Join the last good realtime payloads to the current network."""
        s = self._sources
        with self._rt_lock:
            try:
                self.realtime = Realtime(
                    self.network,
                    s["vehicles"].payload,
                    s["trip_updates"].payload,
                    s["alerts"].payload,
                    s["vehicle_metadata"].payload,
                    self.now(),
                    self.settings.realtime.max_ages,
                    self.settings.feed.operational_day_start_hour,
                )
            except RealtimeError as exc:
                log.error("realtime snapshot not rebuilt: %s", exc)
                s["alerts"].error = str(exc)
                return
            for agency, ts in self.realtime.agency_heard.items():
                self._heard[agency] = max(self._heard.get(agency, 0.0), ts)

    def current_realtime(self) -> Realtime:
        """The realtime snapshot, built again first when something in it has stopped (or
        started) being current since it was built (a position past the age limit, an alert's
        period ending), even if no new message came."""
        snapshot = self.realtime
        if self.now() >= snapshot.expires_at:
            self.rebuild_realtime()
            snapshot = self.realtime
        return snapshot

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the refresh threads (the first static load happens in the background, so a
        worker boots at once and answers 503 until its first feed is in)."""
        if self._threads:
            return
        self._stop.clear()
        loops: list[tuple[str, Callable[[], object], float]] = [
            ("transit-static", self.load_static, self.settings.feed.refresh_seconds)
        ]
        if any(s.source for s in self._sources.values()):
            refresh = self.settings.realtime.refresh_seconds
            loops.append(("transit-realtime", self.poll_realtime, refresh))
        self._threads = [
            threading.Thread(target=self._repeat, args=(work, every), name=name, daemon=True)
            for name, work, every in loops
        ]
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the refresh threads (a feed being parsed is left to finish as a daemon)."""
        self._stop.set()
        self._refresh.set()  # wakes the static loop at once
        for t in self._threads:
            t.join(timeout)
        self._threads = []

    def _repeat(self, work: Callable[[], object], interval: float) -> None:
        """Run `work` now, then every `interval` seconds (0: once) until `stop`; the static
        feed also when a refresh is requested (`request_refresh`, in any worker)."""
        static = work == self.load_static
        while not self._stop.is_set():
            # Taken before the work: a refresh requested while a feed loads loads it again.
            seen = refresh_marker_mtime()
            work()
            if static:
                if not self._wait_static(interval, seen):
                    return
            elif not interval or self._stop.wait(interval):
                return

    def _wait_static(self, interval: float, seen: float | None) -> bool:
        """Wait for the next static load: the interval, or a refresh request (this worker's
        event, or the marker changed since `seen`). False: stop."""
        deadline = time.monotonic() + interval if interval else float("inf")
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            if self._refresh.wait(min(left, 1.0)):
                self._refresh.clear()
                return not self._stop.is_set()
            marker = refresh_marker_mtime()
            if marker != seen:
                return True
        return False

    def request_refresh(self) -> None:
        """Fetch the static feed again now, in every worker of this server: this one is
        woken, the others see the marker file (workers share no memory)."""
        path = refresh_marker()
        path.touch()
        os.utime(path)
        self._refresh.set()

    # -- health -----------------------------------------------------------------------------

    def service_today(self, net: Network) -> str | None:
        """Why the served feed has nothing to run today (None: it has)."""
        day = operational_day(self.now(), net.tz, self.settings.feed.operational_day_start_hour)
        if any(net.active_services(day)):
            return None
        dates = [d for s in net.raw.service_dates for d in s]
        span = f"; its calendars cover {min(dates)}..{max(dates)}" if dates else ""
        return f"the served feed has no service on {yyyymmdd(day)}{span}"

    def health(self) -> TransitHealth:
        """Component map: the static feed and each realtime source, which sources are
        configured, and every reason the service is degraded."""
        net = self.network
        reasons: list[str] = []
        no_service = self.service_today(net) if net is not None else None
        if net is None:
            status = "error" if self._last_error else "starting"
        else:
            status = "degraded" if self._last_error or no_service else "ok"
        if self._last_error:
            reasons.append(f"feed: the last version was rejected: {self._last_error}")
        if no_service:
            reasons.append(f"feed: {no_service}")
        attempt = self._attempt_report
        rejected = attempt is not None and not attempt.accepted
        problems = (
            [p for n in attempt.notices if n.severity == "fatal" for p in n.examples]
            if rejected and attempt is not None
            else []
        )
        serving = self._serving_report
        feed = FeedHealth(
            status=status,
            source=redact(self.settings.feed.source) or "",
            version=net.version if net is not None else None,
            loaded_at=int(net.loaded_at) if net is not None else None,
            load_seconds=round(self._load_seconds, 3) if self._load_seconds is not None else None,
            last_attempt_at=int(self._last_attempt) if self._last_attempt else None,
            last_error=self._last_error,
            problems=problems,
            problem_count=attempt.fatal if rejected and attempt is not None else 0,
            skipped_rows=sum(f.skipped for f in serving.files) if serving is not None else 0,
            service_today=net is not None and no_service is None,
        )
        rt = self.current_realtime()
        parts = {
            kind: self._sources[kind].health(rt.problems.get(kind), rt.mismatch.get(kind))
            for kind in RT_KINDS
        }
        for kind, part in parts.items():
            part.unknown_trips = rt.unknown_trips.get(kind, (0, 0, ""))[0]
            if part.status in ("error", "stale", "mismatch"):
                reasons.append(f"{kind}: {part.reason or part.last_error}")
        agencies = self.agency_health(net, rt) if net is not None else {}
        for agency, state in agencies.items():
            if state.status == "silent":
                heard = iso_utc(state.last_heard) if state.last_heard else "never"
                reasons.append(
                    f"agency {agency}: {state.trips_running} trip(s) running and no current "
                    f"position or trip update (last heard {heard})"
                )
        overall = "ok" if net is not None else "unavailable"
        if net is not None and reasons:
            overall = "degraded"
        return TransitHealth(
            status=overall,
            demo=self.settings.demo,
            reasons=reasons,
            sources=self.settings.sources(),
            feed=feed,
            agencies=agencies,
            **parts,
        )

    def agency_health(self, net: Network, rt: Realtime) -> dict[str, AgencyHealth]:
        """Per agency: is its realtime heard while its trips run? Empty when neither vehicle
        positions nor trip updates are configured."""
        if not (self._sources["vehicles"].source or self._sources["trip_updates"].source):
            return {}
        now = self.now()
        running = self._running_trips(net, now)
        out = {}
        for agency in net.agency_ids:
            starts, ends = running.get(agency, (array("q"), array("q")))
            count = bisect.bisect_right(starts, now) - bisect.bisect_left(ends, now)
            vehicles = rt.agency_vehicles.get(agency, 0)
            updates = rt.agency_updates.get(agency, 0)
            heard = self._heard.get(agency)
            status = "ok" if vehicles or updates else "silent" if count else "idle"
            out[agency] = AgencyHealth(
                status=status,
                trips_running=count,
                vehicles=vehicles,
                trip_updates=updates,
                last_heard=int(heard) if heard else None,
            )
        return out

    def _running_trips(self, net: Network, now: float) -> dict[str, tuple[array, array]]:
        """Per agency, the sorted start and end times of its trips on the service days
        around now (a trip runs at `now` when it started and has not ended: counted with
        two bisections); built once per feed version and operational day."""
        op_day = operational_day(now, net.tz, self.settings.feed.operational_day_start_hour)
        key = (net.version, op_day)
        if self._running is not None and self._running[0] == key:
            return self._running[1]
        raw = net.raw
        seconds, st_time = raw.time_seconds, raw.st_time
        agency_of = [row.agency_id or net.agency_id for row in raw.routes]
        found: dict[str, tuple[list[int], list[int]]] = {}
        for day in days_around(op_day, net.span_days):
            origin = day_origin(day, net.tz)
            active = net.active_services(day)
            for ti in range(len(raw.trip_ids)):
                count = raw.trip_count[ti]
                if not count or not active[raw.trip_service[ti]]:
                    continue
                first = raw.trip_first[ti]
                starts, ends = found.setdefault(agency_of[raw.trip_route[ti]], ([], []))
                starts.append(origin + seconds[st_time[first]])
                ends.append(origin + seconds[st_time[first + count - 1]])
        running = {a: (array("q", sorted(s)), array("q", sorted(e))) for a, (s, e) in found.items()}
        self._running = (key, running)
        return running


def build_network(
    files: FeedFiles,
    feed: FeedSettings,
    served: Network | None = None,
    locations: StopLocations | None = None,
    now: float | None = None,
) -> Network:
    """Validate a feed (against the served one, if any; its dates against `now`) and derive
    its network; FeedError when it must not be served. The network's `raw.report` lists what
    was skipped."""
    raw = read_feed(
        files,
        max_skipped_share=feed.max_skipped_share,
        examples=feed.report_examples,
        dist_unit=feed.shape_dist_unit,
        now=now,
        max_rows=feed.max_rows or None,
    )
    if served is not None:
        raw.report.check_shrink(served.raw.report, feed.max_drop_share)
        raw.report.raise_if_fatal()
    return Network(raw, files.digest, time.time(), feed.timezone, locations)


def source_report(shown: str, exc: SourceError) -> Report:
    """The report of a feed that could not be fetched or is over a size bound."""
    report = Report()
    report.add(exc.code, shown, None, str(exc))
    return report


def _where(p: FeedProblem) -> str:
    """`file:line: message` (no line when the problem is about the whole file)."""
    return f"{p.file}{':' + str(p.line) if p.line else ''}: {p.message}"


def refresh_marker() -> Path:
    """The file whose change asks every worker of this server to fetch the static feed
    again: named after the parent process, which gunicorn's workers share (the arbiter)."""
    return Path(tempfile.gettempdir()) / f"ratelimitd-transit-refresh-{os.getppid()}"


def refresh_marker_mtime() -> float | None:
    try:
        return refresh_marker().stat().st_mtime
    except OSError:
        return None
