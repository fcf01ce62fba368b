"""The account database behind one interface: the queries, written once, and the migrations.

`Database` holds the queries of accounts (plan, subscription period, thresholds) and tokens;
the daily usage (`daily.py`) and the webhook events (`events.py`) are tables of their own
over the same public primitives (`query`, `execute`, `execute_many`, `transaction`). A
backend (`sqlite.SqliteDatabase`, `postgres.PostgresDatabase`) only runs SQL: `_fetch` and
`_transaction`. Queries use `?` placeholders; a backend whose driver wants another style
translates them once (`placeholder`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import date
from typing import Any, TypeVar

import msgspec

from .schema import LATEST, MIGRATIONS, VERSION_TABLE

T = TypeVar("T")
Row = tuple[Any, ...]
ACCOUNT_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class StoreUnavailable(Exception):
    """A store (the database or Redis) cannot answer now: unreachable, failing, or slower
    than its timeout."""


class AccountError(ValueError):
    """An administrative request the store refuses (unknown account, duplicate, bad value)."""


class AccountRecord(msgspec.Struct, frozen=True):
    """An account row: plan assignment and subscription period (`window` "" = plan default)."""

    id: str
    plan: str
    window: str
    start: date
    end: date | None
    created: int
    updated: int
    suspended: int | None = None
    thresholds: str | None = None  # None: the plan's; "": none; "80,100": these percentages


class TokenRecord(msgspec.Struct, omit_defaults=True):
    """A token row (never the token: its SHA-256)."""

    id: str
    account: str
    sha256: str
    created: int
    label: str = ""
    revoked: int | None = None
    expires: int | None = None
    last_used: int | None = None


_ACCOUNT_COLUMNS = (
    "id, plan, window_kind, start_date, end_date, created, updated, suspended, thresholds"
)
_TOKEN_COLUMNS = "id, account_id, sha256, created, label, revoked, expires, last_used"
_N_TOKEN = len(_TOKEN_COLUMNS.split(", "))


def _account(row: Row) -> AccountRecord:
    return AccountRecord(
        id=row[0],
        plan=row[1],
        window=row[2],
        start=date.fromisoformat(row[3]),
        end=date.fromisoformat(row[4]) if row[4] else None,
        created=int(row[5]),
        updated=int(row[6]),
        suspended=_int(row[7]),
        thresholds=row[8],
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _token(row: Row) -> TokenRecord:
    return TokenRecord(
        id=row[0],
        account=row[1],
        sha256=row[2],
        created=int(row[3]),
        label=row[4] or "",
        revoked=_int(row[5]),
        expires=_int(row[6]),
        last_used=_int(row[7]),
    )


class Transaction:
    """What a migration or a multi-statement change runs in (one backend transaction)."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the rows it changed."""
        raise NotImplementedError

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one query; its rows."""
        raise NotImplementedError

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run one statement once per row of parameters (one driver call); rows changed."""
        raise NotImplementedError


