"""The validation report of a static feed, in the canonical GTFS validator's notice model.

Every problem found is a *notice*: a code (MobilityData's validator's name where it has one),
the file and line it is about, and a message. A code has one severity, MobilityData's, except
where this API does something else with the row (then the notice says so); the severity says
what happens:

- FATAL: the feed is rejected; the previous one keeps serving (`/health` and `/status/feed`
  say why, with file:line). MobilityData calls these errors too;
- ERROR: the row is skipped and counted; everything else is served;
- WARNING: the row is served (the message says what was ignored or defaulted);
- INFO: nothing is wrong for this API (an extra file).

`Report` collects notices while the files are read: counts per code, the first few examples of
each, and rows read / skipped per file. The root cause is the notice: a skipped row whose
dependants go with it (a route's trips, a trip's stop times) lists them under `dropped`
instead of one foreign key violation per dependant.
"""

from __future__ import annotations

from ..schemas import FeedProblem, FileRows, NoticeSummary, ValidationReport

FATAL = "fatal"
ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITY_ORDER = {FATAL: 0, ERROR: 1, WARNING: 2, INFO: 3}

# What each code means, under its severity (what happens to the row: see the module doc).
_MEANINGS: dict[str, dict[str, str]] = {
    FATAL: {
        "missing_required_file": "A required file is missing.",
        "missing_calendar_and_calendar_date_files": (
            "Neither calendar.txt nor calendar_dates.txt is present."
        ),
        "missing_required_column": "A required column is missing from a file's header.",
        "empty_file": "A required file has no header line.",
        "csv_parsing_failed": "A file is not well-formed CSV or not UTF-8.",
        "unreadable_file": "The archive or one of its members cannot be read.",
        "feed_too_large": (
            "The feed is over TRANSIT_FEED_MAX_BYTES as fetched or "
            "TRANSIT_FEED_MAX_UNCOMPRESSED_BYTES once uncompressed; it is not read."
        ),
        "too_many_rows": (
            "The feed's files hold more rows than TRANSIT_FEED_MAX_ROWS; reading stops there."
        ),
        "no_usable_rows": "A required file has no row left after skipping bad ones.",
        "too_many_rows_skipped": (
            "More rows of a file were skipped than TRANSIT_FEED_MAX_SKIPPED_SHARE allows."
        ),
        "feed_shrunk": (
            "The feed has fewer rows, stops or trips than the served one, by more than "
            "TRANSIT_FEED_MAX_DROP_SHARE allows."
        ),
    },
    ERROR: {
        "invalid_row_length": "A row has more fields than the header.",
        "missing_required_field": "A required field is empty.",
        "invalid_integer": "A field is not an integer.",
        "invalid_float": "A field is not a number.",
        "invalid_time": "A field is not a GTFS time (H:MM:SS).",
        "invalid_date": "A field is not a date (YYYYMMDD).",
        "invalid_timezone": "A field is not an IANA timezone.",
        "number_out_of_range": "A number is outside the range the field allows.",
        "duplicate_key": "A row repeats the key of an earlier row.",
        "foreign_key_violation": "A row refers to an id that no (usable) row defines.",
        "route_both_short_and_long_name_missing": (
            "A route has neither route_short_name nor route_long_name."
        ),
        "point_near_origin": "A stop or shape point is at latitude 0, longitude 0.",
        "start_and_end_range_out_of_order": "An end date or time is before its start.",
        "stop_time_with_arrival_before_previous_departure_time": (
            "A stop time is earlier than the previous stop's in the same trip."
        ),
        "missing_trip_edge": (
            "The first or last stop of a trip has no time; the trip's stop times are skipped."
        ),
    },
    WARNING: {
        "invalid_color": (
            "A colour is not six hexadecimal digits; the default colour is served (MobilityData: "
            "error; the route itself is fine)."
        ),
        "unexpected_enum_value": (
            "A field has a value the GTFS reference does not define. On a field the API serves or "
            "uses (direction_id, location_type, pickup/drop-off types, calendar flags) the row is "
            "skipped and the notice is an error; otherwise (route_type) the row is served."
        ),
        "missing_recommended_file": "A file the GTFS best practices ask for is missing.",
        "missing_feed_info_date": (
            "feed_info.txt gives one of feed_start_date and feed_end_date without the other."
        ),
        "feed_expiration_date7_days": (
            "feed_info.txt's feed_end_date is within the next 7 days (or past): publish the next "
            "version."
        ),
        "feed_expiration_date30_days": (
            "feed_info.txt's feed_end_date is within the next 30 days: publish the next version."
        ),
        "expired_calendar": (
            "A service has no date from today on; its trips are served for past dates only."
        ),
        "no_service_today": (
            "No service runs on today's operational day: every stop's arrivals are empty "
            "(`/health` says degraded while this feed is served)."
        ),
        "unused_trip": "A trip has no stop times; it is not served.",
        "trip_shape_not_found": (
            "A trip's shape_id is not in shapes.txt; it is served without a shape."
        ),
        "decreasing_or_equal_stop_time_distance": (
            "shape_dist_traveled does not increase along a trip; its distances are computed from "
            "the shape instead."
        ),
        "shape_dist_traveled_unit_unknown": (
            "The unit of shape_dist_traveled could not be told from the geometry; distances are "
            "computed from the shapes."
        ),
        "location_not_found": (
            "A stop's district, municipality or locality is not in the configured locations; the "
            "field is served empty."
        ),
    },
    INFO: {
        "unknown_file": "A file that is not part of the GTFS reference; it is not read.",
    },
}
# code -> (severity, what it means)
NOTICES: dict[str, tuple[str, str]] = {
    code: (severity, text) for severity, codes in _MEANINGS.items() for code, text in codes.items()
}


