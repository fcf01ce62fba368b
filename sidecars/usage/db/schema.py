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
# The columns of webhook_events as migration 3 made them: migration 4 rebuilds the table with
# the same definitions plus its own and copies these columns over.
_EVENTS_V3_DEFINITIONS = """\
            id TEXT PRIMARY KEY,
            account_id TEXT NOT NULL,
            threshold INTEGER NOT NULL,
            window_start BIGINT NOT NULL,
            created_ms BIGINT NOT NULL,
            payload TEXT NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_ms BIGINT NOT NULL,
            lease_until_ms BIGINT NOT NULL DEFAULT 0,
            give_up_ms BIGINT NOT NULL,
            delivered_ms BIGINT,
"""

_EVENTS_V3 = (
    "id, account_id, threshold, window_start, created_ms, payload, status, attempts, "
    "next_attempt_ms, lease_until_ms, give_up_ms, delivered_ms"
)


def _attempts_table(name: str, events: str) -> str:
    """The delivery attempts of `events`' rows (migration 3's, and migration 4's rebuild)."""
    return f"""CREATE TABLE {name} (
            event_id TEXT NOT NULL REFERENCES {events} (id) ON DELETE CASCADE,
            attempt INTEGER NOT NULL,
            at_ms BIGINT NOT NULL,
            duration_ms BIGINT NOT NULL,
            status_code INTEGER,
            error TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (event_id, attempt)
        )"""


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
    # 3: durable daily usage rolled up from Redis, threshold notifications and their delivery
    # attempts, per-account thresholds (NULL = the plan's, '' = none, else "80,100").
    (
        "ALTER TABLE accounts ADD COLUMN thresholds TEXT",
        # One row per account and UTC day, usage as counted in Redis, plan and quota that day.
        # No foreign key: a deleted account's history stays until retention drops it.
        """CREATE TABLE daily_usage (
            account_id TEXT NOT NULL,
            day TEXT NOT NULL,
            usage BIGINT NOT NULL,
            plan TEXT NOT NULL,
            plan_limit BIGINT NOT NULL,
            updated BIGINT NOT NULL,
            PRIMARY KEY (account_id, day)
        )""",
        "CREATE INDEX daily_usage_day ON daily_usage (day, account_id)",
        # Named watermarks: `closed_through` = the last UTC day rolled up after it ended.
        """CREATE TABLE rollup_state (
            name TEXT PRIMARY KEY,
            value TEXT NOT NULL
        )""",
        # One row per threshold crossed per window: the unique key is what makes the event
        # exactly one across workers and processes. Scheduling instants are epoch ms.
        f"""CREATE TABLE webhook_events (
{_EVENTS_V3_DEFINITIONS}            UNIQUE (account_id, threshold, window_start)
        )""",
        "CREATE INDEX webhook_events_due ON webhook_events (status, next_attempt_ms)",
        _attempts_table("webhook_attempts", "webhook_events"),
    ),
    # 4: metered events (CloudEvents: one row per `source` + `id`, so a replay changes
    # nothing) and the ids of deleted accounts (never given to a new account: its Redis
    # counters, history and events would be the old owner's).
    (
        """CREATE TABLE usage_events (
            source TEXT NOT NULL,
            id TEXT NOT NULL,
            account_id TEXT NOT NULL,
            type TEXT NOT NULL,
            time_ms BIGINT NOT NULL,
            data TEXT NOT NULL,
            received_ms BIGINT NOT NULL,
            cancelled_ms BIGINT,
            PRIMARY KEY (source, id)
        )""",
        "CREATE INDEX usage_events_account ON usage_events (account_id, type, time_ms)",
        """CREATE TABLE deleted_accounts (
            id TEXT PRIMARY KEY,
            deleted BIGINT NOT NULL
        )""",
        # Accounts deleted before this table existed, as far as their history tells.
        "INSERT INTO deleted_accounts (id, deleted) SELECT DISTINCT account_id, 0 "
        "FROM daily_usage WHERE account_id NOT IN (SELECT id FROM accounts)",
        # Thresholds of event meters: which marks the meter's value reaches now in a window
        # (`crossed`, recomputed when an event is cancelled) and how often it got there.
        """CREATE TABLE meter_thresholds (
            account_id TEXT NOT NULL,
            meter TEXT NOT NULL,
            window_start BIGINT NOT NULL,
            threshold INTEGER NOT NULL,
            crossed INTEGER NOT NULL,
            crossings INTEGER NOT NULL,
            PRIMARY KEY (account_id, meter, window_start, threshold)
        )""",
        # Threshold events of any meter: the unique key gains the meter ('' = the counted
        # requests) and the crossing's number (a meter's value can drop under a mark when an
        # event is cancelled and reach it again). Rebuilt, as SQLite cannot change a key.
        f"""CREATE TABLE webhook_events_v4 (
{_EVENTS_V3_DEFINITIONS}            meter TEXT NOT NULL DEFAULT '',
            crossing INTEGER NOT NULL DEFAULT 1,
            UNIQUE (account_id, meter, threshold, window_start, crossing)
        )""",
        f"INSERT INTO webhook_events_v4 ({_EVENTS_V3}) SELECT {_EVENTS_V3} FROM webhook_events",
        _attempts_table("webhook_attempts_v4", "webhook_events_v4"),
        "INSERT INTO webhook_attempts_v4 SELECT * FROM webhook_attempts",
        "DROP TABLE webhook_attempts",
        "DROP TABLE webhook_events",
        # SQLite renames the attempts' reference along with the table; PostgreSQL's is by oid.
        "ALTER TABLE webhook_events_v4 RENAME TO webhook_events",
        "ALTER TABLE webhook_attempts_v4 RENAME TO webhook_attempts",
        "CREATE INDEX webhook_events_due ON webhook_events (status, next_attempt_ms)",
    ),
)

LATEST = len(MIGRATIONS)
