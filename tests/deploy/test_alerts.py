"""deploy/prometheus: the alert rules pass `promtool check rules`, and `promtool test rules`
shows each alert firing on the series that should fire it and silent on healthy ones. (That
they use only names the daemon exports: test_dashboard.py, on a real daemon's scrape.)"""

from __future__ import annotations

import yaml
from support.manifests import ALERT_TESTS, ALERTS, run, tool

# What the alerts watch: refused configs, an open breaker, Redis errors, an over-limit
# spike, the p99 latency, restarts.
EXPECTED = {
    "RatelimitdConfigLoadError",
    "RatelimitdRedisBreakerOpen",
    "RatelimitdRedisErrors",
    "RatelimitdOverLimitSpike",
    "RatelimitdHighLatency",
    "RatelimitdRestarting",
}


def alerts() -> list[dict]:
    return [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]


def test_rules_check() -> None:
    done = run(tool("promtool"), "check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(EXPECTED)} rules found" in done.stdout


def test_rules_unit_tests_pass() -> None:
    done = run(tool("promtool"), "test", "rules", str(ALERT_TESTS), cwd=ALERT_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_tested_firing_and_silent() -> None:
    assert {rule["alert"] for rule in alerts()} == EXPECTED
    cases: dict[str, list[bool]] = {}
    for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    assert set(cases) == EXPECTED
    for name, fired in cases.items():
        assert True in fired and False in fired, name
    for rule in alerts():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
