"""backends.load_settings as the settings tests (tests/daemon/test_settings*.py) call it: `load`
the settings of an environment given as keywords (`on_memory`: on the memory backend), or the
one-line `error` it is refused with;
`Recorder`, an environment that remembers which names the settings asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from ratelimitd.backends import load_settings
from ratelimitd.settings import Settings, SettingsError


def load(**env: str) -> Settings:
    return load_settings(env)


def on_memory(**env: str) -> Settings:
    """`load` with BACKEND_TYPE=memory: settings that need no store running."""
    return load_settings({"BACKEND_TYPE": "memory", **env})


def error(**env: str) -> str:
    with pytest.raises(SettingsError) as info:
        load_settings(env)
    message = str(info.value)
    assert "\n" not in message
    return message


class Recorder(dict[str, str]):
    """An environment that remembers which names were asked for."""

    def __init__(self, env: Mapping[str, str]) -> None:
        super().__init__(env)
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.asked.add(key)
        return super().get(key, default)
