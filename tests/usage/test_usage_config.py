"""Plans file and USAGE_* settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.core import memory_decider

from ratelimitd.backends import Op
from ratelimitd.config.keys import meter_key
from ratelimitd.messages import OK, Descriptor
from sidecars.usage.plans import DEFAULTS, PlanError, load_plans, parse_plans
from sidecars.usage.settings import (
    HISTORY_PATH,
    PAGE_PATH,
    USAGE_PATH,
    Settings,
    SettingsError,
    environment,
)


def test_shipped_plans_are_the_defaults() -> None:
    assert load_plans() == DEFAULTS
    assert set(DEFAULTS) == {"free", "startup", "pro"}


def test_a_plans_file_overrides_what_it_names() -> None:
    plans = parse_plans("plans:\n  free: {limit: 5}\n  pro: {window: rolling_30_days}\n")
    assert plans["free"].limit == 5 and plans["free"].window == "rolling_30_days"
    assert plans["pro"].limit == DEFAULTS["pro"].limit and plans["pro"].window == "rolling_30_days"
    assert plans["startup"] == DEFAULTS["startup"]
    assert plans["free"].thresholds == (80, 100)  # the default
    custom = parse_plans("plans:\n  pro: {thresholds: [100, 50, 50]}\n  free: {thresholds: []}\n")
    assert custom["pro"].thresholds == (50, 100) and custom["free"].thresholds == ()


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
        # Above 100 % would never be crossed: the quota stops counting there.
        ("plans:\n  free: {thresholds: [80, 120]}\n", "from 1 to 100"),
        ("plans:\n  free: {thresholds: 80}\n", "list of percentages"),
        ("plans:\n  free: {thresholds: [1,2,3,4,5,6,7,8,9,10,11]}\n", "at most 10"),
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
    # Reading one's own usage or history never uses the quota up.
    assert s.quota_exempt_paths == tuple(
        "/usage" + p for p in (USAGE_PATH, HISTORY_PATH, PAGE_PATH)
    )
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
        {"USAGE_RETENTION_DAYS": "0"},
        {"USAGE_ROLLUP_INTERVAL_SECONDS": "-1"},
        {"USAGE_IDEMPOTENCY_MAX_KEYS": "0"},
    ],
)
def test_bad_settings(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"USAGE_WEBHOOK_URL": "ftp://x/y", "USAGE_WEBHOOK_SECRET": "s" * 16}, "http"),
        ({"USAGE_WEBHOOK_URL": "http://x/hook"}, "USAGE_WEBHOOK_SECRET must be set"),
        ({"USAGE_WEBHOOK_URL": "http://x/hook", "USAGE_WEBHOOK_SECRET": "short"}, "16"),
        ({"USAGE_WEBHOOK_URL": "http://x/hook", "USAGE_WEBHOOK_SECRET": "s" * 16 + " x"}, "16"),
        # Delivery settings without a receiver would do nothing: refused, not ignored.
        ({"USAGE_WEBHOOK_SECRET": "s" * 16}, "USAGE_WEBHOOK_URL is not"),
        ({"USAGE_WEBHOOK_RETRY_SECONDS": "1"}, "USAGE_WEBHOOK_RETRY_SECONDS is set"),
        # Metering: a guessable ingestion token; events kept shorter than they may be late.
        ({"USAGE_INGEST_TOKEN": "short"}, "USAGE_INGEST_TOKEN must be at least 16"),
        ({"USAGE_EVENT_MAX_AGE_DAYS": "30", "USAGE_RETENTION_DAYS": "30"}, "less than"),
        ({"USAGE_BUDGET_ACCOUNT_KEY": "u"}, "USAGE_BUDGET_STREAM is not"),
    ],
)
def test_webhook_settings_are_checked_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_history_webhook_and_idempotency_settings() -> None:
    d = Settings.from_env({})
    assert (d.retention_days, d.rollup_interval_seconds) == (400, 60.0)
    assert (d.idempotency_window_seconds, d.idempotency_max_keys) == (86400, 10_000)
    assert d.webhook_url == "" and d.webhook_retry_for_seconds == 86400
    s = Settings.from_env(
        {
            "USAGE_RETENTION_DAYS": "30",
            "USAGE_ROLLUP_INTERVAL_SECONDS": "0",
            "USAGE_WEBHOOK_URL": "https://hooks.example/usage",
            "USAGE_WEBHOOK_SECRET": "whsec_0123456789abcdef",
            "USAGE_WEBHOOK_RETRY_SECONDS": "0.5",
            "USAGE_IDEMPOTENCY_WINDOW_SECONDS": "3600",
        }
    )
    assert (s.retention_days, s.rollup_interval_seconds) == (30, 0.0)
    assert s.webhook_url == "https://hooks.example/usage" and s.webhook_retry_seconds == 0.5
    assert s.idempotency_window_seconds == 3600


def test_cli_overrides_are_applied_in_settings_only() -> None:
    base = {"USAGE_SQLITE_PATH": "/tmp/a.sqlite3", "USAGE_REDIS_URL": "h:1", "OTHER": "kept"}
    # A database named on the command line replaces the environment's other one ...
    env = environment({"USAGE_POSTGRES_DSN": "postgresql://u@h/db"}, base)
    assert "USAGE_SQLITE_PATH" not in env and env["OTHER"] == "kept"
    assert Settings.from_env(base, {"USAGE_POSTGRES_DSN": "postgresql://u@h/db"}).postgres_dsn
    # ... both named at once are refused, as the server refuses them.
    with pytest.raises(SettingsError, match="exclusive"):
        Settings.from_env(
            base, {"USAGE_SQLITE_PATH": "/x", "USAGE_POSTGRES_DSN": "postgresql://u@h/db"}
        )
    assert Settings.from_env(base, {"USAGE_REDIS_URL": "h:2"}).redis_url == "redis://h:2"


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
