"""Metered events in SQL: one row per CloudEvent `source` + `id` (the primary key, so a
replayed event or batch inserts nothing), its account (`subject`), type, instant, `data`
(JSON text) and, once cancelled, when. Meters (`sidecars.usage.meters`) aggregate the rows
of one account, event type and time range (an index range). Instants are epoch ms.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .base import Database

_COLUMNS = "source, id, account_id, type, time_ms, data, received_ms, cancelled_ms"


class MeteredEvent(msgspec.Struct, frozen=True, array_like=True):
    """One stored event."""

    source: str
    id: str
    account: str
    type: str
    time_ms: int
    data: str
    received_ms: int
    cancelled_ms: int | None = None


def _event(r: Sequence[object]) -> MeteredEvent:
    cancelled = r[7]
    return MeteredEvent(
        str(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]), str(r[5]), int(r[6]),  # type: ignore[call-overload]
        None if cancelled is None else int(cancelled),  # type: ignore[call-overload]
    )  # fmt: skip


class MeteredTable:
    """The `usage_events` table over one database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def insert(self, events: Sequence[MeteredEvent]) -> int:
        """Store the events not stored yet (by source and id), all or none; how many were new."""
        sql = (
            f"INSERT INTO usage_events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (source, id) DO NOTHING"
        )
        if not events:
            return 0
        return await self.db.execute_many(sql, [msgspec.structs.astuple(e) for e in events])

    async def existing_accounts(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` are accounts (one query)."""
        if not ids:
            return set()
        marks = ", ".join("?" * len(ids))
        rows = await self.db.query(f"SELECT id FROM accounts WHERE id IN ({marks})", list(ids))
        return {str(r[0]) for r in rows}

    async def get(self, source: str, event_id: str) -> MeteredEvent | None:
        """One event, or None."""
        sql = f"SELECT {_COLUMNS} FROM usage_events WHERE source = ? AND id = ?"
        rows = await self.db.query(sql, (source, event_id))
        return _event(rows[0]) if rows else None

    async def cancel(self, source: str, event_id: str, now_ms: int, since_ms: int) -> bool:
        """Mark the event cancelled if it is not yet and was received at or after `since_ms`;
        whether this call cancelled it."""
        sql = (
            "UPDATE usage_events SET cancelled_ms = ? WHERE source = ? AND id = ? "
            "AND cancelled_ms IS NULL AND received_ms >= ?"
        )
        return bool(await self.db.execute(sql, (now_ms, source, event_id, since_ms)))

    async def series(
        self, account_id: str, event_type: str, start_ms: int, end_ms: int
    ) -> list[tuple[int, str]]:
        """(time_ms, data) of the account's live (not cancelled) events of one type in
        [start_ms, end_ms), oldest first."""
        sql = (
            "SELECT time_ms, data FROM usage_events WHERE account_id = ? AND type = ? "
            "AND time_ms >= ? AND time_ms < ? AND cancelled_ms IS NULL ORDER BY time_ms"
        )
        rows = await self.db.query(sql, (account_id, event_type, start_ms, end_ms))
        return [(int(r[0]), str(r[1])) for r in rows]

    async def purge(self, before_ms: int) -> int:
        """Drop events from before `before_ms` (retention); the rows dropped."""
        return await self.db.execute("DELETE FROM usage_events WHERE time_ms < ?", (before_ms,))

    async def cross(self, account_id: str, meter: str, window_start: int, pct: int) -> int | None:
        """Mark a threshold reached in a window; the crossing's number when this call
        flipped it from unreached (or made it), None when it was reached already."""
        key = (account_id, meter, window_start, pct)

        async def run() -> int | None:
            async with self.db.transaction() as tx:
                flipped = await tx.execute(
                    "INSERT INTO meter_thresholds (account_id, meter, window_start, threshold, "
                    "crossed, crossings) VALUES (?, ?, ?, ?, 1, 1) "
                    "ON CONFLICT (account_id, meter, window_start, threshold) DO UPDATE SET "
                    "crossed = 1, crossings = meter_thresholds.crossings + 1 "
                    "WHERE meter_thresholds.crossed = 0",
                    key,
                )
                if not flipped:
                    return None
                rows = await tx.fetch(
                    "SELECT crossings FROM meter_thresholds WHERE account_id = ? AND meter = ? "
                    "AND window_start = ? AND threshold = ?",
                    key,
                )
                return int(rows[0][0])

        return await self.db.bounded(run)

    async def uncross(self, account_id: str, meter: str, window_start: int, pct: int) -> None:
        """Mark a threshold no longer reached in a window (a cancellation took it back)."""
        await self.db.execute(
            "UPDATE meter_thresholds SET crossed = 0 WHERE account_id = ? AND meter = ? "
            "AND window_start = ? AND threshold = ? AND crossed = 1",
            (account_id, meter, window_start, pct),
        )
