"""The one environment reader of the sidecars: `<PREFIX>_<name>` lookups with shared rules.

Each sidecar's `settings.py` builds its frozen settings through an `Environment` and is the
only module of that sidecar that touches `os.environ` (`Environment.of(None)` reads it there).
The rules are the same for every variable of every sidecar: unset or empty means the default
(except where a method says otherwise), a value that cannot be used raises `SettingsError`
naming the variable, its value and what it accepts.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from datetime import date, datetime

FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


class SettingsError(ValueError):
    """A sidecar's environment variable has a value that cannot be used."""


class Environment:
    """Typed lookups of `<prefix><name>` in one mapping (the process environment by default)."""

    __slots__ = ("environ", "prefix")

    def __init__(self, environ: Mapping[str, str] | None, prefix: str) -> None:
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.prefix = prefix

    def is_set(self, name: str) -> bool:
        """Whether the variable is set to something other than blanks."""
        return bool(self.environ.get(self.prefix + name, "").strip())

    def raw(self, name: str, default: str) -> str:
        """The value exactly as given (blanks kept, set but empty is ""); unset: the default."""
        return self.environ.get(self.prefix + name, default)

    def text(self, name: str, default: str) -> str:
        """A value, stripped; unset or empty: the default."""
        return self.environ.get(self.prefix + name, "").strip() or default

    def optional(self, name: str, default: str | None) -> str | None:
        """A value that can be switched off: unset is the default, set but empty is None."""
        value = self.environ.get(self.prefix + name)
        if value is None:
            return default
        return value.strip() or None

    def names(self, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        """A comma-separated list; unset: the default, set but empty: none."""
        if self.prefix + name not in self.environ:
            return default
        return tuple(p.strip() for p in self.environ[self.prefix + name].split(",") if p.strip())

    def number(self, name: str, default: float, lo: float = 0.0) -> float:
        """A number of at least `lo`; unset or empty: the default."""
        raw = self.environ.get(self.prefix + name, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{self.prefix}{name}={raw!r} is not a number") from None
        if not value >= lo:
            if lo == 0:
                raise SettingsError(f"{self.prefix}{name}={raw!r} must not be negative")
            raise SettingsError(f"{self.prefix}{name}={raw!r} must be at least {lo:g}")
        return value

    def integer(self, name: str, default: int, lo: int = 0) -> int:
        """A whole number of at least `lo` (a fraction is truncated); unset or empty: the
        default."""
        return int(self.number(name, default, lo))

    def share(self, name: str, default: float) -> float:
        """A fraction in [0, 1]; unset or empty: the default."""
        value = self.number(name, default)
        if value > 1:
            raise SettingsError(f"{self.prefix}{name}={value!r} must be between 0 and 1")
        return value

    def flag(self, name: str, default: bool) -> bool:
        """true/false (also 1/0, yes/no, any case); unset or empty: the default."""
        raw = self.environ.get(self.prefix + name, "").strip().lower()
        if not raw:
            return default
        if raw not in FLAGS:
            raise SettingsError(f"{self.prefix}{name}={raw!r} (accepted: true, false)")
        return FLAGS[raw]

    def choice(self, name: str, default: str, accepted: tuple[str, ...]) -> str:
        """One of `accepted` (any case); unset or empty: the default."""
        value = self.text(name, default).lower()
        if value not in accepted:
            raise SettingsError(f"{self.prefix}{name}={value!r} (accepted: {', '.join(accepted)})")
        return value

    def pattern(self, name: str, default: str | None) -> str | None:
        """A regular expression matched against whole ids; unset: the default, empty: none."""
        value = self.optional(name, default)
        if value is not None:
            try:
                re.compile(value, re.ASCII)
            except re.error as exc:
                raise SettingsError(
                    f"{self.prefix}{name}={value!r} is not a regex: {exc}"
                ) from None
        return value

    def headers(self, name: str) -> dict[str, str]:
        """A JSON object of HTTP request headers (`{"x-api-key": "..."}`); unset or empty:
        none. Values are credentials, so an error names the variable, never its value."""
        raw = self.environ.get(self.prefix + name, "").strip()
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k.strip() for k, v in value.items()
        ):
            raise SettingsError(
                f"{self.prefix}{name} must be a JSON object of header names to string values, "
                'e.g. {"x-api-key": "..."} (value not shown)'
            )
        return {k.strip(): v for k, v in value.items()}

    def day(self, name: str, default: date) -> date:
        """An ISO 8601 date; unset or empty: the default."""
        raw = self.environ.get(self.prefix + name, "").strip()
        if not raw:
            return default
        try:
            return date.fromisoformat(raw)
        except ValueError:
            raise SettingsError(f"{self.prefix}{name}={raw!r} is not a date") from None

    def instant(self, name: str) -> datetime | None:
        """An ISO 8601 instant with a UTC offset; unset or empty: None."""
        raw = self.environ.get(self.prefix + name, "").strip()
        if not raw:
            return None
        try:
            value = datetime.fromisoformat(raw)
        except ValueError:
            raise SettingsError(f"{self.prefix}{name}={raw!r} is not an ISO 8601 time") from None
        if value.tzinfo is None:
            raise SettingsError(
                f"{self.prefix}{name} needs a UTC offset, e.g. 2014-06-10T08:00+10:00"
            )
        return value
