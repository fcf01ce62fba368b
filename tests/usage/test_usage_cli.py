"""`python -m sidecars.usage accounts|tokens ...` on a real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import REPO, free_port
from support.redis_server import RedisServer

from sidecars.usage.cli import main
from sidecars.usage.store import token_hash

from .usage_helpers import unique


@pytest.fixture
def cli(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, capsys):  # type: ignore[no-untyped-def]
    """Run the CLI in process: (exit status, parsed JSON stdout or None, stderr)."""
    monkeypatch.setenv("USAGE_REDIS_URL", redis_server.url)

    def run(*argv: str) -> tuple[int, object, str]:
        status = main(list(argv))
        out, err = capsys.readouterr()
        return status, json.loads(out) if out.strip() else None, err

    return run


def test_accounts_create_update_show(cli) -> None:  # type: ignore[no-untyped-def]
    acct = unique()
    status, shown, _ = cli("accounts", "create", acct, "--plan", "startup", "--start", "2026-01-31")
    assert status == 0
    assert shown["plan"] == "startup" and shown["window"] == "billing_cycle"
    assert shown["windowIsPlanDefault"] is True
    assert shown["subscriptionPeriod"] == {"start": "2026-01-31", "end": None}
    assert shown["currentUsage"] == 0
    status, _, err = cli("accounts", "create", acct, "--plan", "free")
    assert status == 1 and "exists" in err
    status, shown, _ = cli(
        "accounts",
        "update",
        acct,
        "--plan",
        "free",
        "--window",
        "billing_cycle",
        "--end",
        "2027-01-31",
    )
    assert (shown["plan"], shown["window"], shown["windowIsPlanDefault"]) == (
        "free",
        "billing_cycle",
        False,
    )
    assert shown["subscriptionPeriod"]["end"] == "2027-01-31"
    _, shown, _ = cli("accounts", "update", acct, "--window", "default", "--end", "none")
    assert shown["window"] == "rolling_30_days" and shown["subscriptionPeriod"]["end"] is None
    status, shown2, _ = cli("accounts", "show", acct)
    assert status == 0 and shown2 == shown
    assert cli("accounts", "show", unique())[0] == 1
    assert cli("accounts", "update", acct, "--start", "2030-01-01", "--end", "2029-01-01")[0] == 1
    assert cli("accounts", "create", "bad:id", "--plan", "free")[0] == 1


def test_tokens_issue_list_revoke(cli, redis_server: RedisServer) -> None:  # type: ignore[no-untyped-def]
    acct = unique()
    cli("accounts", "create", acct, "--plan", "pro")
    status, issued, _ = cli("tokens", "issue", acct, "--label", "ci")
    assert status == 0 and issued["token"].startswith("usk_") and issued["label"] == "ci"
    token = issued["token"]
    # Only the hash is stored, nowhere the raw token.
    raw_keys = redis_server.client().keys("usage:*")
    assert f"usage:token:{token_hash(token)}".encode() in raw_keys
    for key in raw_keys:
        kind = redis_server.client().type(key)
        dump = (
            redis_server.client().hgetall(key)
            if kind == b"hash"
            else redis_server.client().get(key)
        )
        assert token.encode() not in repr(dump).encode()
    _, listed, _ = cli("tokens", "list", acct)
    assert [t["id"] for t in listed] == [issued["id"]]
    assert listed[0]["sha256"] == token_hash(token) and "revoked" not in listed[0]
    status, revoked, _ = cli("tokens", "revoke", acct, issued["id"])
    assert status == 0 and revoked["revoked"] > 0
    assert not redis_server.client().exists(f"usage:token:{token_hash(token)}")
    assert cli("tokens", "list", acct)[1][0]["revoked"] == revoked["revoked"]
    assert cli("tokens", "revoke", acct, "tok_nope")[0] == 1
    assert cli("tokens", "issue", unique())[0] == 1


def test_cli_reports_redis_down_and_bad_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("USAGE_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    assert main(["accounts", "show", "x"]) == 1
    assert "Redis unavailable" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["accounts", "create", "x", "--plan", "gold"])
    assert exc.value.code == 2


def test_module_entry_point(redis_server: RedisServer) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "USAGE_REDIS_URL": redis_server.url}
    acct = unique()
    out = subprocess.run(
        [sys.executable, "-m", "sidecars.usage", "accounts", "create", acct, "--plan", "free"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(out.stdout)["id"] == acct
