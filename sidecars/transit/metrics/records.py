"""Input record formats of the metrics: column lists and row parsers.

Three kinds, one file per kind, appended over time (see README.md for the full table):
`validations*`, `rides*` and `complaints*`, each as CSV (`.csv`, header line first) or JSON
Lines (`.jsonl`, one object per line). Parsers return the tuple stored in SQLite or raise
`BadRow` with the reason written into the `file:line: reason` report.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from ..times import BadTime, parse_time, service_time_unix

KINDS = ("validations", "rides", "complaints")
SUFFIXES = (".csv", ".jsonl")

VALIDATION_COLUMNS = ("time", "agency_id", "line_id", "stop_id", "vehicle_id", "valid")
RIDE_COLUMNS = (
    "operational_date",
    "agency_id",
    "line_id",
    "trip_id",
    "scheduled_start",
    "pass_one_validation",
    "pass_three_events",
    "scheduled_vkm",
    "driven_vkm",
    "delay_seconds",
    "empty",
)
COMPLAINT_COLUMNS = ("id", "date", "category", "channel", "line_id", "municipality_id")
COLUMNS = {
    "validations": VALIDATION_COLUMNS,
    "rides": RIDE_COLUMNS,
    "complaints": COMPLAINT_COLUMNS,
}
# Columns that may be absent from a CSV header or a JSON object (read as empty).
OPTIONAL = {
    "validations": frozenset({"vehicle_id"}),
    "rides": frozenset({"delay_seconds"}),
    "complaints": frozenset({"line_id", "municipality_id"}),
}
CATEGORIES = frozenset({"complaint", "info_request", "other"})

EPOCH = date(1970, 1, 1)
_EPOCH_ORDINAL = EPOCH.toordinal()
_TRUE = frozenset({"1", "true", "True", "TRUE", "yes"})
_FALSE = frozenset({"0", "false", "False", "FALSE", "no"})


class BadRow(ValueError):
    """A row that cannot be loaded; the message is the reason shown to the operator."""


def kind_of(path: Path) -> str | None:
    """The record kind a file holds, from its name (`validations-2026-11.csv` -> validations)."""
    if path.suffix not in SUFFIXES:
        return None
    for kind in KINDS:
        if path.name.startswith(kind):
            return kind
    return None


def day_number(day: date) -> int:
    """Days since 1970-01-01 (how operational dates are stored: small, ordered integers)."""
    return day.toordinal() - _EPOCH_ORDINAL


def day_of(number: int) -> date:
    """The date of a day number."""
    return date.fromordinal(number + _EPOCH_ORDINAL)


class DayClock:
    """Operational day of a Unix time in the agency timezone, day starting at `start_hour`.

    Validations arrive by the million, and `datetime.fromtimestamp(t, tz)` per row would cost
    more than the rest of the parsing; the UTC offset is cached per quarter hour instead (every
    real timezone changes offset on a quarter-hour boundary).
    """

    __slots__ = ("_hours", "_offsets", "start_seconds", "tz")

    def __init__(self, tz: ZoneInfo, start_hour: int) -> None:
        self.tz = tz
        self.start_seconds = start_hour * 3600
        self._offsets: dict[int, int] = {}
        self._hours: dict[str, int] = {}

    def unix(self, text: str) -> int:
        """Unix seconds of an ISO 8601 time with offset; `YYYY-MM-DDTHH:MM:SS+HH:MM` is read
        from a per-hour cache (`fromisoformat` per row is a third of the parse time)."""
        if len(text) == 25 and text[13] == ":" and text[16] == ":" and text[19] in "+-":
            key = text[:13] + text[19:]
            base = self._hours.get(key)
            if base is None:
                base = self._hours[key] = unix_time(text[:13] + ":00:00" + text[19:])
            mm, ss = text[14:16], text[17:19]
            if mm.isdigit() and ss.isdigit() and mm < "60" and ss < "60":
                return base + int(mm) * 60 + int(ss)
        return unix_time(text)

    def op_day(self, t: int) -> int:
        """Day number of the operational day Unix second `t` belongs to."""
        q = t // 900
        off = self._offsets.get(q)
        if off is None:
            moment = datetime.fromtimestamp(q * 900, UTC).astimezone(self.tz)
            delta = moment.utcoffset() or timedelta(0)
            off = self._offsets[q] = int(delta.total_seconds())
        return (t + off - self.start_seconds) // 86400


def _text(value: object, name: str, required: bool = True) -> str:
    if value is None:
        value = ""
    elif not isinstance(value, str):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRow(f"{name}: expected a string, got {type(value).__name__}")
        value = str(value)
    value = value.strip()
    if required and not value:
        raise BadRow(f"{name} is empty")
    return value


def _flag(value: object, name: str) -> int:
    if value is True or value == 1:
        return 1
    if value is False or value == 0:
        return 0
    if isinstance(value, str):
        v = value.strip()
        if v in _TRUE:
            return 1
        if v in _FALSE:
            return 0
    raise BadRow(f"{name}={value!r} is not a boolean (0/1/true/false)")


def _number(value: object, name: str) -> float:
    if isinstance(value, bool):
        raise BadRow(f"{name}={value!r} is not a number")
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BadRow(f"{name}={value!r} is not a number") from None
    if not x >= 0 or x == float("inf"):
        raise BadRow(f"{name}={value!r} must be a finite number >= 0")
    return x


def _yyyymmdd(value: object, name: str) -> date:
    text = _text(value, name)
    if len(text) != 8 or not text.isdigit():
        raise BadRow(f"{name}={text!r} is not a YYYYMMDD date")
    try:
        return date(int(text[:4]), int(text[4:6]), int(text[6:]))
    except ValueError:
        raise BadRow(f"{name}={text!r} is not a valid date") from None


def unix_time(value: object) -> int:
    """Unix seconds of a validation time: an integer, or ISO 8601 with a UTC offset."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = _text(value, "time")
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadRow(f"time={text!r} is not ISO 8601 or Unix seconds") from None
    if moment.tzinfo is None:
        # A wall time without an offset is ambiguous once a year (DST fall-back hour).
        raise BadRow(f"time={text!r} has no UTC offset")
    return int(moment.timestamp())


