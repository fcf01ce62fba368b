"""Accounts and tokens as the usage API sees them: records of the system of record resolved
against the plans, and their administration (what the CLI does), written once for the store.

`AccountAdmin` is the part of `UsageStore` that needs only the database, the plans and the
clock: resolving an account record (its effective window kind and thresholds) and creating,
changing, suspending and deleting accounts, issuing, listing and revoking tokens. The
request path (authentication, check-and-count, refunds) stays in `store.py`.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any

import msgspec

from .db import AccountError, AccountRecord, Database, TokenRecord
from .db.base import ACCOUNT_ID_RE
from .plans import WINDOW_KINDS, Plan, PlanError, parse_thresholds
from .windows import utc_date


class Keep:
    """The `end` of `update_account` when it is left as it is."""


KEEP = Keep()

TOKEN_PREFIX = "usk_"
# usk_ + 32 random bytes in unpadded base64url: anything else is rejected before any lookup.
TOKEN_RE = re.compile(r"usk_[A-Za-z0-9_-]{43}")


class Account(msgspec.Struct, frozen=True):
    """An account as stored, with its plan resolved."""

    id: str
    plan: str
    window: str  # the effective window kind (the plan's default when the record has none)
    start: date
    end: date | None
    window_override: bool = False
    created: int = 0
    updated: int = 0
    suspended: int | None = None
    thresholds: tuple[int, ...] = ()  # the effective ones (the plan's unless the record says)
    thresholds_override: bool = False


def _thresholds(record: AccountRecord) -> tuple[int, ...]:
    # Written by `update_account` from checked values.
    return tuple(int(v) for v in (record.thresholds or "").split(",") if v)


def token_hash(token: str) -> str:
    """The hex SHA-256 a token is stored under."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random bearer token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class AccountAdmin:
    """Account resolution and administration over `db` (see the module docstring)."""

    db: Database
    plans: Mapping[str, Plan]
    clock: Callable[[], float]

    async def account(self, account_id: str) -> Account | None:
        """The account record, or None."""
        record = await self.db.account(account_id)
        return self._account(record) if record is not None else None

    def _account(self, record: AccountRecord) -> Account | None:
        plan = self.plans.get(record.plan)
        # An account whose plan was removed from the plans file is no account.
        if plan is None:
            return None
        return Account(
            id=record.id,
            plan=plan.name,
            window=record.window or plan.window,
            start=record.start,
            end=record.end,
            window_override=bool(record.window),
            created=record.created,
            updated=record.updated,
            suspended=record.suspended,
            thresholds=plan.thresholds if record.thresholds is None else _thresholds(record),
            thresholds_override=record.thresholds is not None,
        )

    def _check_id(self, account_id: str) -> None:
        if ACCOUNT_ID_RE.fullmatch(account_id) is None:
            raise AccountError(
                f"account id {account_id!r}: 1-64 of A-Z a-z 0-9 _ . - (starting alphanumeric)"
            )

    def _check(self, plan: str | None, window: str | None) -> None:
        """Refuse an unknown plan or window kind."""
        if plan is not None and plan not in self.plans:
            raise AccountError(f"unknown plan {plan!r} (plans: {', '.join(self.plans)})")
        if window and window not in WINDOW_KINDS:
            raise AccountError(f"window must be one of {', '.join(WINDOW_KINDS)}")

    async def create_account(
        self,
        account_id: str,
        plan: str,
        *,
        window: str = "",
        start: date | None = None,
        end: date | None = None,
    ) -> Account:
        """Create an account; AccountError if it exists."""
        self._check_id(account_id)
        self._check(plan, window)
        start = start or utc_date(self.clock())
        if end is not None and end <= start:
            raise AccountError("end must be after start")
        record = await self.db.create_account(account_id, plan, window, start, end)
        return self._required(record)

    async def update_account(
        self,
        account_id: str,
        *,
        plan: str | None = None,
        window: str | None = None,
        start: date | None = None,
        end: date | Keep | None = KEEP,
        thresholds: str | None = None,
    ) -> Account:
        """Change an account's plan, window kind ("" = plan default), period (`end=None`
        makes it open; leaving `end` out keeps it) or thresholds ("plan" = the plan's, ""
        = none, "80,100")."""
        self._check(plan, window)
        current = await self._require(account_id)
        changes: dict[str, Any] = {}
        if thresholds is not None:
            if thresholds == "plan":
                changes["thresholds"] = None
            else:
                try:
                    changes["thresholds"] = ",".join(map(str, parse_thresholds(thresholds)))
                except PlanError as exc:
                    raise AccountError(str(exc)) from None
        if plan is not None:
            changes["plan"] = plan
        if window is not None:
            changes["window_kind"] = window
        if start is not None:
            changes["start_date"] = start.isoformat()
        if not isinstance(end, Keep):
            changes["end_date"] = end.isoformat() if end is not None else None
        new_start = start or current.start
        new_end = current.end if isinstance(end, Keep) else end
        if new_end is not None and new_end <= new_start:
            raise AccountError("end must be after start")
        return self._required(await self.db.update_account(account_id, changes))

    def _required(self, record: AccountRecord) -> Account:
        account = self._account(record)
        if account is None:
            raise AccountError(f"account {record.id!r} has plan {record.plan!r}, not in the plans")
        return account

    async def _require(self, account_id: str) -> Account:
        self._check_id(account_id)
        account = await self.account(account_id)
        if account is None:
            raise AccountError(f"no account {account_id!r}")
        return account

    async def issue_token(
        self, account_id: str, label: str = "", expires: int | None = None
    ) -> tuple[str, TokenRecord]:
        """A new token for the account: (raw token, shown once; its listing entry). `expires`:
        epoch seconds from which the token is refused (401), None for never."""
        await self._require(account_id)
        now = int(self.clock())
        if expires is not None and expires <= now:
            raise AccountError("the expiry must be in the future")
        token = new_token()
        record = TokenRecord(
            "tok_" + secrets.token_hex(6),
            account_id,
            token_hash(token),
            now,
            label,
            expires=expires,
        )
        await self.db.insert_token(record)
        return token, record

    async def list_tokens(self, account_id: str) -> list[TokenRecord]:
        """The account's tokens, oldest first."""
        await self._require(account_id)
        return await self.db.tokens(account_id)

    async def list_accounts(self) -> list[Account]:
        """Every account (whose plan is known), by id."""
        return [a for a in map(self._account, await self.db.accounts()) if a is not None]

    async def suspend(self, account_id: str, suspended: bool) -> Account:
        """Suspend an account (its tokens are refused with 403) or resume it."""
        await self._require(account_id)
        value = int(self.clock()) if suspended else None
        return self._required(await self.db.update_account(account_id, {"suspended": value}))

    async def delete_account(self, account_id: str) -> None:
        """Delete an account and its tokens (its usage counters expire in Redis by themselves)."""
        self._check_id(account_id)
        await self.db.delete_account(account_id)

    async def revoke_token(self, account_id: str, token_id: str) -> TokenRecord:
        """Revoke one token by id: the next request with it gets 401."""
        await self._require(account_id)
        return await self.db.revoke_token(account_id, token_id)
