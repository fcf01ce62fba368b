"""A real PostgreSQL server (the Debian `postgresql` package's binaries) on a free port.

`initdb` makes a fresh cluster in the server's own directory (trust authentication, no
fsync: a test cluster), then `postgres` serves it on 127.0.0.1 and a unix socket in that
directory, polled with `pg_isready`. PostgreSQL refuses to run as root, so as root the
binaries run as the `postgres` user (`setpriv`, which execs: the pid is the server's). A
missing binary is a failure, never a skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .process import Proc
from .ready import free_port

INSTALL = "apt-get install postgresql (scripts/bootstrap.sh --system)"


def pg_binary(name: str) -> str:
    """A PostgreSQL server binary: on PATH, else the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if not candidates:
        raise AssertionError(f"{name} is not installed ({INSTALL})")
    return candidates[-1]


def _reachable_by_postgres(path: Path) -> bool:
    """Whether every ancestor of `path` lets others through (o+x)."""
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def _as_postgres(argv: Sequence[str]) -> list[str]:
    if os.geteuid() != 0:
        return list(argv)
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *argv]


class PostgresServer(Proc):
    """One `postgres` process serving a cluster made by initdb in `workdir`."""

    name = "postgres"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self._own_dir = False
        if os.geteuid() == 0 and not _reachable_by_postgres(workdir):
            # pytest's temp dirs are 0700 root: the postgres user could not enter them.
            workdir = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))
            self._own_dir = True
        self.workdir = workdir
        self.data = workdir / "data"
        self.port = port if port is not None else free_port()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:
            shutil.chown(workdir, "postgres", "postgres")
        if not (self.data / "PG_VERSION").exists():
            subprocess.run(
                _as_postgres(
                    [
                        pg_binary("initdb"),
                        "-D", str(self.data),
                        "-U", self.user,
                        "--auth=trust",
                        "--encoding=UTF8",
                        "--no-sync",
                    ]
                ),
                check=True,
                capture_output=True,
                timeout=120,
            )  # fmt: skip
        argv = _as_postgres(
            [
                pg_binary("postgres"),
                "-D", str(self.data),
                "-p", str(self.port),
                "-h", "127.0.0.1",
                "-k", str(workdir),
                "-c", "fsync=off",
                "-c", "synchronous_commit=off",
                "-c", "full_page_writes=off",
            ]
        )  # fmt: skip
        super().__init__(argv, workdir / "postgres.log")

    def _release(self) -> None:
        super()._release()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq URL of a database on this server."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def ready(self) -> bool:
        """True once pg_isready says the server accepts connections."""
        probe = subprocess.run(
            [pg_binary("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-t", "1"],
            capture_output=True,
            timeout=10,
        )
        return probe.returncode == 0

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run SQL with psql; its output (unaligned, tuples only)."""
        out = subprocess.run(
            [pg_binary("psql"), "-X", "-At", "-v", "ON_ERROR_STOP=1", self.dsn(dbname), "-c", sql],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return out.stdout

    def create_database(self, name: str) -> str:
        """A new empty database; its DSN."""
        self.psql(f'CREATE DATABASE "{name}"')
        return self.dsn(name)