class Database:
    """Accounts and tokens in SQL; every call bounded by `timeout` seconds."""

    kind = "sql"

    @property
    def identity(self) -> str:
        """Which database this is (the same for every process that opens it)."""
        raise NotImplementedError

    def __init__(self, timeout: float, clock: Callable[[], float] = time.time) -> None:
        self.timeout = timeout
        self.clock = clock
        self._ready: asyncio.Future[int] | None = None

    # ------------------------------------------------------------ the backend's part

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One query (or statement) in its own transaction; its rows."""
        raise NotImplementedError

    def _transaction(self) -> Any:
        """An async context manager yielding a `Transaction` (committed on exit)."""
        raise NotImplementedError

    async def _write(self, sql: str, params: Sequence[Any]) -> int:
        """One statement in its own transaction, bounded in time: the rows it changed."""

        async def run() -> int:
            async with self._transaction() as tx:
                return await tx.execute(sql, params)

        return await self._bounded(run)

    # ------------------------------------------------------------ public primitives

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One query, bounded in time: its rows."""
        return await self._bounded(lambda: self._fetch(sql, params))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One statement in its own transaction, bounded in time: the rows it changed."""
        return await self._write(sql, params)

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """One statement per row of parameters, all in one transaction, bounded in time."""

        async def run() -> int:
            async with self._transaction() as tx:
                return await tx.execute_many(sql, rows)

        return await self._bounded(run)

    def transaction(self) -> Any:
        """An async context manager yielding a `Transaction` (committed on exit); the caller
        bounds it (`bounded`)."""
        return self._transaction()

    async def bounded(self, make: Callable[[], Awaitable[T]]) -> T:
        """`make()` after the migrations, within the database's timeout (StoreUnavailable
        when over it or unreachable)."""
        return await self._bounded(make)

    async def _lock_for_migration(self, tx: Transaction) -> None:
        """Serialise concurrent migrators (several workers start at once)."""

    async def close(self) -> None:
        """Release connections."""

    # ------------------------------------------------------------ plumbing

    async def _bounded(self, make: Callable[[], Awaitable[T]]) -> T:
        if self._ready is None or (self._ready.done() and self._ready.exception()):
            self._ready = asyncio.ensure_future(self.migrate())
            # Retrieved even when every waiter timed out before it failed.
            self._ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.shield(self._ready)
                return await make()
        except StoreUnavailable:
            raise
        except (OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"{self.kind}: {exc or type(exc).__name__}") from exc

    async def migrate(self, target: int = LATEST) -> int:
        """Apply the migrations not applied yet (up to `target`); the schema version now."""
        async with self._transaction() as tx:
            await self._lock_for_migration(tx)
            await tx.execute(VERSION_TABLE)
            rows = await tx.fetch("SELECT version FROM schema_version")
            if not rows:
                await tx.execute("INSERT INTO schema_version (version) VALUES (0)")
                version = 0
            else:
                version = int(rows[0][0])
            if version > LATEST:
                raise StoreUnavailable(
                    f"{self.kind}: schema version {version} is newer than this code ({LATEST})"
                )
            for number in range(version + 1, target + 1):
                for statement in MIGRATIONS[number - 1]:
                    await tx.execute(statement)
                await tx.execute("UPDATE schema_version SET version = ?", (number,))
            return max(version, target)

    async def version(self) -> int:
        """The schema version applied (after migrating)."""
        rows = await self.query("SELECT version FROM schema_version")
        return int(rows[0][0])

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers."""
        await self.query("SELECT 1")

    # ------------------------------------------------------------ request path

    async def token_owner(self, sha256: str) -> tuple[TokenRecord, AccountRecord] | None:
        """The valid (unrevoked) token with this hash and its account, in one query."""
        sql = (
            f"SELECT t.{', t.'.join(_TOKEN_COLUMNS.split(', '))}, "
            f"a.{', a.'.join(_ACCOUNT_COLUMNS.split(', '))} "
            "FROM tokens t JOIN accounts a ON a.id = t.account_id "
            "WHERE t.sha256 = ? AND t.revoked IS NULL"
        )
        rows = await self.query(sql, (sha256,))
        if not rows:
            return None
        return _token(rows[0][:_N_TOKEN]), _account(rows[0][_N_TOKEN:])

    async def touch_token(self, token_id: str, now: int) -> None:
        """Record a token's use (`last_used`)."""
        sql = "UPDATE tokens SET last_used = ? WHERE id = ?"

        await self._write(sql, (now, token_id))

    async def account(self, account_id: str) -> AccountRecord | None:
        """The account row, or None."""
        sql = f"SELECT {_ACCOUNT_COLUMNS} FROM accounts WHERE id = ?"
        rows = await self.query(sql, (account_id,))
        return _account(rows[0]) if rows else None

    # ------------------------------------------------------------ administration

    async def create_account(
        self, account_id: str, plan: str, window: str, start: date, end: date | None
    ) -> AccountRecord:
        """Insert an account; AccountError when the id is taken."""
        now = int(self.clock())
        # A deleted account's id stays taken: Redis counters, history and events are keyed
        # by it, and a new owner would inherit them (and be refused as over quota).
        sql = (
            f"INSERT INTO accounts ({_ACCOUNT_COLUMNS}) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ? "
            "WHERE NOT EXISTS (SELECT 1 FROM deleted_accounts WHERE id = ?) "
            "ON CONFLICT (id) DO NOTHING"
        )
        params = (
            *(account_id, plan, window, start.isoformat(), _iso(end), now, now, None, None),
            account_id,
        )

        if not await self._write(sql, params):
            if await self.query("SELECT 1 FROM deleted_accounts WHERE id = ?", (account_id,)):
                raise AccountError(
                    f"account id {account_id!r} belonged to a deleted account; ids are never "
                    "reused (its usage stays on record), choose another"
                )
            raise AccountError(f"account {account_id!r} exists")
        return await self._require(account_id)

    async def update_account(self, account_id: str, changes: dict[str, Any]) -> AccountRecord:
        """Set columns of an account (`plan`, `window_kind`, `start_date`, `end_date`,
        `suspended`, `thresholds`)."""
        allowed = {"plan", "window_kind", "start_date", "end_date", "suspended", "thresholds"}
        assert set(changes) <= allowed, changes
        columns = [*changes, "updated"]
        values = [*changes.values(), int(self.clock()), account_id]
        sql = f"UPDATE accounts SET {', '.join(c + ' = ?' for c in columns)} WHERE id = ?"

        if not await self._write(sql, values):
            raise AccountError(f"no account {account_id!r}")
        return await self._require(account_id)

    async def accounts(self) -> list[AccountRecord]:
        """Every account, by id."""
        sql = f"SELECT {_ACCOUNT_COLUMNS} FROM accounts ORDER BY id"
        return [_account(r) for r in await self.query(sql)]

    async def delete_account(self, account_id: str) -> None:
        """Delete an account and (cascade) its tokens; AccountError when there is none."""

        async def delete() -> int:
            async with self._transaction() as tx:
                # Tokens first: the same on a database whose foreign keys do not cascade.
                await tx.execute("DELETE FROM tokens WHERE account_id = ?", (account_id,))
                deleted = await tx.execute("DELETE FROM accounts WHERE id = ?", (account_id,))
                if deleted:
                    await tx.execute(
                        "INSERT INTO deleted_accounts (id, deleted) VALUES (?, ?)",
                        (account_id, int(self.clock())),
                    )
                return deleted

        if not await self._bounded(delete):
            raise AccountError(f"no account {account_id!r}")

    async def _require(self, account_id: str) -> AccountRecord:
        account = await self.account(account_id)
        if account is None:
            raise AccountError(f"no account {account_id!r}")
        return account

    async def insert_token(self, token: TokenRecord) -> None:
        """Store a new token's row."""
        sql = f"INSERT INTO tokens ({_TOKEN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        params = (
            token.id,
            token.account,
            token.sha256,
            token.created,
            token.label,
            None,
            token.expires,
            None,
        )

        await self._write(sql, params)

    async def tokens(self, account_id: str) -> list[TokenRecord]:
        """The account's tokens, oldest first (revoked ones too)."""
        sql = f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE account_id = ? ORDER BY created, id"
        return [_token(r) for r in await self.query(sql, (account_id,))]

    async def revoke_token(self, account_id: str, token_id: str) -> TokenRecord:
        """Mark a token revoked (kept for the listing); the next request with it is refused."""
        now = int(self.clock())
        sql = "UPDATE tokens SET revoked = ? WHERE account_id = ? AND id = ? AND revoked IS NULL"

        await self._write(sql, (now, account_id, token_id))
        for token in await self.tokens(account_id):
            if token.id == token_id:
                return token
        raise AccountError(f"account {account_id!r} has no token {token_id!r}")


def _iso(d: date | None) -> str | None:
    return d.isoformat() if d is not None else None


def placeholder(sql: str, style: str) -> str:
    """`?` placeholders in another driver's style (`%s`); the queries contain no other `?`."""
    return sql.replace("?", style)
