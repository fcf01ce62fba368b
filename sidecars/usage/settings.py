"""Settings of the usage sidecar: one frozen value built from `USAGE_*` variables.

This is the only module of the sidecar that reads its environment (through the sidecars' one
reader, `sidecars.common.environment`). The command line's global options are overrides of
the variables of the same name: `Settings.from_env(overrides=...)` reads the environment with
them applied, and `environment(overrides)` is the environment `serve` hands to gunicorn's
workers, so the CLI never reads or writes `os.environ` itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from sidecars.common.clients import parse_networks
from sidecars.common.environment import Environment, SettingsError
from sidecars.common.server import Server

USAGE_PATH = "/api/v2/user/usage"
HISTORY_PATH = USAGE_PATH + "/history"
METERS_PATH = USAGE_PATH + "/meters"
EVENTS_PATH = "/api/v2/usage/events"
CANCEL_PATH = EVENTS_PATH + "/cancel"
PAGE_PATH = "/account/usage"
MODES = ("allow", "deny")
# The two databases: naming one on the command line replaces the environment's other one.
_DATABASES = ("USAGE_SQLITE_PATH", "USAGE_POSTGRES_DSN")
# Tuning of deliveries: meaningless without a receiver, so refused without USAGE_WEBHOOK_URL.
_WEBHOOK_TUNING = ("SECRET", "TIMEOUT_SECONDS", "RETRY_SECONDS", "RETRY_FOR_SECONDS")
# Reading ratelimitd's settle outbox: meaningless without USAGE_BUDGET_STREAM.
_BUDGET_TUNING = ("REDIS_URL", "ACCOUNT_KEY", "MODEL_KEY")


def environment(
    overrides: Mapping[str, str], base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """`base` (the process environment by default) with the command line's `USAGE_*`
    overrides applied: what the CLI's settings are built from and what `serve` hands to
    gunicorn's workers.

    An override naming one database drops the other one from the environment; both given as
    overrides stay both, and are refused as the server refuses them.
    """
    env = dict(os.environ if base is None else base)
    named = [name for name in _DATABASES if name in overrides]
    if len(named) == 1:
        for other in _DATABASES:
            env.pop(other, None)
    env.update(overrides)
    return env


def _check_webhook_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"USAGE_WEBHOOK_URL={url!r} must be an http:// or https:// URL")


def _check_dsn(dsn: str) -> None:
    """Refuse a DSN libpq cannot parse now, not at the first request."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(dsn)
    except ProgrammingError as exc:
        raise SettingsError(f"USAGE_POSTGRES_DSN is not a PostgreSQL DSN: {exc}") from None


