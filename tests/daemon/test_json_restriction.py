"""HTTP_JSON_ENABLED / HTTP_JSON_DOMAINS (extension): `/json` off, or limited to some domains,
so a metering domain can be reachable only over gRPC on loopback or a unix socket. Unset,
`/json` serves every domain as the reference does."""

from __future__ import annotations

import pytest
from support.daemon import write_config

from ratelimitd.backends import load_settings
from ratelimitd.settings import SettingsError

RULE = "descriptors:\n  - key: {key}\n    rate_limit: {{unit: day, requests_per_unit: 2}}\n"
CONFIGS = {
    "api.yaml": "domain: api\n" + RULE.format(key="account"),
    "web.yaml": "domain: web\n" + RULE.format(key="ip"),
}


def started(daemon_env, start_daemon, **env: str):
    """A daemon serving both domains with `env` set."""
    for name, text in CONFIGS.items():
        write_config(daemon_env, name, text)
    return start_daemon(dict(daemon_env, **env))


def test_json_off_answers_404_and_grpc_still_counts(daemon_env, start_daemon) -> None:
    d = started(daemon_env, start_daemon, HTTP_JSON_ENABLED="false")
    for _ in range(3):
        assert d.decide_json("api", {"account": "a"}) == (404, b"404 page not found\n")
    assert d.http("/healthcheck") == (200, b"OK")
    # The outside caller moved nothing: gRPC still sees the whole quota.
    assert [d.decide("api", [("account", "a")]).overall_code for _ in range(3)] == [1, 1, 2]


def test_json_domains_refuses_other_domains_before_counting(daemon_env, start_daemon) -> None:
    d = started(daemon_env, start_daemon, HTTP_JSON_DOMAINS="web")
    for _ in range(3):
        assert d.decide_json("api", {"account": "a"}) == (403, b"domain not served on /json\n")
    assert [d.decide_json("web", {"ip": "1"})[0] for _ in range(3)] == [200, 200, 429]
    assert [d.decide("api", [("account", "a")]).overall_code for _ in range(3)] == [1, 1, 2]


def test_defaults_serve_every_domain() -> None:
    listeners = load_settings({}).listeners
    assert (listeners.json_enabled, listeners.json_domains) == (True, ())
    listeners = load_settings({"HTTP_JSON_DOMAINS": " a, b ,"}).listeners
    assert listeners.json_domains == ("a", "b")


def test_domains_with_json_off_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"^HTTP_JSON_DOMAINS: has no effect"):
        load_settings({"HTTP_JSON_ENABLED": "false", "HTTP_JSON_DOMAINS": "a"})
