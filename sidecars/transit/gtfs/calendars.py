"""The files that say on which days the feed runs: calendar.txt, calendar_dates.txt and
feed_info.txt, and the checks of those days against today (expired services, no service
today, the feed's end date). A mixin of the reader (reader.py): it fills the services'
dates, which trips.txt refers to."""

from __future__ import annotations

import csv
from datetime import date, timedelta

from ..source import FeedFiles
from ..times import yyyymmdd
from .notices import ERROR, Cause, Report
from .tables import REQUIRED_COLUMNS, WEEKDAYS, RowError, Table, enum, get, new_key, required

FLAGS = frozenset(("0", "1"))
EXCEPTION_TYPES = frozenset(("1", "2"))


class ServiceDays:
    """calendar.txt, calendar_dates.txt and feed_info.txt, read into the reader's services."""

    files: FeedFiles
    report: Report
    today: date | None
    extras: dict[str, list[dict[str, str]]]
    service_ids: list[str]
    service_index: dict[str, int]
    service_sets: list[set[str]]
    dropped_services: dict[str, Cause]

    def _plain(self, name: str) -> list[dict[str, str]]:
        """A file the API serves as it is, as {column: value} rows (bad CSV: none)."""
        try:
            with self.files.open_text(name) as fh:
                return [
                    {(k or "").strip(): (v or "").strip() for k, v in row.items()}
                    for row in csv.DictReader(fh)
                ]
        except (csv.Error, UnicodeDecodeError) as exc:
            self.report.add("csv_parsing_failed", name, None, f"{exc}; not served", ERROR)
            return []

    def _feed_info(self, t: Table) -> None:
        """feed_info.txt: not served, but its dates say when the feed expires."""
        i_start, i_end = t.index("feed_start_date"), t.index("feed_end_date")
        for row in t.rows():
            try:
                for column in REQUIRED_COLUMNS["feed_info.txt"]:
                    required(row, t.index(column), column)
                start_text, end_text = get(row, i_start), get(row, i_end)
                start = read_date(start_text, "feed_start_date") if start_text else None
                end = read_date(end_text, "feed_end_date") if end_text else None
                if start and end and end < start:
                    raise RowError(
                        "start_and_end_range_out_of_order", "feed_end_date before feed_start_date"
                    )
            except RowError as exc:
                t.skip(exc)
                continue
            self.extras.setdefault("feed_info.txt", []).append(
                {c: row[i].strip() for c, i in t.columns.items() if i < len(row)}
            )
            if bool(start) != bool(end):
                t.warn("missing_feed_info_date", "give both feed_start_date and feed_end_date")
            if end is not None and self.today is not None:
                days = (end - self.today).days
                code = (
                    "feed_expiration_date7_days"
                    if days <= 7
                    else "feed_expiration_date30_days"
                    if days <= 30
                    else None
                )
                if code:
                    t.warn(code, f"feed_end_date {end_text} is {days} day(s) from today")

    def _check_service_dates(self, names: set[str]) -> None:
        """Against today: services whose dates are all past, and whether any runs today."""
        today = self.today
        if today is None or not self.service_ids:
            return
        text = yyyymmdd(today)
        file = "calendar.txt" if "calendar.txt" in names else "calendar_dates.txt"
        running = False
        for service_id, dates in zip(self.service_ids, self.service_sets, strict=True):
            if dates and max(dates) < text:
                self.report.add(
                    "expired_calendar",
                    file,
                    None,
                    f"service {service_id!r}: last date {max(dates)}, before today ({text})",
                )
            running = running or text in dates
        if not running:
            self.report.add(
                "no_service_today",
                file,
                None,
                f"no service runs on {text}: the calendars cover "
                f"{min(min(d) for d in self.service_sets if d)}..."
                f"{max(max(d) for d in self.service_sets if d)}"
                if any(self.service_sets)
                else f"no service runs on {text}",
            )

    def _service(self, service_id: str) -> int:
        index = self.service_index.get(service_id)
        if index is None:
            index = self.service_index[service_id] = len(self.service_ids)
            self.service_ids.append(service_id)
            self.service_sets.append(set())
        return index

    def _calendar(self, t: Table) -> None:
        idx = {c: t.index(c) for c in REQUIRED_COLUMNS["calendar.txt"]}
        seen: set[str] = set()
        for row in t.rows():
            service_id = get(row, idx["service_id"])
            try:
                new_key(row, idx["service_id"], "service_id", seen)
                flags = [enum(get(row, idx[d]), d, FLAGS) == "1" for d in WEEKDAYS]
                start = read_date(required(row, idx["start_date"], "start_date"), "start_date")
                end = read_date(required(row, idx["end_date"], "end_date"), "end_date")
                if end < start:
                    raise RowError(
                        "start_and_end_range_out_of_order",
                        f"service {service_id!r}: end_date before start_date",
                    )
                if (end - start).days > 3660:
                    raise RowError(
                        "number_out_of_range", f"service {service_id!r} spans over ten years"
                    )
            except RowError as exc:
                t.drop(exc, service_id, self.dropped_services, seen)
                continue
            seen.add(service_id)
            dates = self.service_sets[self._service(service_id)]
            day = start
            one = timedelta(days=1)
            while day <= end:
                if flags[day.weekday()]:
                    dates.add(yyyymmdd(day))
                day += one

    def _calendar_dates(self, t: Table) -> None:
        i_sid, i_date, i_type = t.index("service_id"), t.index("date"), t.index("exception_type")
        seen: set[tuple[str, str]] = set()
        for row in t.rows():
            try:
                service_id = required(row, i_sid, "service_id")
                text = required(row, i_date, "date")
                read_date(text, "date")
                kind = enum(required(row, i_type, "exception_type"), "exception_type",
                            EXCEPTION_TYPES)  # fmt: skip
                if (service_id, text) in seen:
                    raise RowError("duplicate_key", f"service {service_id!r} on {text} is repeated")
            except RowError as exc:
                t.skip(exc)
                continue
            seen.add((service_id, text))
            dates = self.service_sets[self._service(service_id)]
            if kind == "1":
                dates.add(text)
            else:
                dates.discard(text)


def read_date(text: str, field: str) -> date:
    if len(text) != 8 or not text.isdigit() or not text.isascii():
        raise RowError("invalid_date", f"{field} {text!r} is not YYYYMMDD")
    try:
        return date(int(text[:4]), int(text[4:6]), int(text[6:]))
    except ValueError:
        raise RowError("invalid_date", f"{field} {text!r} is not a date") from None
