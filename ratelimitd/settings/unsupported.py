"""Variables of the reference that ratelimitd refuses at start-up rather than ignore.

A setting accepted and then ignored is a defect: the operator believes it does something. So
each variable below is refused, with one line naming it and why, when its value asks for
behaviour ratelimitd does not implement. The rule: a refused variable is still accepted when
it is unset, empty, or set to the reference's default (that asks for nothing more than leaving
it unset) or to a value that describes what ratelimitd does anyway; any other value stops
start-up. Values are validated first, with the usual "invalid value" errors.

This table is the one place to shrink: implementing a setting means deleting its rows here
(and turning its rows in ``tests/daemon/test_reference_settings.py`` from refused into
implemented).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .goparse import Env, SettingsError

__all__ = ["UNSUPPORTED", "Unsupported", "refuse_unsupported"]

Accepts = Callable[[Env, str], bool]


@dataclass(frozen=True, slots=True)
class Unsupported:
    """One refused variable: which values are still accepted, and why the others are not."""

    variable: str
    accepts: Accepts  # (env, variable) -> True when the value asks for nothing we lack
    why: str


def _upper(*accepted: str) -> Accepts:
    return lambda env, name: env.get_str(name).upper() in accepted


def _none(env: Env, name: str) -> bool:
    return False


_POOL = (
    "not implemented: requests share pipelined connections, so the pool never runs empty; the "
    "reference "
    "panics at start-up on CREATE and ERROR too since radix v4; unset it or set WAIT"
)
_WAIT = "not a setting since the reference moved to radix v4 (only its README names it); unset it"


def _redis(suffix: str, accepts: Accepts, why: str) -> tuple[Unsupported, ...]:
    # The main and the per-second instance take the same variable.
    return tuple(
        Unsupported(prefix + suffix, accepts, why) for prefix in ("REDIS_", "REDIS_PERSECOND_")
    )


UNSUPPORTED: tuple[Unsupported, ...] = (
    # Redis pool knobs of the reference's driver that ratelimitd's pool has no use for.
    *_redis("POOL_ON_EMPTY_BEHAVIOR", _upper("WAIT"), _POOL),
    *_redis("POOL_ON_EMPTY_WAIT_DURATION", _none, _WAIT),
)


def refuse_unsupported(env: Env) -> None:
    """Raise SettingsError for the first variable whose value asks for what we lack."""
    for entry in UNSUPPORTED:
        value = env.get(entry.variable)
        if value and not entry.accepts(env, entry.variable):
            raise SettingsError(f"{entry.variable}: unsupported value {value!r} ({entry.why})")
