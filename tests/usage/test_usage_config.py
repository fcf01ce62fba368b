"""Plans file and USAGE_* settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.core import memory_decider

from ratelimitd.backends import Op
from ratelimitd.keys import meter_key
from ratelimitd.messages import OK, Descriptor
from sidecars.usage.plans import DEFAULTS, PlanError, load_plans, parse_plans
from sidecars.usage.settings import USAGE_PATH, Settings, SettingsError


def test_shipped_plans_are_the_defaults() -> None:
    assert load_plans() == DEFAULTS
    assert set(DEFAULTS) == {"free", "startup", "pro"}


def test_a_plans_file_overrides_what_it_names() -> None:
    plans = parse_plans("plans:\n  free: {limit: 5}\n  pro: {window: rolling_30_days}\n")
    assert plans["free"].limit == 5 and plans["free"].window == "rolling_30_days"
    assert plans["pro"].limit == DEFAULTS["pro"].limit and plans["pro"].window == "rolling_30_days"
    assert plans["startup"] == DEFAULTS["startup"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("plans:\n  gold: {limit: 1}\n", "unknown plan 'gold'"),
        ("plans:\n  free: {limit: -1}\n", "non-negative integer"),
        ("plans:\n  free: {limit: true}\n", "non-negative integer"),
        ("plans:\n  free: {window: weekly}\n", "window must be one of"),
        ("plans:\n  free: {limit: 1, price: 3}\n", "takes only"),
        ("plans: [free]\n", "expected a mapping"),
        ("plans: {free: [\n", "not YAML"),
    ],
)
def test_bad_plans_files_are_refused(text: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_plans(text)


def test_missing_plans_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlanError, match="cannot read"):
        load_plans(tmp_path / "nope.yaml")


def test_settings_defaults_and_parsing() -> None:
    assert Settings.from_env({}) == Settings()
    s = Settings.from_env(
        {
            "USAGE_REDIS_URL": "10.0.0.1:6380",
            "USAGE_BASE_PATH": "/usage/",
            "USAGE_RATELIMIT_FAILURE_MODE": "DENY",
            "USAGE_EXEMPT_PATHS": "/health, /x",
            "USAGE_RATELIMIT_ADDRESS": "",
        }
    )
    assert s.redis_url == "redis://10.0.0.1:6380"
    assert s.usage_path == "/usage" + USAGE_PATH
    assert s.quota_exempt_paths == ("/usage" + USAGE_PATH,)
    assert s.ratelimit_failure_mode == "deny"
    assert s.exempt_paths == ("/health", "/x")
    assert s.ratelimit_address == ""
    assert Settings.from_env({"USAGE_RATE_LIMIT": "false"}).rate_limit is False
    assert Settings.from_env({"USAGE_QUOTA_EXEMPT_PATHS": ""}).quota_exempt_paths == ()


@pytest.mark.parametrize(
    "env",
    [
        {"USAGE_PORT": "x"},
        {"USAGE_WORKERS": "0"},
        {"USAGE_RATELIMIT_FAILURE_MODE": "maybe"},
        {"USAGE_BASE_PATH": "usage"},
        {"USAGE_REDIS_TIMEOUT_SECONDS": "0"},
        {"USAGE_RATE_LIMIT": "sometimes"},
    ],
)
def test_bad_settings(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        Settings.from_env(env)


async def test_shipped_ratelimit_config_limits_rates_and_does_not_meter() -> None:
    """The example config loads in ratelimitd, limits the middleware's descriptors and writes
    nothing into the day buckets the sidecar counts usage in (no double count)."""
    path = Path(__file__).resolve().parents[2] / "sidecars" / "usage" / "ratelimit-config.yaml"
    now = 1_763_800_000.0
    core = memory_decider(path, now=now)
    backend = core.backend
    descriptors = [
        Descriptor((("account", "acme"),)),
        Descriptor((("plan", "startup"), ("account", "acme"))),
    ]
    for _ in range(3):
        resp = await core.decide("api", *descriptors, hits_addend=1)
        assert resp.overall_code == OK
        assert [s.rule.requests_per_unit for s in resp.statuses] == [100, 20]
    key = meter_key("", "api", [("account", "acme")], int(now))
    assert key == "meter_api_account_acme_1763769600"
    assert await backend.get([Op(key, 0, 86400)]) == [0]
