"""A sidecar (usage API, transit API) served by real gunicorn with uvicorn workers.

Started on port 0: gunicorn binds a free port and says which ("Listening at: ..."), so there
is no race for the port. A worker answers only once its app is up, and a kept-alive
connection always reaches the same worker: readiness of *every* worker is checked over fresh
connections (`wait_each_worker`, `wait_steady`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from .postgres_server import PostgresServer
from .process import REPO, Proc, start_bound

LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")
# A new connection per request: a kept-alive one would always reach the same worker.
FRESH = {"Connection": "close"}


class Gunicorn(Proc):
    """gunicorn (`argv`) with `workers` uvicorn workers; `base` is its URL once listening."""

    name = "gunicorn"

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        workers: int = 2,
        code: Path = REPO,
    ) -> None:
        self.workers = workers
        self.port = 0
        self.base = ""
        # `python -m` imports from its working directory first: `code` is the tree served
        # (another checkout's, for the attack bench's "before").
        full = {**os.environ, "PYTHONPATH": str(code), **env}
        super().__init__(argv, log_path, full, cwd=code)

    def ready(self) -> bool:
        """True once gunicorn has said which port it listens on."""
        if not self.port:
            match = LISTENING.search(self.log())
            if match:
                self.port = int(match.group(1))
                self.base = f"http://127.0.0.1:{self.port}"
        return bool(self.port)

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        """One GET on a fresh connection."""
        headers = {**FRESH, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
        return httpx.get(self.base + path, headers=headers, timeout=10, **kwargs)  # type: ignore[arg-type]

    def wait_each_worker(
        self,
        path: str,
        ok: Callable[[httpx.Response], bool],
        header: str,
        timeout: float = 60.0,
    ) -> None:
        """Until every worker (told apart by its `header`) has answered `path` with `ok`."""
        seen: set[str] = set()

        def check() -> bool:
            response = self.get(path)
            if ok(response):
                seen.add(response.headers[header])
            return len(seen) >= self.workers

        self.wait_steady(check, f"every worker to answer {path}", times=1, timeout=timeout)

    def wait_steady(
        self, check: Callable[[], bool], what: str, times: int = 10, timeout: float = 60.0
    ) -> None:
        """Until `check()` holds `times` in a row (fresh connections reach every worker).

        A connection error counts as a miss; the log's tail is in the failure message.
        """
        deadline = time.monotonic() + timeout
        streak = 0
        while streak < times:
            self.alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.log()[-3000:]}")
            try:
                good = check()
            except httpx.TransportError:
                good = False
            streak = streak + 1 if good else 0
            if not good:
                time.sleep(0.05)


def usage_sidecar(
    env: dict[str, str], log_path: Path, workers: int = 2, code: Path = REPO
) -> Gunicorn:
    """`python -m sidecars.usage serve` on port 0 with `workers` workers (USAGE_* in `env`),
    from the tree `code`."""
    defaults = {
        "USAGE_HOST": "127.0.0.1",
        "USAGE_PORT": "0",
        "USAGE_WORKERS": str(workers),
        # gunicorn reports the bound port ("Listening at") at info level.
        "USAGE_LOG_LEVEL": "info",
    }
    argv = [sys.executable, "-m", "sidecars.usage", "serve"]
    return Gunicorn(argv, defaults | env, log_path, workers, code)


def usage_database(kind: str, directory: Path, postgres: PostgresServer | None) -> dict[str, str]:
    """The USAGE_* variable naming a fresh database of `kind` ("sqlite": a file in
    `directory`; "postgres": a new database on `postgres`)."""
    if kind == "sqlite":
        return {"USAGE_SQLITE_PATH": str(directory / f"usage-{uuid.uuid4().hex[:8]}.sqlite3")}
    assert postgres is not None, "a PostgreSQL server is needed"
    return {"USAGE_POSTGRES_DSN": postgres.create_database("u" + uuid.uuid4().hex[:12])}


def usage_databases(
    names: str, directory: Path, procs: list[Proc]
) -> Iterator[tuple[str, PostgresServer | None, dict[str, str]]]:
    """For a benchmark, each of the comma-separated databases `names` (sqlite, postgres): its
    name, the PostgreSQL server (started in `directory` when first named, and added to
    `procs` to be stopped) or None, and the USAGE_* variable naming a fresh database."""
    pg: PostgresServer | None = None
    for name in names.split(","):
        if name == "postgres" and pg is None:
            pg = start_bound(lambda: PostgresServer(directory / "pg"))
            procs.append(pg)
        server = pg if name == "postgres" else None
        yield name, server, usage_database(name, directory, server)


def usage_bench_arguments(results: str, **options: int | str) -> argparse.Namespace:
    """A usage benchmark's command line: `--<option> VALUE` for each of `options` (its default
    and type), `--backends` (the databases it runs on, all by default) and `--out` (its JSON,
    `bench/results/<results>.json` by default)."""
    ap = argparse.ArgumentParser()
    for name, default in options.items():
        ap.add_argument(f"--{name}", type=type(default), default=default)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / f"{results}.json"))
    return ap.parse_args()


def record_database(results: dict[str, Any], backend: str, entry: dict[str, Any]) -> None:
    """Keep a usage benchmark's figures for one database, with the load average after them,
    and print them at once: a run over several databases shows each as it is done."""
    from .machine import load_average

    entry["load average after"] = load_average()
    results[backend] = entry
    print(json.dumps({backend: entry}, indent=2), flush=True)


def write_usage_results(
    out: str, results: dict[str, Any], redis_version: str, **machine: object
) -> Path:
    """Write a usage benchmark's JSON to `out`, its `machine` entry being what ran, on what,
    how busy (and `machine`'s own items); the path written."""
    from .machine import SIDECAR_PACKAGES, load_average, machine_info

    results["machine"] = {
        **machine_info(SIDECAR_PACKAGES),
        "redis-server": redis_version,
        "load average at end": load_average(),
        **machine,
    }
    path = Path(out)
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path


def transit_sidecar(env: dict[str, str], log_path: Path, workers: int = 2, *extra: str) -> Gunicorn:
    """`python -m sidecars.transit [extra gunicorn options]` on port 0 with `workers` workers
    (TRANSIT_* in `env`)."""
    defaults = {
        "TRANSIT_HOST": "127.0.0.1",
        "TRANSIT_PORT": "0",
        "TRANSIT_WORKERS": str(workers),
        # gunicorn reports the bound port ("Listening at") at info level.
        "TRANSIT_LOG_LEVEL": "info",
        "PYTHONWARNINGS": "ignore::DeprecationWarning",
    }
    argv = [sys.executable, "-m", "sidecars.transit", *extra]
    return Gunicorn(argv, defaults | env, log_path, workers)
