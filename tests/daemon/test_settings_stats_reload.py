"""Settings of the stats and reload sections: the stats sink the reference's runner would
choose and the DogStatsD mogrifiers; the reload-time overrides (and the response settings
checked with them).
"""

from __future__ import annotations

import pytest
from support.settings_env import error, load

from ratelimitd.backends import load_settings
from ratelimitd.settings import (
    DogStatsdMogrifier,
    ReloadOptions,
    SettingsError,
    reload_options_from_env,
)

# --- stats sink -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "sink"),
    [
        ({}, "statsd"),
        ({"USE_STATSD": "false"}, "stdout"),
        ({"USE_STATSD": "false", "USE_DOG_STATSD": "true"}, "dogstatsd"),
        ({"USE_STATSD": "false", "USE_PROMETHEUS": "true"}, "prometheus"),
        ({"DISABLE_STATS": "true"}, "null"),
        ({"DISABLE_STATS": "true", "USE_DOG_STATSD": "1", "USE_PROMETHEUS": "1"}, "null"),
    ],
)
def test_stats_sink_chosen_as_the_reference_runner(env: dict[str, str], sink: str) -> None:
    assert load_settings(env).stats.sink == sink


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"USE_PROMETHEUS": "true"}, "USE_STATSD, USE_PROMETHEUS"),
        ({"USE_DOG_STATSD": "true"}, "USE_DOG_STATSD, USE_STATSD"),
        (
            {"USE_STATSD": "0", "USE_DOG_STATSD": "true", "USE_PROMETHEUS": "T"},
            "USE_DOG_STATSD, USE_PROMETHEUS",
        ),
    ],
)
def test_two_stats_sinks_are_refused(env: dict[str, str], names: str) -> None:
    message = error(**env)
    assert message.startswith(f"{names}: invalid combination ")
    assert "USE_STATSD=false" in message  # tells the user how to fix the default


def test_dogstatsd_mogrifiers() -> None:
    s = load(
        USE_STATSD="false",
        USE_DOG_STATSD="true",
        USE_DOG_STATSD_MOGRIFIERS="tag, second",
        DOG_STATSD_MOGRIFIER_TAG_PATTERN=r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$",
        DOG_STATSD_MOGRIFIER_TAG_NAME="ratelimit.service.rate_limit.$3",
        DOG_STATSD_MOGRIFIER_TAG_TAGS="domain:$1,descriptor:$2",
        DOG_STATSD_MOGRIFIER_SECOND_PATTERN="^x$",
        DOG_STATSD_MOGRIFIER_SECOND_NAME="y",
    )
    assert s.stats.dog_statsd_mogrifier_names == ("tag", "second")
    first, second = s.stats.dog_statsd_mogrifiers
    assert first == DogStatsdMogrifier(
        name="TAG",
        pattern=r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$",
        metric_name="ratelimit.service.rate_limit.$3",
        tags=(("domain", "$1"), ("descriptor", "$2")),
    )
    assert first.regex.match("ratelimit.service.rate_limit.d.k.total_hits") is not None
    assert second == DogStatsdMogrifier("SECOND", "^x$", "y", ())


def test_mogrifiers_ignored_without_the_dogstatsd_sink() -> None:
    assert load(USE_DOG_STATSD_MOGRIFIERS="A").stats.dog_statsd_mogrifiers == ()


@pytest.mark.parametrize(
    ("extra", "start"),
    [
        ({}, "DOG_STATSD_MOGRIFIER_A_PATTERN: invalid value ''"),
        ({"DOG_STATSD_MOGRIFIER_A_PATTERN": "("},
         "DOG_STATSD_MOGRIFIER_A_PATTERN: invalid value '('"),
        ({"DOG_STATSD_MOGRIFIER_A_PATTERN": "x"}, "DOG_STATSD_MOGRIFIER_A_NAME: invalid value ''"),
        (
            {"DOG_STATSD_MOGRIFIER_A_PATTERN": "x", "DOG_STATSD_MOGRIFIER_A_NAME": "n",
             "DOG_STATSD_MOGRIFIER_A_TAGS": ":5"},
            "DOG_STATSD_MOGRIFIER_A_TAGS: invalid value ':5'",
        ),
        (
            {"DOG_STATSD_MOGRIFIER_A_PATTERN": "x", "DOG_STATSD_MOGRIFIER_A_NAME": "n",
             "DOG_STATSD_MOGRIFIER_A_TAGS": "domain:$1,descriptor:"},
            "DOG_STATSD_MOGRIFIER_A_TAGS: invalid value 'domain:$1,descriptor:'",
        ),
    ],
)  # fmt: skip
def test_invalid_mogrifiers(extra: dict[str, str], start: str) -> None:
    env = {"USE_STATSD": "false", "USE_DOG_STATSD": "true", "USE_DOG_STATSD_MOGRIFIERS": "a"}
    assert error(**env, **extra).startswith(start)


