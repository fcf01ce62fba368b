"""Logging set-up: the reference's logrus line shapes on top of the stdlib ``logging`` module.

Text (default)::

    time="2026-11-22T03:39:49Z" level=warning msg="connecting to redis on host:6379"

follows logrus's ``TextFormatter`` without a terminal: ``key=value`` pairs, a value quoted Go-style
(``%q``) when it holds anything but ``[A-Za-z0-9-._/@^+]``, the time in RFC 3339, ``msg`` left out
when empty, extra fields (``extra={"fields": {...}}``) appended sorted by key.

``LOG_FORMAT=json`` gives one JSON object per line, as logrus's ``JSONFormatter`` with the
reference's field map: keys sorted (``@message``, ``@timestamp``, ``level``, then fields),
``@timestamp`` in RFC 3339 with nanosecond precision (trailing zeros dropped), HTML characters
escaped as Go's encoder does.

Levels are logrus names. ``LOG_LEVEL=trace`` maps to :data:`TRACE` (``DEBUG - 5``); ``fatal`` and
``panic`` both map to ``CRITICAL``, which is printed as ``fatal``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from ratelimitd.settings import Settings

__all__ = [
    "LOGGER_NAME",
    "TRACE",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "level_from_name",
    "logrus_level_name",
]

LOGGER_NAME = "ratelimitd"
TRACE = logging.DEBUG - 5

_LEVELS = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "panic": logging.CRITICAL,
}
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._/@^+")
_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    '"': '\\"',
    "\\": "\\\\",
}
# Go's encoding/json escapes these by default (SetEscapeHTML(true) in logrus).
_JSON_HTML = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def level_from_name(name: str) -> int:
    """Map a logrus level name (any case) to a stdlib logging level; raise ValueError."""
    try:
        return _LEVELS[name.lower()]
    except KeyError:
        raise ValueError(f"not a valid logrus Level: {name!r}") from None


def logrus_level_name(levelno: int) -> str:
    """The logrus name printed for a stdlib level number."""
    if levelno >= logging.CRITICAL:
        return "fatal"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    if levelno >= logging.INFO:
        return "info"
    if levelno >= logging.DEBUG:
        return "debug"
    return "trace"


def go_quote(text: str) -> str:
    """Quote like Go's strconv.Quote (the %q verb: logrus, and the client CLI's output)."""
    out = ['"']
    for ch in text:
        escaped = _GO_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def _text_value(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    if text and all(ch in _SAFE for ch in text):
        return text
    return go_quote(text) if text else ""


def _record_time(record: logging.LogRecord) -> datetime:
    # Local time, as Go's time.Now(); printed with "Z" when the zone is UTC.
    return datetime.fromtimestamp(record.created).astimezone()


def _zone(moment: datetime) -> str:
    offset = moment.strftime("%z")  # "+0100"; Go's Z07:00 prints "Z" for UTC and "+01:00"
    if offset in ("", "+0000", "-0000"):
        return "Z"
    return f"{offset[:3]}:{offset[3:5]}"


def _rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + _zone(moment)


def _rfc3339_nano(moment: datetime) -> str:
    # Go's RFC3339Nano drops trailing zeros of the fraction (and the dot when it is zero);
    # LogRecord.created only carries microseconds, so that is the precision here.
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if fraction:
        stamp += "." + fraction
    return stamp + _zone(moment)


def _message(record: logging.LogRecord, formatter: logging.Formatter) -> str:
    message = record.getMessage()
    # Keep one line per record: the traceback travels inside the quoted/JSON message.
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    if record.exc_text:
        message = f"{message}\n{record.exc_text}" if message else record.exc_text
    if record.stack_info:
        message = f"{message}\n{formatter.formatStack(record.stack_info)}"
    return message


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return dict(fields) if isinstance(fields, dict) else {}


class TextFormatter(logging.Formatter):
    """logrus TextFormatter lines: ``time=... level=... msg=... k=v``."""

    def format(self, record: logging.LogRecord) -> str:
        """Render one record as one line."""
        parts = [
            "time=" + _text_value(_rfc3339(_record_time(record))),
            "level=" + logrus_level_name(record.levelno),
        ]
        message = _message(record, self)
        if message:
            parts.append("msg=" + _text_value(message))
        fields = _fields(record)
        parts.extend(f"{key}={_text_value(fields[key])}" for key in sorted(fields))
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """logrus JSONFormatter lines with the reference's ``@timestamp`` / ``@message`` keys."""

    def format(self, record: logging.LogRecord) -> str:
        """Render one record as one JSON object."""
        data: dict[str, Any] = {}
        for key, value in _fields(record).items():
            # logrus renames clashing fields with a "fields." prefix.
            name = f"fields.{key}" if key in ("@message", "@timestamp", "level") else key
            plain = isinstance(value, str | int | float | bool | None)
            data[name] = value if plain else str(value)
        data["@timestamp"] = _rfc3339_nano(_record_time(record))
        data["@message"] = _message(record, self)
        data["level"] = logrus_level_name(record.levelno)
        text = json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        return text.translate(_JSON_HTML)


def configure_logging(settings: Settings, stream: TextIO | None = None) -> None:
    """Install the reference's log format and level (LOG_LEVEL, LOG_FORMAT) on the root logger."""
    level = level_from_name(settings.log.level)
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if settings.log.format == "json" else TextFormatter())
    handler.set_name(LOGGER_NAME)
    root = logging.getLogger()
    # Replace a handler installed by an earlier call (tests, workers re-configuring) only.
    for old in [h for h in root.handlers if h.get_name() == LOGGER_NAME]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    # Libraries (hpack, grpc, asyncio) are chatty below WARNING, so the root logger they inherit
    # from stays at WARNING or above; our own logger follows LOG_LEVEL exactly.
    root.setLevel(max(level, logging.WARNING))
    logging.getLogger(LOGGER_NAME).setLevel(level)
    logging.addLevelName(TRACE, "TRACE")
