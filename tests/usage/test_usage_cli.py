"""`python -m sidecars.usage accounts|tokens ...` on a real SQLite file and Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, free_port
from support.redis_server import RedisServer
from support.sidecar import Gunicorn

from sidecars.usage.cli import main
from sidecars.usage.settings import USAGE_PATH
from sidecars.usage.store import token_hash

from .usage_helpers import session_sqlite_path, unique


@pytest.fixture
def cli(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, capsys):  # type: ignore[no-untyped-def]
    """Run the CLI in process: (exit status, parsed JSON stdout or None, stderr)."""
    monkeypatch.setenv("USAGE_REDIS_URL", redis_server.url)
    monkeypatch.setenv("USAGE_SQLITE_PATH", session_sqlite_path())

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
    # The argparse default bug: `--plan` alone used to fail parsing the default `--end`.
    status, alone, err = cli("accounts", "update", acct, "--plan", "free")
    assert status == 0, err
    assert alone["plan"] == "free" and alone["subscriptionPeriod"]["end"] is None
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
    # Only the hash is stored: the raw token is nowhere in the database file or Redis.
    db = Path(session_sqlite_path())
    stored = b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))
    assert token_hash(token).encode() in stored and token.encode() not in stored
    for key in redis_server.client().keys("*"):
        if redis_server.client().type(key) == b"string":
            assert token.encode() not in redis_server.client().get(key)
    _, listed, _ = cli("tokens", "list", acct)
    assert [t["id"] for t in listed] == [issued["id"]]
    assert listed[0]["sha256"] == token_hash(token) and listed[0]["revoked"] is None
    assert listed[0]["expires"] is None and listed[0]["lastUsed"] is None
    status, revoked, _ = cli("tokens", "revoke", acct, issued["id"])
    assert status == 0 and revoked["revoked"].endswith("Z")
    assert cli("tokens", "list", acct)[1][0]["revoked"] == revoked["revoked"]
    assert cli("tokens", "revoke", acct, "tok_nope")[0] == 1
    assert cli("tokens", "issue", unique())[0] == 1


def test_cli_reports_redis_down_and_bad_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("USAGE_SQLITE_PATH", session_sqlite_path())
    acct = unique()
    monkeypatch.setenv("USAGE_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    # The account is created (database), its usage cannot be read (Redis).
    assert main(["accounts", "create", acct, "--plan", "free"]) == 1
    assert "unavailable: redis" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["accounts", "create", "x", "--plan", "gold"])
    assert exc.value.code == 2


def test_module_entry_point(redis_server: RedisServer) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "USAGE_REDIS_URL": redis_server.url,
        "USAGE_SQLITE_PATH": session_sqlite_path(),
    }
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


def test_accounts_list_suspend_resume_delete(cli, capsys) -> None:  # type: ignore[no-untyped-def]
    a, b = sorted([unique(), unique()])
    cli("accounts", "create", a, "--plan", "free")
    cli("accounts", "create", b, "--plan", "pro", "--end", "2099-01-01")
    status, listed, _ = cli("accounts", "list")
    assert status == 0
    ids = [x["id"] for x in listed]
    assert a in ids and b in ids and ids == sorted(ids)
    status, _, _ = cli("accounts", "suspend", a)
    assert status == 0
    assert cli("accounts", "show", a)[1]["suspended"].endswith("Z")
    assert main(["accounts", "list", "--format", "table"]) == 0
    text = capsys.readouterr().out
    header, *rows = text.splitlines()
    assert header.split() == [
        "id",
        "plan",
        "planLimit",
        "window",
        "subscriptionPeriod",
        "suspended",
    ]
    row_b = next(r for r in rows if r.startswith(b + " "))
    assert row_b.split()[1:5] == ["pro", "1000000", "billing_cycle", row_b.split()[4]]
    assert row_b.split()[4].endswith("..2099-01-01") and row_b.split()[5] == "-"
    assert cli("accounts", "resume", a)[1]["suspended"] is None
    cli("tokens", "issue", b)
    with pytest.raises(SystemExit) as exc:  # --yes is required
        main(["accounts", "delete", b])
    assert exc.value.code == 2
    status, deleted, _ = cli("accounts", "delete", b, "--yes")
    assert status == 0 and deleted == {"id": b, "deleted": True}
    assert cli("accounts", "show", b)[0] == 1
    assert cli("tokens", "list", b)[0] == 1
    assert cli("accounts", "delete", b, "--yes")[0] == 1


def test_tokens_expiry_and_table(cli, capsys) -> None:  # type: ignore[no-untyped-def]
    acct = unique()
    cli("accounts", "create", acct, "--plan", "free")
    status, issued, _ = cli("tokens", "issue", acct, "--expires", "2099-12-31")
    assert status == 0 and issued["expires"] == "2099-12-31T00:00:00Z"
    status, issued2, _ = cli("tokens", "issue", acct, "--expires", "90d", "--label", "ci")
    assert status == 0 and issued2["expires"] > issued2["created"]
    _, dt, _ = cli("tokens", "issue", acct, "--expires", "2099-06-01T12:00:00+02:00")
    assert dt["expires"] == "2099-06-01T10:00:00Z"
    status, _, err = cli("tokens", "issue", acct, "--expires", "2001-01-01")
    assert status == 1 and "future" in err
    with pytest.raises(SystemExit) as exc:
        main(["tokens", "issue", acct, "--expires", "soon"])
    assert exc.value.code == 2 and "duration" in capsys.readouterr().err
    assert main(["tokens", "list", acct, "--format", "table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "label", "created", "lastUsed", "expires", "revoked"]
    assert len(lines) == 4 and any("2099-12-31T00:00:00Z" in line for line in lines)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["serve"],
        ["accounts"],
        *(["accounts", a] for a in ("create", "update", "show", "list", "suspend", "resume")),
        ["accounts", "delete"],
        ["tokens"],
        *(["tokens", a] for a in ("issue", "list", "revoke")),
        ["usage"],
        *(["usage", a] for a in ("rollup", "show", "export")),
        ["webhooks"],
        *(["webhooks", a] for a in ("list", "show", "resend")),
    ],
)
def test_help_on_every_command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m sidecars.usage")


def test_cli_options_are_the_server_settings(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No USAGE_* in the environment: the options alone reach the database and Redis.
    for name in ("USAGE_REDIS_URL", "USAGE_SQLITE_PATH", "USAGE_POSTGRES_DSN"):
        monkeypatch.delenv(name, raising=False)
    db = tmp_path / "opt.sqlite3"
    common = ["--redis-url", redis_server.address, "--sqlite-path", str(db)]
    assert main([*common, "accounts", "create", "serve", "--plan", "free"]) == 0
    assert db.exists()
    assert main([*common, "accounts", "show", "serve"]) == 0
    assert main(["--sqlite-path", str(db), "--postgres-dsn", "x", "accounts", "list"]) == 2
    assert main(["--postgres-dsn", "x", "accounts", "list"]) == 2  # not a DSN


def test_serve_hands_the_options_to_the_workers(
    redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Only the command line names the database and Redis: the workers get them from the
    # environment that settings builds for gunicorn.
    for name in ("USAGE_REDIS_URL", "USAGE_SQLITE_PATH", "USAGE_POSTGRES_DSN"):
        monkeypatch.delenv(name, raising=False)
    options = ["--redis-url", redis_server.address, "--sqlite-path", str(tmp_path / "o.db")]
    assert main([*options, "accounts", "create", "opt", "--plan", "pro"]) == 0
    capsys.readouterr()
    assert main([*options, "tokens", "issue", "opt"]) == 0
    token = json.loads(capsys.readouterr().out)["token"]
    argv = [sys.executable, "-m", "sidecars.usage", *options, "serve"]
    env = {"USAGE_PORT": "0", "USAGE_WORKERS": "1", "USAGE_RATELIMIT_ADDRESS": ""}
    server = Gunicorn(argv, env, tmp_path / "gunicorn.log", workers=1)
    try:
        server.wait_ready(60)
        server.wait_steady(lambda: server.get("/health").status_code == 200, "health", times=1)
        answer = server.get(USAGE_PATH, headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200 and answer.json()["planName"] == "pro"
    finally:
        server.terminate()


def test_report_errors_are_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    acct = unique()
    cli("accounts", "create", acct, "--plan", "free")
    status, out, err = cli("usage", "show", acct, "--to", "0001-01-05")
    assert (status, out) == (1, None)
    assert err.startswith("error: ") and "give the first day too" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    missing = tmp_path / "missing-dir" / "x.csv"
    args = ("--from", "2026-01-01", "--to", "2026-01-02", "--output", str(missing))
    status, out, err = cli("usage", "export", *args)
    assert (status, out) == (1, None)
    assert err == f"error: cannot write {missing}: No such file or directory\n"
    assert not missing.parent.exists()


def test_deleted_account_ids_are_never_reused(cli) -> None:  # type: ignore[no-untyped-def]
    acct = unique()
    cli("accounts", "create", acct, "--plan", "free")
    assert cli("accounts", "delete", acct, "--yes")[0] == 0
    status, out, err = cli("accounts", "create", acct, "--plan", "pro")
    assert (status, out) == (1, None)
    assert "ids are never reused" in err
    assert cli("accounts", "show", acct)[0] == 1


def test_serve_refuses_a_bad_meters_file_in_one_line(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "meters.yaml"
    bad.write_text("meters: [{slug: t, eventType: x, aggregation: avg}]\n")
    env = {"USAGE_REDIS_URL": redis_server.url, "USAGE_METERS_FILE": str(bad)}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "aggregation must be one of" in err
    assert err.count("\n") == 1
