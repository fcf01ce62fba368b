"""The usage API's system of record: accounts, plan assignments, subscription periods and
tokens in SQL (SQLite by default, PostgreSQL with USAGE_POSTGRES_DSN). Usage counters are
not here: they stay in Redis (`sidecars.usage.counters`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import AccountError, AccountRecord, Database, StoreUnavailable, TokenRecord

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = [
    "AccountError",
    "AccountRecord",
    "Database",
    "StoreUnavailable",
    "TokenRecord",
    "open_database",
]


def open_database(settings: Settings, clock: Callable[[], float] = time.time) -> Database:
    """The database the settings name (nothing is connected until first use)."""
    if settings.postgres_dsn:
        from .postgres import PostgresDatabase  # the driver is loaded only when used

        return PostgresDatabase(
            settings.postgres_dsn,
            settings.database_timeout_seconds,
            pool_size=settings.database_pool_size,
            clock=clock,
        )
    from .sqlite import SqliteDatabase

    return SqliteDatabase(settings.sqlite_path, settings.database_timeout_seconds, clock=clock)
