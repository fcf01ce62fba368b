"""Threshold events and their delivery attempts in SQL.

The event row is the "exactly one per threshold per window" guarantee: its unique key is
(account, meter, threshold, window start, crossing), and only the process whose INSERT
created the row delivers it. Deliveries are claimed with a lease (a conditional UPDATE,
atomic in SQLite and PostgreSQL alike), so a retry is sent by one worker, and a worker that
died mid-delivery leaves an event another one picks up once the lease ends.
Instants are epoch milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from .base import Database

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
STATUSES = (PENDING, DELIVERED, FAILED)

_EVENT = (
    "id, account_id, threshold, window_start, created_ms, payload, status, attempts, "
    "next_attempt_ms, lease_until_ms, give_up_ms, delivered_ms, meter, crossing"
)
_ATTEMPT = "event_id, attempt, at_ms, duration_ms, status_code, error"


class EventRecord(msgspec.Struct, frozen=True):
    """One threshold event: what was crossed, its body, where its delivery stands."""

    id: str
    account: str
    threshold: int
    window_start: int
    created_ms: int
    payload: str
    status: str
    attempts: int
    next_attempt_ms: int
    lease_until_ms: int
    give_up_ms: int
    delivered_ms: int | None = None
    meter: str = ""  # '' = the counted requests
    crossing: int = 1  # the how-many-th time the meter's value reached the mark


class AttemptRecord(msgspec.Struct, frozen=True):
    """One delivery attempt: when, how long, the receiver's status or the error."""

    event_id: str
    attempt: int
    at_ms: int
    duration_ms: int
    status_code: int | None
    error: str = ""


def _event(r: Sequence[Any]) -> EventRecord:
    return EventRecord(
        r[0], r[1], int(r[2]), int(r[3]), int(r[4]), r[5], r[6], int(r[7]), int(r[8]),
        int(r[9]), int(r[10]), None if r[11] is None else int(r[11]), r[12], int(r[13]),
    )  # fmt: skip


class EventTable:
    """The `webhook_events` and `webhook_attempts` tables over one database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, event: EventRecord) -> bool:
        """Insert the event unless its (account, meter, threshold, window, crossing) has one;
        True when this call created it (its caller then owns the first delivery: the row
        holds its lease)."""
        marks = ", ".join("?" * len(_EVENT.split(", ")))
        sql = (
            f"INSERT INTO webhook_events ({_EVENT}) VALUES ({marks}) "
            "ON CONFLICT (account_id, meter, threshold, window_start, crossing) DO NOTHING"
        )
        return bool(await self.db.execute(sql, msgspec.structs.astuple(event)))

    async def get(self, event_id: str) -> EventRecord | None:
        """One event, or None."""
        rows = await self.db.query(f"SELECT {_EVENT} FROM webhook_events WHERE id = ?", (event_id,))
        return _event(rows[0]) if rows else None

    async def due(self, now_ms: int, limit: int) -> list[str]:
        """Ids of pending events whose next attempt is due and that nobody holds."""
        sql = (
            "SELECT id FROM webhook_events WHERE status = ? AND next_attempt_ms <= ? "
            "AND lease_until_ms <= ? ORDER BY next_attempt_ms LIMIT ?"
        )
        return [r[0] for r in await self.db.query(sql, (PENDING, now_ms, now_ms, limit))]

    async def claim(
        self, event_id: str, now_ms: int, lease_ms: int, *, again: bool = False
    ) -> EventRecord | None:
        """Hold the event for one delivery attempt until `now_ms + lease_ms`; None when
        another worker holds it, or (unless `again`: an operator's resend) it is not pending.
        A resend makes the event pending again (the caller records a fresh retry period)."""
        if again:
            sql = (
                "UPDATE webhook_events SET lease_until_ms = ?, status = ? "
                "WHERE id = ? AND lease_until_ms <= ?"
            )
            params: tuple[object, ...] = (now_ms + lease_ms, PENDING, event_id, now_ms)
        else:
            sql = (
                "UPDATE webhook_events SET lease_until_ms = ? "
                "WHERE id = ? AND status = ? AND lease_until_ms <= ?"
            )
            params = (now_ms + lease_ms, event_id, PENDING, now_ms)
        if not await self.db.execute(sql, params):
            return None
        return await self.get(event_id)

    async def record(
        self, attempt: AttemptRecord, status: str, next_attempt_ms: int, give_up_ms: int
    ) -> None:
        """Store an attempt and the event's new state, releasing its lease (one transaction)."""
        delivered = attempt.at_ms + attempt.duration_ms if status == DELIVERED else None

        async def run() -> None:
            async with self.db.transaction() as tx:
                await tx.execute(
                    f"INSERT INTO webhook_attempts ({_ATTEMPT}) VALUES (?, ?, ?, ?, ?, ?)",
                    msgspec.structs.astuple(attempt),
                )
                await tx.execute(
                    "UPDATE webhook_events SET status = ?, attempts = ?, next_attempt_ms = ?, "
                    "lease_until_ms = 0, give_up_ms = ?, delivered_ms = ? WHERE id = ?",
                    (
                        status,
                        attempt.attempt,
                        next_attempt_ms,
                        give_up_ms,
                        delivered,
                        attempt.event_id,
                    ),
                )

        await self.db.bounded(run)

    async def attempts(self, event_id: str) -> list[AttemptRecord]:
        """An event's delivery attempts, oldest first."""
        sql = f"SELECT {_ATTEMPT} FROM webhook_attempts WHERE event_id = ? ORDER BY attempt"
        return [AttemptRecord(*r) for r in await self.db.query(sql, (event_id,))]

    async def recent(
        self, account_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[EventRecord]:
        """The newest events first, optionally of one account and/or in one status."""
        where, params = [], []
        if account_id is not None:
            where.append("account_id = ?")
            params.append(account_id)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        sql = f"SELECT {_EVENT} FROM webhook_events {clause}ORDER BY created_ms DESC, id LIMIT ?"
        return [_event(r) for r in await self.db.query(sql, [*params, limit])]

    async def purge(self, before_ms: int) -> int:
        """Drop events created before `before_ms` and their attempts (retention)."""

        async def run() -> int:
            async with self.db.transaction() as tx:
                old = "SELECT id FROM webhook_events WHERE created_ms < ?"
                await tx.execute(
                    f"DELETE FROM webhook_attempts WHERE event_id IN ({old})", (before_ms,)
                )
                return await tx.execute(
                    "DELETE FROM webhook_events WHERE created_ms < ?", (before_ms,)
                )

        return await self.db.bounded(run)
