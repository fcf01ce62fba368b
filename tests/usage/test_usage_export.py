"""`usage export` and `usage show` on SQLite and PostgreSQL: the history endpoint's figures,
streamed page by page, a progress bar only on a terminal, and the chart."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import pty
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support import REPO, Clock
from support.redis_server import RedisServer

from sidecars.usage.cli import main
from sidecars.usage.db.daily import DailyTable
from sidecars.usage.reports import export
from sidecars.usage.rollup import Rollup
from sidecars.usage.settings import HISTORY_PATH, Settings
from sidecars.usage.windows import DAY

from .test_usage_rollup import NOW, day, seed
from .usage_helpers import account_with_token, bearer, serving


def settings_env(settings: Settings) -> dict[str, str]:
    """The USAGE_* variables naming the settings' Redis and database."""
    env = {"USAGE_REDIS_URL": settings.redis_url}
    if settings.postgres_dsn:
        env["USAGE_POSTGRES_DSN"] = settings.postgres_dsn
    else:
        env["USAGE_SQLITE_PATH"] = settings.sqlite_path
    return env


@pytest.fixture
def operator(
    db_settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., Awaitable[tuple[int, str, str]]]:
    """The CLI in this process (in a thread: it runs its own event loop) on the test's
    database: (status, stdout, stderr)."""
    monkeypatch.delenv("USAGE_SQLITE_PATH", raising=False)
    monkeypatch.delenv("USAGE_POSTGRES_DSN", raising=False)
    for name, value in settings_env(db_settings).items():
        monkeypatch.setenv(name, value)

    async def run(*argv: str) -> tuple[int, str, str]:
        status = await asyncio.to_thread(main, list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    return run


async def test_export_has_the_history_endpoint_figures(
    db_settings: Settings, redis_server: RedisServer, operator: Callable[..., Any]
) -> None:
    clock = Clock(NOW - 5 * DAY)
    async with serving(db_settings, middleware=[], clock=clock) as (client, store):
        accounts = [await account_with_token(store, plan) for plan in ("free", "startup", "pro")]
        clock.now = NOW
        for i, (acct, _) in enumerate(accounts):
            seed(redis_server, store, acct, {-4: i, -2: 10 * i + 1, 0: 2})
        await Rollup(store).run_once()
        first, last = str(day(-6)), str(day(0))
        status, text, err = await operator("usage", "export", "--from", first, "--to", last)
        assert status == 0 and err == ""  # captured output is no terminal: no bar
        exported = list(csv.DictReader(io.StringIO(text)))
        assert list(exported[0]) == ["account", "date", "plan", "limit", "usage"]
        assert len(exported) == 3 * 6  # each account from its creation day (5 days ago)
        # Day by day, then account by account.
        assert [(r["date"], r["account"]) for r in exported] == sorted(
            (r["date"], r["account"]) for r in exported
        )
        _, lines, _ = await operator(
            "usage", "export", "--from", first, "--to", last, "--format", "jsonl"
        )
        as_json = [json.loads(line) for line in lines.splitlines()]
        assert [{k: str(v) for k, v in r.items()} for r in as_json] == exported
        for acct, token in accounts:
            history = await client.get(
                HISTORY_PATH, params={"from": first, "to": last}, headers=bearer(token)
            )
            points = [
                {"account": acct, "date": p["date"], "plan": p["planName"],
                 "limit": p["planLimit"], "usage": p["usage"]}
                for p in history.json()["points"]
            ]  # fmt: skip
            _, one, _ = await operator(
                "usage", "export", "--from", first, "--to", last, "--account", acct,
                "--format", "jsonl",
            )  # fmt: skip
            assert [json.loads(line) for line in one.splitlines()] == points
            assert points == [r for r in as_json if r["account"] == acct]
        status, _, err = await operator("usage", "export", "--from", last, "--to", first)
        assert status == 1 and "after" in err


async def test_export_streams_page_by_page(db_settings: Settings) -> None:
    async with serving(db_settings, middleware=[]) as (_, store):
        rows = [
            (f"acct-{a:03d}", str(day(-d)), a * d, "pro", 1_000_000, 0)
            for a in range(150)
            for d in range(35)
        ]
        await store.db.execute_many(
            "INSERT INTO daily_usage (account_id, day, usage, plan, plan_limit, updated) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        daily = DailyTable(store.db)
        fetched: list[int] = []
        query = store.db.query

        async def spy(sql: str, params: Any = ()) -> Any:
            result = await query(sql, params)
            fetched.append(len(result))
            return result

        store.db.query = spy  # type: ignore[method-assign]
        out = io.StringIO()
        written = await export(daily, day(-40), day(0), None, "csv", out)
        assert written == len(rows) == len(out.getvalue().splitlines()) - 1
        # Never the whole table at once: pages of at most 2,000 rows.
        assert max(fetched) <= 2000 and len(fetched) >= len(rows) // 2000
        assert sum(int(line.rsplit(",", 1)[1]) for line in out.getvalue().splitlines()[1:]) == sum(
            r[2] for r in rows
        )


def test_progress_bar_only_on_a_terminal(db_settings: Settings, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), **settings_env(db_settings)}
    argv = [sys.executable, "-m", "sidecars.usage", "usage", "export"]
    argv += ["--from", "2026-01-01", "--to", "2026-01-31"]
    piped = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and piped.stderr == ""
    assert piped.stdout == "account,date,plan,limit,usage\n"
    # stderr on a terminal, the rows to a file: the bar is drawn there.
    leader, follower = pty.openpty()
    out = tmp_path / "export.csv"
    try:
        shown = subprocess.run(
            [*argv, "--output", str(out)], env=env, stderr=follower, timeout=60, check=True
        )
        assert shown.returncode == 0
        os.close(follower)
        drawn = _read_all(leader)
    finally:
        os.close(leader)
    assert "100.0%" in drawn and "rows" in drawn
    assert out.read_text() == "account,date,plan,limit,usage\n"


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the terminal's other end is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


async def test_usage_show_draws_the_days(
    db_settings: Settings, redis_server: RedisServer, operator: Callable[..., Any]
) -> None:
    clock = Clock(NOW - 3 * DAY)
    async with serving(db_settings, middleware=[], clock=clock) as (_, store):
        acct, _ = await account_with_token(store, "startup")
        clock.now = NOW
        seed(redis_server, store, acct, {-2: 8, -1: 2, 0: 4})
        await Rollup(store).run_once()
    args = ("usage", "show", acct, "--from", str(day(-3)), "--to", str(day(0)))
    status, text, _ = await operator(*args, "--width", "60")
    assert status == 0
    header, *lines, total = text.splitlines()
    assert acct in header and "4 days" in header
    assert [line.split()[0] for line in lines] == [str(day(n)) for n in range(-3, 1)]
    bars = [line.split("│")[1].rstrip() for line in lines]
    assert [len(b) for b in bars] == [0, 44, 11, 22]  # 8 fills the 44 columns left; in scale
    assert "startup (20 per window)" in lines[0]
    assert total == f"total 14; busiest {day(-2)} with 8"
    status, body, _ = await operator(*args, "--format", "json")
    assert [p["usage"] for p in json.loads(body)["points"]] == [0, 8, 2, 4]
    assert (await operator("usage", "show", "nobody-" + acct))[0] == 1