def parse_validation(row: list, clock: DayClock) -> tuple:
    """(t, op_day, agency, line, stop, vehicle, valid) of one validation."""
    raw_t, agency, line, stop, vehicle, valid = row
    # The common case (CSV strings, clean values) inline: this runs ten million times.
    if type(raw_t) is str and type(agency) is str and type(line) is str and type(stop) is str:
        t = int(raw_t) if raw_t.isdigit() else clock.unix(raw_t)
        agency, line, stop = agency.strip(), line.strip(), stop.strip()
        if not agency:
            raise BadRow("agency_id is empty")
        if not line:
            raise BadRow("line_id is empty")
        if not stop:
            raise BadRow("stop_id is empty")
    else:
        t = unix_time(raw_t)
        agency, line, stop = (
            _text(agency, "agency_id"),
            _text(line, "line_id"),
            _text(stop, "stop_id"),
        )
    flag = 1 if valid == "1" else 0 if valid == "0" else _flag(valid, "valid")
    return (
        t,
        clock.op_day(t),
        agency,
        line,
        stop,
        vehicle.strip() if type(vehicle) is str else _text(vehicle, "vehicle_id", required=False),
        flag,
    )


def parse_ride(row: list, tz: ZoneInfo) -> tuple:
    """(op_day, agency, line, trip, start, start_unix, one, three, svkm, dvkm, delay, empty)."""
    day = _yyyymmdd(row[0], "operational_date")
    start = _text(row[4], "scheduled_start")
    try:
        seconds = parse_time(start)
    except BadTime:
        raise BadRow(f"scheduled_start={start!r} is not H:MM:SS") from None
    delay_raw = row[9]
    delay: int | None
    if delay_raw is None or (isinstance(delay_raw, str) and not delay_raw.strip()):
        delay = None  # not measured (no AVL data for the ride)
    else:
        try:
            delay = int(float(delay_raw))
        except (TypeError, ValueError):
            raise BadRow(f"delay_seconds={delay_raw!r} is not a number") from None
    return (
        day_number(day),
        _text(row[1], "agency_id"),
        _text(row[2], "line_id"),
        _text(row[3], "trip_id"),
        start,
        service_time_unix(day, seconds, tz),
        _flag(row[5], "pass_one_validation"),
        _flag(row[6], "pass_three_events"),
        _number(row[7], "scheduled_vkm"),
        _number(row[8], "driven_vkm"),
        delay,
        _flag(row[10], "empty"),
    )


def parse_complaint(row: list) -> tuple:
    """(id, day, category, channel, line, municipality) of one complaint."""
    category = _text(row[2], "category")
    if category not in CATEGORIES:
        raise BadRow(f"category={category!r} is not one of {', '.join(sorted(CATEGORIES))}")
    return (
        _text(row[0], "id"),
        day_number(_yyyymmdd(row[1], "date")),
        category,
        _text(row[3], "channel").lower(),
        _text(row[4], "line_id", required=False),
        _text(row[5], "municipality_id", required=False),
    )
