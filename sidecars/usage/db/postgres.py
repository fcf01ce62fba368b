"""PostgreSQL for production, with psycopg 3 (async) and its connection pool.

Why psycopg 3 rather than asyncpg: it speaks libpq, so the DSN takes every form PostgreSQL's
own tools accept (URLs, `key=value`, PG* variables, service files, unix sockets); it has one
API for async and sync code and a maintained pool (psycopg-pool); the request path runs one
indexed query per request, where asyncpg's raw speed would not show. Concurrent migrators are
serialised with a transaction-scoped advisory lock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from .base import Database, Row, StoreUnavailable, Transaction, placeholder

# pg_advisory_xact_lock key of the migrations ("usage" in ASCII).
MIGRATION_LOCK = 0x7573616765


class _PgTransaction(Transaction):
    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        cur = await self.conn.execute(placeholder(sql, "%s"), params)  # type: ignore[arg-type]
        return cur.rowcount

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = await self.conn.execute(placeholder(sql, "%s"), params)  # type: ignore[arg-type]
        return await cur.fetchall()

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        # psycopg pipelines executemany: one round trip for the batch, not one per row.
        async with self.conn.cursor() as cur:
            await cur.executemany(placeholder(sql, "%s"), rows)  # type: ignore[arg-type]
            return cur.rowcount


class PostgresDatabase(Database):
    """Accounts and tokens in the PostgreSQL database of `dsn`."""

    kind = "postgresql"

    def __init__(self, dsn: str, timeout: float, pool_size: int = 4, **kwargs: Any) -> None:
        super().__init__(timeout, **kwargs)
        self.dsn = dsn
        self.pool_size = pool_size
        self._pool: AsyncConnectionPool[Any] | None = None

    @property
    def identity(self) -> str:
        """The DSN."""
        return "postgresql:" + self.dsn

    async def _get_pool(self) -> AsyncConnectionPool[Any]:
        if self._pool is None:
            pool = AsyncConnectionPool(
                self.dsn,
                min_size=1,
                max_size=self.pool_size,
                timeout=self.timeout,
                kwargs={"connect_timeout": max(1, round(self.timeout))},
                open=False,
            )
            # Opening does not wait for a connection: an unreachable server surfaces as a
            # PoolTimeout on the first request (503), not as a worker that fails to boot.
            await pool.open(wait=False)
            self._pool = pool
        return self._pool

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        pool = await self._get_pool()
        try:
            async with pool.connection() as conn:
                yield conn
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise StoreUnavailable(f"postgresql: {exc}") from exc

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        async with self._connection() as conn:
            return await _PgTransaction(conn).fetch(sql, params)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Transaction]:
        async with self._connection() as conn, conn.transaction():
            yield _PgTransaction(conn)

    async def _lock_for_migration(self, tx: Transaction) -> None:
        await tx.fetch("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))

    async def close(self) -> None:
        """Close the pool."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        self._ready = None
