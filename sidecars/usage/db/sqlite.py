"""The embedded default: one SQLite file (WAL), driven from one thread per process.

sqlite3 blocks, so every statement runs on this database's own single thread (the connection
lives there); an asyncio lock keeps one transaction at a time on it. WAL lets the other
gunicorn workers read while one writes; `busy_timeout` makes a writer wait for the file lock
instead of failing at once. Foreign keys are on (deleting an account deletes its tokens).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from .base import Database, Row, StoreUnavailable, Transaction

T = TypeVar("T")


def _when_unlocked(fn: Callable[[], T], timeout: float) -> T:
    """`fn()`, retried while SQLite says the file is locked without waiting for it: switching
    to WAL and BEGIN IMMEDIATE while another process converts the file can fail at once,
    bypassing busy_timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class _SqliteTransaction(Transaction):
    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self.db._call(lambda c: c.execute(sql, params).rowcount)

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self.db._call(lambda c: c.execute(sql, params).fetchall())

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return await self.db._call(lambda c: c.executemany(sql, rows).rowcount)


class SqliteDatabase(Database):
    """Accounts and tokens in the SQLite file `path`."""

    kind = "sqlite"

    def __init__(self, path: str, timeout: float, **kwargs: Any) -> None:
        super().__init__(timeout, **kwargs)
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock: asyncio.Lock | None = None

    @property
    def identity(self) -> str:
        """The file's absolute path."""
        return "sqlite:" + str(Path(self.path).resolve())

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # Autocommit mode: transactions are the explicit BEGIN IMMEDIATE ... COMMIT below.
            conn = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
            _when_unlocked(lambda: conn.execute("PRAGMA journal_mode=WAL"), self.timeout)
            conn.execute("PRAGMA synchronous=NORMAL")  # durable across crashes of the process
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            self._conn = conn
        return self._conn

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="sqlite")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, lambda: fn(self._connect()))
        except sqlite3.OperationalError as exc:  # locked, unreadable, disk full
            raise StoreUnavailable(f"sqlite {self.path}: {exc}") from exc

    def _get_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        async with self._get_lock():
            return await self._call(lambda c: c.execute(sql, params).fetchall())

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Transaction]:
        async with self._get_lock():
            # IMMEDIATE takes the write lock now: two migrating workers queue here.
            await self._call(
                lambda c: _when_unlocked(lambda: c.execute("BEGIN IMMEDIATE"), self.timeout)
            )
            try:
                yield _SqliteTransaction(self)
            except BaseException:
                await self._call(lambda c: c.execute("ROLLBACK"))
                raise
            await self._call(lambda c: c.execute("COMMIT"))

    async def journal_mode(self) -> str:
        """The journal mode in force (`wal`)."""
        rows = await self._bounded(lambda: self._fetch("PRAGMA journal_mode"))
        return str(rows[0][0])

    async def close(self) -> None:
        """Close the connection and stop the thread."""
        if self._executor is not None:
            conn, self._conn = self._conn, None
            if conn is not None:
                await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
            self._executor.shutdown(wait=False)
            self._executor = None
        self._ready = None
