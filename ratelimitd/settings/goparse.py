"""Go-syntax values (envconfig's parsers) and a typed reader over one environment mapping.

The reference reads its settings with envconfig, so values follow Go's parsers:

* booleans use ``strconv.ParseBool`` (``1 t T TRUE true True`` / ``0 f F FALSE false False``);
* integers use ``strconv.ParseInt(s, 0, 64)`` (``8080``, ``0x1F90``, ``017``, ``1_000``);
* durations use ``time.ParseDuration`` (``10s``, ``150us``, ``1h30m``, ``0``) and are stored as
  float seconds;
* maps are ``k1:v1,k2:v2`` and are stored as tuples of ``(key, value)`` pairs; lists are comma
  separated and stored as tuples.

Deliberate differences, all more lenient: a variable that is set but empty takes its default
when the setting is a number, boolean, duration or enumeration (envconfig would fail to parse
``""``), while plain strings keep the empty value; list items and map keys/values are stripped
and empty list items dropped; a map item is split at its first ``:`` so a value may contain
``:``.

This module never touches ``os.environ``: :class:`Env` reads the mapping it is given.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

__all__ = [
    "Env",
    "Pairs",
    "SettingsError",
    "invalid",
    "parse_go_bool",
    "parse_go_duration",
    "parse_go_int",
]

Pairs = tuple[tuple[str, str], ...]

_BOOL_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_BOOL_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_BOOL_ACCEPTED = "accepted: 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False"
_DURATION_EXPECTED = "expected a Go duration >= 0 such as 10s, 150us, 1h30m or 0"

# Nanoseconds per Go duration unit; both micro signs are accepted by time.ParseDuration.
_DURATION_UNITS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_MAX_DURATION_NS = (1 << 63) - 1

# The spellings of the service specification, read as the reference's names. When both are
# set, the REDIS_ / MEMCACHE_ one wins.
_ALIASES = (("REDIS_", "KVCACHE_"), ("MEMCACHE_", "ALTCACHE_"))


class SettingsError(ValueError):
    """An environment variable holds a value the daemon cannot start with."""


def invalid(name: str, value: str, accepted: str) -> SettingsError:
    """The one-line error for a bad value: the variable, the value and what is accepted."""
    # repr() keeps the message on one line whatever the value contains.
    return SettingsError(f"{name}: invalid value {value!r} ({accepted})")


def parse_go_bool(value: str) -> bool:
    """Parse a boolean as Go's strconv.ParseBool does; raise ValueError otherwise."""
    if value in _BOOL_TRUE:
        return True
    if value in _BOOL_FALSE:
        return False
    raise ValueError(f"invalid boolean {value!r}")


def parse_go_int(value: str) -> int:
    """Parse an integer as Go's strconv.ParseInt(s, 0, 64) does; raise ValueError otherwise."""
    if not value.isascii() or value != value.strip():
        raise ValueError(f"invalid integer {value!r}")
    sign, body = (value[0], value[1:]) if value[:1] in ("+", "-") else ("", value)
    if not body or body[0] in ("+", "-"):
        raise ValueError(f"invalid integer {value!r}")
    if len(body) > 1 and body[0] == "0" and body[1] not in "xXoObB":
        # Go reads a bare leading zero as octal ("017" == 15); Python's int(s, 0) refuses it.
        body = "0o" + body[1:]
    result = int(sign + body, 0)
    if not -(1 << 63) <= result < (1 << 63):
        raise ValueError(f"integer out of range {value!r}")
    return result


def parse_go_duration(value: str) -> float:
    """Parse a Go time.ParseDuration string (``10s``, ``150us``, ``1h30m``) into seconds."""
    text = value
    negative = False
    if text[:1] in ("-", "+"):
        negative = text[0] == "-"
        text = text[1:]
    if text == "0":
        return 0.0
    if not text:
        raise ValueError(f"invalid duration {value!r}")
    total = 0
    pos = 0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        assert match is not None  # every part of the pattern is optional
        whole, frac, unit = match.groups()
        if not whole and not frac:
            raise ValueError(f"invalid duration {value!r}")
        if not unit:
            raise ValueError(f"missing unit in duration {value!r}")
        scale = _DURATION_UNITS.get(unit)
        if scale is None:
            raise ValueError(f"unknown unit {unit!r} in duration {value!r}")
        part = int(whole or "0") * scale
        if frac:
            part += int(frac) * scale // 10 ** len(frac)
        total += part
        if total > _MAX_DURATION_NS:
            raise ValueError(f"invalid duration {value!r}")
        pos = match.end()
    return -total / 1e9 if negative else total / 1e9