# --- reload-time overrides ------------------------------------------------------------------


def test_reload_options_from_env() -> None:
    options = reload_options_from_env(
        {
            "SHADOW_MODE": "true",
            "QUOTA_MODE": "1",
            "RESPONSE_DYNAMIC_METADATA": "T",
            "LIMIT_RESPONSE_HEADERS_ENABLED": "True",
            "LIMIT_LIMIT_HEADER": "X-Limit",
            "LIMIT_REMAINING_HEADER": "X-Remaining",
            "LIMIT_RESET_HEADER": "X-Reset",
            "MERGE_DOMAIN_CONFIG": "TRUE",
            "PORT": "not-read-here",
        }
    )
    assert options == ReloadOptions(
        shadow_mode=True,
        quota_mode=True,
        response_dynamic_metadata=True,
        response_headers=True,
        limit_header="X-Limit",
        remaining_header="X-Remaining",
        reset_header="X-Reset",
        merge_domain_config=True,
    )
    assert reload_options_from_env({}) == ReloadOptions()


def test_reload_options_default_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHADOW_MODE", "true")
    assert reload_options_from_env().shadow_mode is True


def test_reload_options_reject_bad_values() -> None:
    with pytest.raises(SettingsError, match=r"^QUOTA_MODE: invalid value 'maybe'"):
        reload_options_from_env({"QUOTA_MODE": "maybe"})


def test_start_up_reload_options_are_the_ones_re_read_on_reload() -> None:
    # One type: the settings built at start-up hold exactly what a reload re-reads.
    env = {"PORT": "9999", "SHADOW_MODE": "true", "LIMIT_RESET_HEADER": "X-Reset"}
    base = load_settings(env)
    assert base.reload == reload_options_from_env(env)
    assert (base.reload.shadow_mode, base.reload.reset_header) == (True, "X-Reset")
    assert base.listeners.port == 9999


def test_ietf_headers_need_the_response_headers_on() -> None:
    with pytest.raises(SettingsError) as info:
        load(LIMIT_RESPONSE_HEADERS_FORMAT="ietf")
    assert str(info.value) == (
        "LIMIT_RESPONSE_HEADERS_FORMAT: 'ietf' formats the response headers, which are off: "
        "set LIMIT_RESPONSE_HEADERS_ENABLED=true too"
    )
    assert (
        load(
            LIMIT_RESPONSE_HEADERS_FORMAT="IETF", LIMIT_RESPONSE_HEADERS_ENABLED="true"
        ).reload.headers_format
        == "ietf"
    )
    with pytest.raises(SettingsError, match=r"^LIMIT_RESPONSE_HEADERS_FORMAT: invalid value 'rfc'"):
        load(LIMIT_RESPONSE_HEADERS_FORMAT="rfc", LIMIT_RESPONSE_HEADERS_ENABLED="true")


def test_limit_names_need_dynamic_metadata() -> None:
    with pytest.raises(
        SettingsError, match=r"^RESPONSE_DYNAMIC_METADATA_LIMIT_NAME: has no effect"
    ):
        load_settings({"RESPONSE_DYNAMIC_METADATA_LIMIT_NAME": "true"})
    env = {"RESPONSE_DYNAMIC_METADATA_LIMIT_NAME": "true", "RESPONSE_DYNAMIC_METADATA": "true"}
    assert load_settings(env).reload.dynamic_metadata_limit_name
