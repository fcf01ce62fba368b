"""Log line shapes: logrus text and JSON formatters, level mapping, configure_logging."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from collections.abc import Iterator
from datetime import datetime

import pytest

from ratelimitd.backends import load_settings
from ratelimitd.process import logs
from ratelimitd.process.logs import (
    TRACE,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    level_from_name,
    logrus_level_name,
)

TEXT_LINE = re.compile(
    r'^time="(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:Z|[+-]\d\d:\d\d))" '
    r"level=(?P<level>\w+)(?: msg=(?P<msg>.*))?$"
)
RFC3339_NANO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d*[1-9])?(?:Z|[+-]\d\d:\d\d)$")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    ours = logging.getLogger(logs.LOGGER_NAME)
    saved = (list(root.handlers), root.level, ours.level)
    yield
    for handler in root.handlers:
        if handler not in saved[0]:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(saved[1])
    ours.setLevel(saved[2])


def record(
    message: str = "hello",
    *args: object,
    level: int = logging.WARNING,
    created: float | None = None,
    fields: dict[str, object] | None = None,
) -> logging.LogRecord:
    rec = logging.LogRecord("ratelimitd.test", level, __file__, 1, message, args, None)
    if created is not None:
        rec.created = created
        rec.msecs = 0
    if fields is not None:
        rec.fields = fields
    return rec


def configured(**env: str) -> tuple[io.StringIO, logging.Logger]:
    stream = io.StringIO()
    configure_logging(load_settings(env), stream=stream)
    return stream, logging.getLogger("ratelimitd.component")


# --- levels ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("trace", TRACE),
        ("debug", logging.DEBUG),
        ("info", logging.INFO),
        ("warn", logging.WARNING),
        ("WARNING", logging.WARNING),
        ("error", logging.ERROR),
        ("fatal", logging.CRITICAL),
        ("panic", logging.CRITICAL),
    ],
)
def test_level_from_name(name: str, level: int) -> None:
    assert level_from_name(name) == level


def test_level_from_name_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="not a valid logrus Level"):
        level_from_name("loud")


@pytest.mark.parametrize(
    ("level", "name"),
    [
        (TRACE, "trace"),
        (logging.DEBUG, "debug"),
        (logging.INFO, "info"),
        (logging.WARNING, "warning"),
        (logging.ERROR, "error"),
        (logging.CRITICAL, "fatal"),
    ],
)
def test_logrus_level_names(level: int, name: str) -> None:
    assert logrus_level_name(level) == name


# --- text formatter -------------------------------------------------------------------------


def test_text_line_shape() -> None:
    line = TextFormatter().format(record("connecting to redis on %s", "localhost:6379"))
    match = TEXT_LINE.match(line)
    assert match is not None, line
    assert match["level"] == "warning"
    assert match["msg"] == '"connecting to redis on localhost:6379"'
    assert "\n" not in line


def test_text_time_is_rfc3339_in_local_time() -> None:
    created = 1_700_000_000.25
    line = TextFormatter().format(record(created=created))
    match = TEXT_LINE.match(line)
    assert match is not None
    parsed = datetime.fromisoformat(match["time"].replace("Z", "+00:00"))
    assert parsed.timestamp() == int(created)
    expected = datetime.fromtimestamp(created).astimezone()
    assert parsed.utcoffset() == expected.utcoffset()


@pytest.mark.parametrize(
    ("message", "rendered"),
    [
        ("ok", "msg=ok"),
        ("a-b.c_d/e@f^g+h", "msg=a-b.c_d/e@f^g+h"),
        ("two words", 'msg="two words"'),
        ("k=v", 'msg="k=v"'),
        ("a:b", 'msg="a:b"'),
        ('say "hi"', 'msg="say \\"hi\\""'),
        ("back\\slash", 'msg="back\\\\slash"'),
        ("line\nbreak\ttab", 'msg="line\\nbreak\\ttab"'),
        ("bell\x07", 'msg="bell\\a"'),
        ("nul\x00", 'msg="nul\\x00"'),
        ("del\x7f", 'msg="del\\x7f"'),
        ("é", 'msg="é"'),
        ("\u200b", 'msg="\\u200b"'),
    ],
)
def test_text_quoting_follows_logrus(message: str, rendered: str) -> None:
    line = TextFormatter().format(record(message))
    assert line.endswith(" " + rendered)


def test_text_empty_message_is_omitted() -> None:
    line = TextFormatter().format(record(""))
    assert re.fullmatch(r'time="[^"]+" level=warning', line)


def test_text_fields_sorted_after_message() -> None:
    line = TextFormatter().format(record("m", fields={"zone": "a b", "b": 2, "a": "x"}))
    assert line.endswith(' msg=m a=x b=2 zone="a b"')


def test_text_exception_stays_on_one_line() -> None:
    try:
        raise RuntimeError("bad")
    except RuntimeError:
        rec = logging.LogRecord(
            "ratelimitd", logging.ERROR, __file__, 1, "failed", (), exc_info=sys.exc_info()
        )
    line = TextFormatter().format(rec)
    assert "\n" not in line
    assert line.startswith("time=") and ' level=error msg="failed\\nTraceback' in line
    assert "RuntimeError: bad" in line


# --- JSON formatter -------------------------------------------------------------------------


def test_json_line_shape() -> None:
    line = JsonFormatter().format(record("connecting to %s", "redis", level=logging.INFO))
    assert "\n" not in line
    data = json.loads(line)
    assert set(data) == {"@timestamp", "@message", "level"}
    assert data["@message"] == "connecting to redis"
    assert data["level"] == "info"
    assert RFC3339_NANO.match(data["@timestamp"]), data["@timestamp"]
    # Go's encoder sorts map keys and writes no spaces.
    assert line.startswith('{"@message":"connecting to redis","@timestamp":"')
    assert line.endswith('","level":"info"}')


def test_json_timestamp_is_rfc3339_nano() -> None:
    created = 1_700_000_000.5
    data = json.loads(JsonFormatter().format(record(created=created)))
    stamp = data["@timestamp"]
    assert RFC3339_NANO.match(stamp)
    assert ".5" in stamp and ".50" not in stamp  # trailing zeros dropped, as Go does
    whole = json.loads(JsonFormatter().format(record(created=1_700_000_000.0)))["@timestamp"]
    assert "." not in whole
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert parsed.timestamp() == created


@pytest.mark.parametrize(
    ("level", "name"),
    [(TRACE, "trace"), (logging.DEBUG, "debug"), (logging.ERROR, "error"),
     (logging.CRITICAL, "fatal"), (logging.WARNING, "warning")],
)  # fmt: skip
def test_json_level_names(level: int, name: str) -> None:
    assert json.loads(JsonFormatter().format(record(level=level)))["level"] == name


def test_json_escapes_html_like_go_and_keeps_unicode() -> None:
    line = JsonFormatter().format(record('<a href="x">&é\n'))
    assert '"@message":"\\u003ca href=\\"x\\"\\u003e\\u0026é\\n"' in line
    assert json.loads(line)["@message"] == '<a href="x">&é\n'


def test_json_fields_and_clashes() -> None:
    line = JsonFormatter().format(record("m", fields={"level": "x", "domain": "d", "n": 3}))
    data = json.loads(line)
    assert data["domain"] == "d" and data["n"] == 3
    assert data["fields.level"] == "x" and data["level"] == "warning"
    assert list(data) == sorted(data)


def test_json_empty_message_is_kept() -> None:
    assert json.loads(JsonFormatter().format(record("")))["@message"] == ""


# --- configure_logging ----------------------------------------------------------------------


def test_default_level_is_warn_with_text_lines() -> None:
    stream, log = configured()
    log.info("hidden")
    log.warning("shown %d", 1)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    match = TEXT_LINE.match(lines[0])
    assert match is not None
    assert (match["level"], match["msg"]) == ("warning", '"shown 1"')


def test_json_format_and_debug_level() -> None:
    stream, log = configured(LOG_FORMAT="json", LOG_LEVEL="debug")
    log.debug("a debug line")
    log.log(TRACE, "too detailed")
    [line] = stream.getvalue().splitlines()
    data = json.loads(line)
    assert (data["@message"], data["level"]) == ("a debug line", "debug")


def test_trace_level_lets_everything_through() -> None:
    stream, log = configured(LOG_LEVEL="trace")
    log.log(TRACE, "deep")
    assert "level=trace msg=deep" in stream.getvalue()


@pytest.mark.parametrize("level", ["fatal", "panic"])
def test_fatal_and_panic_show_only_critical(level: str) -> None:
    stream, log = configured(LOG_LEVEL=level)
    log.error("not shown")
    log.critical("shown")
    assert stream.getvalue().count("\n") == 1
    assert "level=fatal msg=shown" in stream.getvalue()


def test_library_loggers_stay_quiet_below_warning() -> None:
    stream, _ = configured(LOG_LEVEL="debug")
    logging.getLogger("hpack.hpack").debug("noise")
    logging.getLogger("asyncio").warning("real problem")
    out = stream.getvalue()
    assert "noise" not in out
    assert 'msg="real problem"' in out


def test_reconfiguring_replaces_the_handler() -> None:
    first, log = configured()
    second, _ = configured(LOG_FORMAT="json")
    log.warning("once")
    assert first.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 1
    assert sum(h.get_name() == logs.LOGGER_NAME for h in logging.getLogger().handlers) == 1


def test_writes_to_stderr_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(load_settings({"LOG_LEVEL": "info"}))
    logging.getLogger("ratelimitd").info("to stderr")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert 'level=info msg="to stderr"' in captured.err
