"""The account database's schema as numbered migrations, in SQL both SQLite and PostgreSQL run.

`schema_version` holds one row, the version applied last; opening a database applies every
later migration in order, each in one transaction with the version bump (so a crash leaves
the previous version, never half of one). A migration is never edited once released: a
change is a new one appended here.

Column names avoid SQL keywords (`window`, `end`); dates are ISO 8601 text (UTC calendar
days), instants are epoch seconds.
"""

from __future__ import annotations

VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: accounts (plan assignment and subscription period) and their bearer tokens.
    (
        """CREATE TABLE accounts (
            id TEXT PRIMARY KEY,
            plan TEXT NOT NULL,
            window_kind TEXT NOT NULL DEFAULT '',
            start_date TEXT NOT NULL,
            end_date TEXT,
            created BIGINT NOT NULL,
            updated BIGINT NOT NULL
        )""",
        """CREATE TABLE tokens (
            id TEXT PRIMARY KEY,
            account_id TEXT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
            sha256 TEXT NOT NULL UNIQUE,
            label TEXT NOT NULL DEFAULT '',
            created BIGINT NOT NULL,
            revoked BIGINT
        )""",
        "CREATE INDEX tokens_account ON tokens (account_id)",
    ),
    # 2: suspension (refused with 403 until resumed), token expiry and last use.
    (
        "ALTER TABLE accounts ADD COLUMN suspended BIGINT",
        "ALTER TABLE tokens ADD COLUMN expires BIGINT",
        "ALTER TABLE tokens ADD COLUMN last_used BIGINT",
    ),
)

LATEST = len(MIGRATIONS)