class _Route:
    """A route's path under the settings' `base_path` (a read-only attribute)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __get__(self, settings: Settings, owner: type | None = None) -> str:
        return settings.base_path + self.path


@dataclass(frozen=True, slots=True)
class Settings(Server):
    """How the usage sidecar runs; see the settings table in sidecars/usage/README.md."""

    port: int = 8090
    base_path: str = ""
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_timeout_seconds: float = 0.5
    redis_pool_size: int = 32
    sqlite_path: str = "usage.sqlite3"
    postgres_dsn: str = ""
    database_timeout_seconds: float = 2.0
    database_pool_size: int = 4
    key_prefix: str = "usage:"
    cache_key_prefix: str = ""
    meter_domain: str = "api"
    meter_key: str = "account"
    plans_file: str = ""
    retry_after_seconds: int = 5
    rate_limit: bool = True
    ratelimit_address: str = "127.0.0.1:8081"
    ratelimit_domain: str = "api"
    ratelimit_timeout_seconds: float = 0.25
    ratelimit_failure_mode: str = "allow"
    count_error_responses: bool = False
    counter_failure_mode: str = "allow"
    trusted_proxies: tuple[str, ...] = ()
    invalid_token_limit: int = 20
    invalid_token_window_seconds: int = 60
    max_header_bytes: int = 8192
    max_headers: int = 64
    counter_buffer_hits: int = 10_000
    quota_exempt_paths: tuple[str, ...] = (USAGE_PATH, HISTORY_PATH, PAGE_PATH)
    exempt_paths: tuple[str, ...] = ("/health", "/openapi.json")
    rollup_interval_seconds: float = 60.0
    retention_days: int = 400
    webhook_url: str = ""
    webhook_secret: str = ""
    webhook_timeout_seconds: float = 5.0
    webhook_retry_seconds: float = 10.0
    webhook_retry_for_seconds: float = 86400.0
    idempotency_window_seconds: int = 86400
    idempotency_max_keys: int = 10_000
    ingest_token: str = ""
    meters_file: str = ""
    event_max_age_days: int = 35
    budget_stream: str = ""
    budget_redis_url: str = ""
    budget_account_key: str = "user"
    budget_model_key: str = "model"
    idempotency_max_answer_bytes: int = 16384

    # Where each route is served, under `base_path`.
    usage_path = _Route(USAGE_PATH)  # the usage endpoint
    history_path = _Route(HISTORY_PATH)  # the daily usage history
    meters_path = _Route(METERS_PATH)  # the meters listed (and each queried, under it)
    events_path = _Route(EVENTS_PATH)  # metered events ingested (the operator's route)
    cancel_path = _Route(CANCEL_PATH)  # a metered event cancelled
    page_path = _Route(PAGE_PATH)  # the account's usage page

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        overrides: Mapping[str, str] | None = None,
    ) -> Settings:
        """Build the settings from `USAGE_*` variables (unset or empty: the default), with
        the command line's `overrides` (variable name -> value) applied over them."""
        if overrides:
            environ = environment(overrides, environ)
        env = Environment(environ, "USAGE_")
        d = cls()
        base_path = env.text("BASE_PATH", "").rstrip("/")
        if base_path and not base_path.startswith("/"):
            raise SettingsError(f"USAGE_BASE_PATH={base_path!r} must start with '/'")
        failure_mode = env.choice("RATELIMIT_FAILURE_MODE", d.ratelimit_failure_mode, MODES)
        counter_mode = env.choice("COUNTER_FAILURE_MODE", d.counter_failure_mode, MODES)
        # Set but empty means "none", unlike most variables: it switches the list off.
        proxies = env.names("TRUSTED_PROXIES", ())
        try:
            parse_networks(proxies)
        except ValueError as exc:
            raise SettingsError(f"USAGE_TRUSTED_PROXIES: {exc}") from None
        redis_url = env.text("REDIS_URL", d.redis_url)
        if "://" not in redis_url:
            # ratelimitd's REDIS_URL form (host:port) is accepted as it is.
            redis_url = "redis://" + redis_url
        if env.is_set("QUOTA_REFRESH_SECONDS"):
            # Removed, not ignored: quotas are exact now, read and counted on every request.
            raise SettingsError(
                "USAGE_QUOTA_REFRESH_SECONDS is no longer used: quotas are checked and counted "
                "atomically in Redis on every request; unset it"
            )
        sqlite_path = env.text("SQLITE_PATH", "")
        postgres_dsn = env.text("POSTGRES_DSN", "")
        if sqlite_path and postgres_dsn:
            # One system of record: a second one named but unused would be ignored silently.
            raise SettingsError("USAGE_SQLITE_PATH and USAGE_POSTGRES_DSN are exclusive; set one")
        if postgres_dsn:
            _check_dsn(postgres_dsn)
        # The ratelimitd address may be empty: the app then authenticates but asks no one.
        ratelimit_address = env.raw("RATELIMIT_ADDRESS", d.ratelimit_address).strip()
        webhook_url = env.text("WEBHOOK_URL", "")
        webhook_secret = env.raw("WEBHOOK_SECRET", "")
        if webhook_url:
            _check_webhook_url(webhook_url)
            # The receiver's only proof that an event is ours: a guessable key proves nothing.
            # Two secrets (separated by spaces) sign with both while receivers move over.
            secrets = webhook_secret.split()
            if not secrets or len(secrets) > 2 or min(map(len, secrets)) < 16:
                raise SettingsError(
                    "USAGE_WEBHOOK_SECRET must be set to a secret of at least 16 characters "
                    "(or two separated by a space, during a rotation) when USAGE_WEBHOOK_URL "
                    "is (it signs every event)"
                )
        else:
            _refuse_tuning(
                env, "WEBHOOK_", _WEBHOOK_TUNING, "WEBHOOK_URL", "threshold webhooks are off", "URL"
            )
        ingest_token = env.raw("INGEST_TOKEN", "")
        if ingest_token and len(ingest_token) < 16:
            # It is the only proof of an ingestion's origin: a guessable one proves nothing.
            raise SettingsError("USAGE_INGEST_TOKEN must be at least 16 characters")
        retention_days = env.integer("RETENTION_DAYS", d.retention_days, lo=1)
        # Unset: 35 days (Stripe's), or less when the retention is shorter.
        max_age = env.integer(
            "EVENT_MAX_AGE_DAYS", min(d.event_max_age_days, retention_days - 1), lo=0
        )
        if max_age >= retention_days:
            # De-duplication holds as long as the events are kept: an event older than the
            # retention would be purged, and its replay counted again.
            raise SettingsError(
                f"USAGE_EVENT_MAX_AGE_DAYS={max_age} must be less than "
                f"USAGE_RETENTION_DAYS={retention_days}"
            )
        budget_stream = env.text("BUDGET_STREAM", "")
        if not budget_stream:
            # Where and how to read the daemon's settles mean nothing without the stream.
            _refuse_tuning(
                env,
                "BUDGET_",
                _BUDGET_TUNING,
                "BUDGET_STREAM",
                "the token budget feed is off",
                "stream",
            )
        budget_redis_url = env.text("BUDGET_REDIS_URL", "")
        if budget_redis_url and "://" not in budget_redis_url:
            budget_redis_url = "redis://" + budget_redis_url
        return cls(
            host=env.text("HOST", d.host),
            port=env.integer("PORT", d.port),
            workers=env.integer("WORKERS", d.workers, lo=1),
            log_level=env.text("LOG_LEVEL", d.log_level).lower(),
            base_path=base_path,
            redis_url=redis_url,
            redis_timeout_seconds=env.number(
                "REDIS_TIMEOUT_SECONDS", d.redis_timeout_seconds, 0.001
            ),
            redis_pool_size=env.integer("REDIS_POOL_SIZE", d.redis_pool_size, lo=1),
            sqlite_path=sqlite_path or d.sqlite_path,
            postgres_dsn=postgres_dsn,
            database_timeout_seconds=env.number(
                "DATABASE_TIMEOUT_SECONDS", d.database_timeout_seconds, 0.001
            ),
            database_pool_size=env.integer("DATABASE_POOL_SIZE", d.database_pool_size, lo=1),
            key_prefix=env.raw("KEY_PREFIX", d.key_prefix),
            cache_key_prefix=env.raw("CACHE_KEY_PREFIX", d.cache_key_prefix),
            meter_domain=env.text("METER_DOMAIN", d.meter_domain),
            meter_key=env.text("METER_KEY", d.meter_key),
            plans_file=env.text("PLANS_FILE", d.plans_file),
            retry_after_seconds=env.integer("RETRY_AFTER_SECONDS", d.retry_after_seconds, lo=1),
            rate_limit=env.flag("RATE_LIMIT", True),
            count_error_responses=env.flag("COUNT_ERROR_RESPONSES", d.count_error_responses),
            counter_failure_mode=counter_mode,
            trusted_proxies=proxies,
            invalid_token_limit=env.integer("INVALID_TOKEN_LIMIT", d.invalid_token_limit, lo=1),
            invalid_token_window_seconds=env.integer(
                "INVALID_TOKEN_WINDOW_SECONDS", d.invalid_token_window_seconds, lo=1
            ),
            max_header_bytes=env.integer("MAX_HEADER_BYTES", d.max_header_bytes, lo=1024),
            max_headers=env.integer("MAX_HEADERS", d.max_headers, lo=8),
            counter_buffer_hits=env.integer("COUNTER_BUFFER_HITS", d.counter_buffer_hits),
            ratelimit_address=ratelimit_address,
            ratelimit_domain=env.text("RATELIMIT_DOMAIN", d.ratelimit_domain),
            ratelimit_timeout_seconds=env.number(
                "RATELIMIT_TIMEOUT_SECONDS", d.ratelimit_timeout_seconds, 0.001
            ),
            ratelimit_failure_mode=failure_mode,
            quota_exempt_paths=env.names(
                "QUOTA_EXEMPT_PATHS",
                (base_path + USAGE_PATH, base_path + HISTORY_PATH, base_path + PAGE_PATH),
            ),
            exempt_paths=env.names("EXEMPT_PATHS", d.exempt_paths),
            rollup_interval_seconds=env.number(
                "ROLLUP_INTERVAL_SECONDS", d.rollup_interval_seconds
            ),
            retention_days=retention_days,
            webhook_url=webhook_url,
            webhook_secret=webhook_secret,
            webhook_timeout_seconds=env.number(
                "WEBHOOK_TIMEOUT_SECONDS", d.webhook_timeout_seconds, 0.001
            ),
            webhook_retry_seconds=env.number(
                "WEBHOOK_RETRY_SECONDS", d.webhook_retry_seconds, 0.001
            ),
            webhook_retry_for_seconds=env.number(
                "WEBHOOK_RETRY_FOR_SECONDS", d.webhook_retry_for_seconds
            ),
            idempotency_window_seconds=env.integer(
                "IDEMPOTENCY_WINDOW_SECONDS", d.idempotency_window_seconds
            ),
            idempotency_max_keys=env.integer("IDEMPOTENCY_MAX_KEYS", d.idempotency_max_keys, 1),
            ingest_token=ingest_token,
            meters_file=env.text("METERS_FILE", d.meters_file),
            event_max_age_days=max_age,
            budget_stream=budget_stream,
            budget_redis_url=budget_redis_url,
            budget_account_key=env.text("BUDGET_ACCOUNT_KEY", d.budget_account_key),
            budget_model_key=env.text("BUDGET_MODEL_KEY", d.budget_model_key),
            idempotency_max_answer_bytes=env.integer(
                "IDEMPOTENCY_MAX_ANSWER_BYTES", d.idempotency_max_answer_bytes, 0
            ),
        )


def _refuse_tuning(
    env: Environment, prefix: str, names: tuple[str, ...], switch: str, off: str, what: str
) -> None:
    """Refuse a feature's tuning (`prefix` + one of `names`) set while its `switch` is not: it
    would be accepted and do nothing."""
    unused = [n for n in names if env.is_set(prefix + n)]
    if unused:
        raise SettingsError(
            f"USAGE_{prefix}{unused[0]} is set but USAGE_{switch} is not: {off}; "
            f"set the {what} or unset it"
        )