class Env:
    """Typed lookups over one environment mapping; errors are one-line SettingsErrors.

    ``KVCACHE_<X>`` answers for an unset ``REDIS_<X>`` and ``ALTCACHE_<X>`` for ``MEMCACHE_<X>``.
    """

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, str]) -> None:
        self.raw = raw

    def get(self, name: str) -> str | None:
        """The raw value (an alias stands in for an unset canonical name), or None."""
        value = self.raw.get(name)
        if value is None:
            for canonical, alias in _ALIASES:
                if name.startswith(canonical):
                    return self.raw.get(alias + name[len(canonical) :])
        return value

    def items(self) -> list[tuple[str, str]]:
        """Every (name, value), alias spellings under their canonical names."""
        out = dict(self.raw)
        for key, value in self.raw.items():
            for canonical, alias in _ALIASES:
                if key.startswith(alias):
                    out.setdefault(canonical + key[len(alias) :], value)
        return list(out.items())

    def typed(self, name: str) -> str | None:
        """The value, or None when unset or empty (a typed setting then takes its default)."""
        value = self.get(name)
        return value if value else None

    def get_str(self, name: str, default: str = "") -> str:
        """A plain string: set-but-empty stays empty, as in the reference."""
        value = self.get(name)
        return default if value is None else value

    def get_bool(self, name: str, default: bool) -> bool:
        """A Go boolean."""
        value = self.typed(name)
        if value is None:
            return default
        try:
            return parse_go_bool(value)
        except ValueError:
            raise invalid(name, value, _BOOL_ACCEPTED) from None

    def get_int(self, name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        """A Go integer within [lo, hi]."""
        value = self.typed(name)
        if value is None:
            return default
        if lo is not None and hi is not None:
            expected = f"expected an integer {lo}-{hi}"
        elif lo is not None:
            expected = f"expected an integer >= {lo}"
        else:
            expected = "expected an integer"
        try:
            result = parse_go_int(value)
        except ValueError:
            raise invalid(name, value, expected) from None
        if (lo is not None and result < lo) or (hi is not None and result > hi):
            raise invalid(name, value, expected)
        return result

    def get_port(self, name: str, default: int) -> int:
        """A TCP port, 0 included (the kernel picks one)."""
        return self.get_int(name, default, 0, 65535)

    def get_float(
        self, name: str, default: float, lo: float | None = None, hi: float | None = None
    ) -> float:
        """A finite decimal number within [lo, hi]."""
        value = self.typed(name)
        if value is None:
            return default
        if lo is not None and hi is not None:
            expected = f"expected a number between {lo:g} and {hi:g}"
        else:
            expected = "expected a number"
        try:
            if not value.isascii() or value != value.strip():
                raise ValueError(value)
            result = float(value)
        except ValueError:
            raise invalid(name, value, expected) from None
        if not math.isfinite(result):
            raise invalid(name, value, expected)
        if (lo is not None and result < lo) or (hi is not None and result > hi):
            raise invalid(name, value, expected)
        return result

    def get_duration(self, name: str, default: float, positive: bool = False) -> float:
        """A Go duration in seconds, >= 0 (> 0 with `positive`)."""
        value = self.typed(name)
        if value is None:
            return default
        expected = _DURATION_EXPECTED.replace(">= 0", "> 0") if positive else _DURATION_EXPECTED
        try:
            result = parse_go_duration(value)
        except ValueError:
            raise invalid(name, value, expected) from None
        if result < 0 or (positive and result == 0):
            raise invalid(name, value, expected)
        return result

    def get_choice(
        self,
        name: str,
        default: str,
        choices: Mapping[str, str],
        case_sensitive: bool = False,
        accepted: str = "",
    ) -> str:
        """One of `choices` (mapped to its canonical spelling)."""
        value = self.typed(name)
        if value is None:
            return default
        key = value if case_sensitive else value.lower()
        if key not in choices:
            accepted = accepted or ", ".join(choices)
            raise invalid(name, value, f"accepted: {accepted}")
        return choices[key]

    def get_list(self, name: str) -> tuple[str, ...]:
        """A comma-separated list (blank items dropped)."""
        value = self.get(name) or ""
        return tuple(item.strip() for item in value.split(",") if item.strip())

    def get_map(self, name: str, separator: str = ":") -> Pairs:
        """A ``k1:v1,k2:v2`` map; a repeated key keeps its last value, as a Go map."""
        value = self.get(name) or ""
        result: dict[str, str] = {}
        for item in value.split(","):
            if not item.strip():
                continue
            key, sep, val = item.partition(separator)
            if not sep:
                raise invalid(name, value, f"expected k1{separator}v1,k2{separator}v2")
            result[key.strip()] = val.strip()
        return tuple(result.items())