class FeedError(Exception):
    """The feed was rejected; `report` says why (its fatal notices first)."""

    def __init__(self, report: Report) -> None:
        self.report = report
        first = report.first_fatal()
        where = ""
        if first is not None:
            where = first.file + (f":{first.line}" if first.line else "")
        summary = f"{where}: {first.message}" if first else "invalid feed"
        super().__init__(f"feed rejected; first fatal problem: {summary}")

    @property
    def problems(self) -> list[FeedProblem]:
        """Examples of the fatal notices (file, line, message)."""
        return self.report.fatal_examples()

    @property
    def total(self) -> int:
        """How many fatal notices there were."""
        return self.report.fatal_count


class Cause:
    """A recorded notice that rows of other files can depend on."""

    __slots__ = ("key", "problem")

    def __init__(self, key: tuple[str, str], problem: FeedProblem) -> None:
        self.key = key
        self.problem = problem


class Report:
    """Notices of one feed: counts per (code, severity), the first `examples` of each, rows
    per file, and the rows each root cause took with it."""

    def __init__(self, examples: int = 10) -> None:
        self.examples_per_code = examples
        self.counts: dict[tuple[str, str], int] = {}
        self.examples: dict[tuple[str, str], list[FeedProblem]] = {}
        self.dropped: dict[tuple[str, str], dict[str, int]] = {}
        self.rows: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        # TRANSIT_FEED_MAX_ROWS (None: no bound), checked as the rows are read.
        self.max_rows: int | None = None

    def add(
        self, code: str, file: str, line: int | None, message: str, severity: str | None = None
    ) -> Cause:
        """Record one notice (with its code's severity unless another is given); the cause
        recorded, to hang dependants on."""
        key = (code, severity or NOTICES[code][0])
        self.counts[key] = self.counts.get(key, 0) + 1
        problem = FeedProblem(file=file, line=line, message=message)
        examples = self.examples.setdefault(key, [])
        if len(examples) < self.examples_per_code:
            examples.append(problem)
        return Cause(key, problem)

    def skip(
        self,
        code: str,
        file: str,
        line: int | None,
        message: str,
        rows: int = 1,
        severity: str | None = None,
    ) -> Cause:
        """Record a notice whose row (or `rows` rows) is left out."""
        problem = self.add(code, file, line, message, severity or ERROR)
        self.skipped[file] = self.skipped.get(file, 0) + rows
        return problem

    def dependant(self, cause: Cause, file: str, rows: int = 1) -> None:
        """Rows of `file` left out because the row of `cause` was: counted under it, not as
        notices of their own."""
        self.skipped[file] = self.skipped.get(file, 0) + rows
        problem = cause.problem
        dropped = problem.dropped if problem.dropped is not None else {}
        dropped[file] = dropped.get(file, 0) + rows
        problem.dropped = dropped
        totals = self.dropped.setdefault(cause.key, {})
        totals[file] = totals.get(file, 0) + rows

    def fatal(self, code: str, file: str, line: int | None, message: str) -> FeedError:
        """Record a fatal notice and return the error to raise."""
        self.add(code, file, line, message, FATAL)
        return FeedError(self)

    @property
    def fatal_count(self) -> int:
        """Number of fatal notices."""
        return sum(n for (_, severity), n in self.counts.items() if severity == FATAL)

    def raise_if_fatal(self) -> None:
        """Reject the feed when a fatal notice was recorded."""
        if self.fatal_count:
            raise FeedError(self)

    def accepted(self, file: str) -> int:
        """Rows of a file that are served."""
        return self.rows.get(file, 0) - self.skipped.get(file, 0)

    def _largest_cause(self, file: str) -> str:
        """The notice that took the most rows of `file` with it, as `; most with ...`."""
        best: tuple[int, FeedProblem] | None = None
        for examples in self.examples.values():
            for p in examples:
                n = (p.dropped or {}).get(file, 0)
                if n and (best is None or n > best[0]):
                    best = (n, p)
        if best is None:
            return ""
        n, p = best
        where = f"{p.file}:{p.line}" if p.line else p.file
        return f"; {n:,} of them dropped with {where} ({p.message})"

    def check_skipped_share(self, max_share: float, unserved: frozenset[str]) -> None:
        """Fatal when more than `max_share` of any file's rows were skipped (files the API
        does not serve from, like feed_info.txt, cost only their rows)."""
        for file, rows in self.rows.items():
            if file in unserved:
                continue
            skipped = self.skipped.get(file, 0)
            if rows and skipped / rows > max_share:
                self.add(
                    "too_many_rows_skipped",
                    file,
                    None,
                    f"{skipped:,} of {rows:,} rows skipped ({skipped / rows:.1%}), more than "
                    f"the {max_share:.0%} allowed (TRANSIT_FEED_MAX_SKIPPED_SHARE)"
                    + self._largest_cause(file),
                )

    def check_shrink(self, served: Report, max_share: float) -> None:
        """Fatal when a file has lost more than `max_share` of the rows the served feed has
        (stops, routes, trips, stop_times)."""
        for file in ("stops.txt", "routes.txt", "trips.txt", "stop_times.txt"):
            before, after = served.accepted(file), self.accepted(file)
            if before and (before - after) / before > max_share:
                self.add(
                    "feed_shrunk",
                    file,
                    None,
                    f"{after:,} usable rows against {before:,} in the served feed "
                    f"({(after - before) / before:+.1%}), a larger drop than the "
                    f"{max_share:.0%} allowed (TRANSIT_FEED_MAX_DROP_SHARE)",
                )

    def first_fatal(self) -> FeedProblem | None:
        """The first example of a fatal notice."""
        examples = self.fatal_examples()
        return examples[0] if examples else None

    def fatal_examples(self) -> list[FeedProblem]:
        """Examples of every fatal notice, in the order they were found."""
        return [p for key, items in self.examples.items() if key[1] == FATAL for p in items]

    def summary(self, source: str, version: str | None, at: int) -> ValidationReport:
        """The report as served by `/status/feed` and printed by the validate command."""
        notices = [
            NoticeSummary(
                code=code,
                severity=severity,
                count=count,
                description=NOTICES[code][1],
                examples=self.examples.get((code, severity), []),
                dropped=self.dropped.get((code, severity), {}),
            )
            for (code, severity), count in self.counts.items()
        ]
        # Root causes first: what rejected the feed, then what took the most rows with it.
        notices.sort(
            key=lambda n: (SEVERITY_ORDER[n.severity], -sum(n.dropped.values()), -n.count, n.code)
        )
        totals = {FATAL: 0, ERROR: 0, WARNING: 0, INFO: 0}
        for n in notices:
            totals[n.severity] += n.count
        return ValidationReport(
            source=source,
            version=version,
            validated_at=at,
            accepted=totals[FATAL] == 0,
            fatal=totals[FATAL],
            errors=totals[ERROR],
            warnings=totals[WARNING],
            infos=totals[INFO],
            files=[
                FileRows(file=f, rows=n, skipped=self.skipped.get(f, 0))
                for f, n in self.rows.items()
            ],
            notices=notices,
        )
