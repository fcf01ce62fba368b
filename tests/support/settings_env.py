"""Settings.from_env as the settings tests (tests/daemon/test_settings*.py) call it: `load`
the settings of an environment given as keywords, or the one-line `error` it is refused with.
"""

from __future__ import annotations

import pytest

from ratelimitd.settings import Settings, SettingsError


def load(**env: str) -> Settings:
    return Settings.from_env(env)


def error(**env: str) -> str:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    message = str(info.value)
    assert "\n" not in message
    return message
