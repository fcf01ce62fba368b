"""Admin endpoints on the debug listener: off unless ADMIN_TOKEN is set,
bearer auth, counters read and reset (audited), `/explain` as a dry run, on the memory
backend and a real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from support.daemon import write_config

CONFIG = """\
domain: api
descriptors:
  - key: account
    rate_limit: {unit: minute, requests_per_unit: 3}
    descriptors:
      - key: path
        value: "/v1/*"
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: plan
    value: free
    rate_limit: {name: free_plan, unit: day, requests_per_unit: 1000}
  - key: ip
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 5}
      - {name: steady, unit: hour, requests_per_unit: 500}
  - key: vip
    rate_limit: {unlimited: true}
  - key: new
    rate_limit: {name: new_rule, replaces: [{name: free_plan}], unit: day, requests_per_unit: 9}
"""
TOKEN = "s3cret-admin-token"


def call(d, method: str, path: str, body: object = None, token: str | None = TOKEN):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{d.debug_port}{path}", data, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        raw = err.read()
        return err.code, json.loads(raw) if raw.startswith(b"{") else raw


@pytest.fixture(params=["memory", "redis"])
def admin_daemon(request, daemon_env, start_daemon, redis_servers):
    env = dict(daemon_env, ADMIN_TOKEN=TOKEN)
    if request.param == "redis":
        server = redis_servers()
        env.update(BACKEND_TYPE="redis", REDIS_SOCKET_TYPE="tcp", REDIS_URL=server.address)
    else:
        env.update(BACKEND_TYPE="memory")
    write_config(env, "api.yaml", CONFIG)
    return start_daemon(env)


def test_off_without_a_token(daemon_env, start_daemon) -> None:
    write_config(daemon_env, "api.yaml", CONFIG)
    d = start_daemon(dict(daemon_env, BACKEND_TYPE="memory"))
    for method, path in (("GET", "/counters?domain=api&entry=account=a"), ("POST", "/explain")):
        status, body = call(d, method, path, {} if method == "POST" else None)
        assert (status, body) == (404, b"404 page not found\n")
    assert b"/counters" not in d.debug("/")[1]


def test_needs_the_bearer_token(admin_daemon) -> None:
    for token in (None, "wrong", TOKEN + "x"):
        status, _ = call(admin_daemon, "GET", "/counters?domain=api&entry=account=a", token=token)
        assert status == 401, token
    assert b"/counters" in admin_daemon.debug("/")[1]


def test_get_shows_rule_keys_and_windows_then_delete_resets(admin_daemon, caplog) -> None:
    d = admin_daemon
    for _ in range(4):
        d.decide("api", [("account", "acme")])
    status, shown = call(d, "GET", "/counters?domain=api&entry=account=acme")
    assert status == 200
    assert shown["rule"] == {"key": "api.account", "requests_per_unit": 3, "unit": "MINUTE"}
    assert shown["stats_key"] == "api.account"
    (window,) = shown["windows"]
    assert window["cache_key"].startswith("api_account_acme_")
    assert (window["value"], window["limit"], window["remaining"]) == (4, 3, 0)
    assert 0 < window["reset_seconds"] <= 60
    assert shown["decision"] == "OVER_LIMIT"  # what one more hit would get
    assert d.decide("api", [("account", "acme")]).overall_code == 2
    before = d.stats()
    status, reset = call(d, "DELETE", "/counters?domain=api&entry=account=acme")
    assert (status, reset["reset"], reset["existed"]) == (200, [window["cache_key"]], 1)
    assert d.decide("api", [("account", "acme")]).overall_code == 1
    assert call(d, "GET", "/counters?domain=api&entry=account=acme")[1]["windows"][0]["value"] == 1
    # Reading counted nothing: only the decide above moved total_hits.
    after = d.stats()
    assert after["ratelimit.service.rate_limit.api.account.total_hits"] == (
        before["ratelimit.service.rate_limit.api.account.total_hits"] + 1
    )
    log = d.log_path.read_text()
    assert "admin reset: domain=api descriptor=account=acme" in log
    assert "by=127.0.0.1:" in log


def test_several_limits_reset_every_window(admin_daemon) -> None:
    d = admin_daemon
    # The burst window is one second: the six calls and the read must fall in one second of
    # the daemon's clock, so a run that straddles a boundary is tried again on a fresh key.
    for attempt in range(5):
        ip = f"1.2.3.{attempt}"
        time.sleep(1 - time.time() % 1 + 0.01)
        second = int(time.time())
        for _ in range(6):
            d.decide("api", [("ip", ip)])
        _, shown = call(d, "GET", f"/counters?domain=api&entry=ip={ip}")
        if int(time.time()) == second:
            break
    assert [(w["limit"], w["value"]) for w in shown["windows"]] == [(5, 6), (500, 6)]
    _, reset = call(d, "DELETE", f"/counters?domain=api&entry=ip={ip}")
    assert len(reset["reset"]) == 2 and reset["existed"] == 2
    _, shown = call(d, "GET", f"/counters?domain=api&entry=ip={ip}")
    assert [w["value"] for w in shown["windows"]] == [0, 0]


def test_explain_is_a_dry_run(admin_daemon) -> None:
    d = admin_daemon
    request = {
        "domain": "api",
        "hitsAddend": 2,
        "descriptors": [
            {"entries": [{"key": "account", "value": "acme"}, {"key": "path", "value": "/v1/x"}]},
            {"entries": [{"key": "account", "value": "acme"}, {"key": "method", "value": "GET"}]},
            {"entries": [{"key": "plan", "value": "free"}]},
            {"entries": [{"key": "new", "value": "x"}]},
            {"entries": [{"key": "vip", "value": "y"}]},
            {"entries": [{"key": "nope", "value": "z"}]},
            {
                "entries": [{"key": "k", "value": "v"}],
                "limit": {"requests_per_unit": 1, "unit": "SECOND"},
            },
        ],
    }
    before = d.stats()
    status, out = call(d, "POST", "/explain", request)
    assert status == 200 and out["dry_run"] is True
    wildcard, too_deep, plan, new, vip, nope, override = out["descriptors"]
    assert wildcard["matched"] == "rule"
    assert [s["matched"] for s in wildcard["path"]] == ["key_only", "wildcard"]
    assert wildcard["why"] == "matched at depth 2: key_only, wildcard"
    assert wildcard["stats_key"] == "api.account.path_/v1/*"
    assert wildcard["windows"][0]["value"] == 0 and wildcard["hits"] == 2
    assert too_deep["matched"] is None and "no config entry matches method=GET" in too_deep["why"]
    assert plan["replaced_by"] == "new_rule" and plan["decision"] == "OK"
    assert new["rule"]["name"] == "new_rule"
    assert vip["rule"]["unlimited"] is True and vip["windows"] == []
    assert nope["matched"] is None and nope["why"].startswith("no config entry matches nope=z")
    assert override["matched"] == "override"
    assert override["decision"] == "OVER_LIMIT"  # 2 hits on a limit of 1
    assert out["overall_code"] == "OVER_LIMIT"
    after = d.stats()
    hits = [k for k in after if k.endswith("total_hits")]
    assert {k: after[k] for k in hits} == {k: before.get(k, 0) for k in hits}
    # ... and nothing was counted: a real decision starts from zero.
    assert (
        d.decide("api", [("account", "acme"), ("path", "/v1/x")]).statuses[0].limit_remaining == 99
    )


def test_bad_requests_are_400_with_a_message(admin_daemon) -> None:
    d = admin_daemon
    assert call(d, "GET", "/counters?entry=account=a")[0] == 400
    status, body = call(d, "GET", "/counters?domain=api&entry=account")
    assert (status, body["error"]) == (400, "entry='account': expected entry=KEY=VALUE")
    assert call(d, "GET", "/counters?domain=api&entry=a=b&x=1")[1]["error"].startswith("unknown")
    status, body = call(d, "GET", "/counters?domain=api&entry=nope=1")
    assert status == 404 and "no config entry matches nope=1" in body["error"]
    assert call(d, "POST", "/explain", {"domain": "api"})[0] == 400
    many = {"domain": "api", "descriptors": [{"entries": [{"key": "a", "value": "b"}]}] * 1025}
    status, body = call(d, "POST", "/explain", many)
    assert (status, body["error"]) == (
        400,
        "1025 descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST=1024)",
    )
    assert call(d, "PUT", "/counters?domain=api&entry=a=b")[0] == 405
    assert call(d, "GET", "/explain")[0] == 405


def cli(d, *args: str, token: str = TOKEN, stdin: str | None = None):
    env = dict(d.env, ADMIN_TOKEN=token)
    return subprocess.run(
        [sys.executable, "-m", "ratelimitd", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_cli_counters_get_reset_and_explain(admin_daemon, tmp_path) -> None:
    d = admin_daemon
    for _ in range(4):
        d.decide("api", [("account", "acme")])
    got = cli(d, "counters", "get", "api", "account=acme")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["windows"][0]["value"] == 4
    reset = cli(d, "counters", "reset", "api", "account=acme")
    assert reset.returncode == 0 and json.loads(reset.stdout)["existed"] == 1
    assert (
        json.loads(cli(d, "counters", "get", "api", "account=acme").stdout)["windows"][0]["value"]
        == 0
    )
    explained = cli(d, "explain", "api", "account=acme,path=/v1/a", "plan=free", "--hits", "3")
    out = json.loads(explained.stdout)
    assert [x["matched"] for x in out["descriptors"]] == ["rule", "rule"]
    assert out["descriptors"][0]["hits"] == 3
    request = tmp_path / "r.json"
    request.write_text(
        json.dumps({"domain": "api", "descriptors": [{"entries": [{"key": "vip", "value": "1"}]}]})
    )
    assert json.loads(cli(d, "explain", "--file", str(request)).stdout)["overall_code"] == "OK"
    assert json.loads(cli(d, "explain", "--file", "-", stdin=request.read_text()).stdout)["dry_run"]


def test_cli_errors(admin_daemon) -> None:
    d = admin_daemon
    wrong = cli(d, "counters", "get", "api", "account=acme", token="nope")
    assert (wrong.returncode, wrong.stderr) == (
        1,
        "ratelimitd: 401: this endpoint needs the admin token\n",
    )
    missing = cli(d, "counters", "get", "api", "nope=1")
    assert missing.returncode == 1 and missing.stderr.startswith("ratelimitd: 404: no config entry")
    assert cli(d, "counters", "get", "api", "account").returncode == 2  # usage
    assert cli(d, "counters", "get", "api", "a=1", token="").returncode == 2
    assert "usage: ratelimitd counters" in cli(d, "counters", "--help").stdout
    assert "usage: ratelimitd explain" in cli(d, "explain", "--help").stdout
