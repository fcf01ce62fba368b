"""Settings of the usage sidecar: one frozen value built from `USAGE_*` variables.

This is the only module of the sidecar that reads `os.environ`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from sidecars.common.clients import parse_networks

USAGE_PATH = "/api/v2/user/usage"


class SettingsError(ValueError):
    """A `USAGE_*` variable has a value that cannot be used."""


def _check_dsn(dsn: str) -> None:
    """Refuse a DSN libpq cannot parse now, not at the first request."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(dsn)
    except ProgrammingError as exc:
        raise SettingsError(f"USAGE_POSTGRES_DSN is not a PostgreSQL DSN: {exc}") from None


@dataclass(frozen=True, slots=True)
class Settings:
    """How the usage sidecar runs; see the settings table in sidecars/usage/README.md."""

    host: str = "127.0.0.1"
    port: int = 8090
    workers: int = 2
    log_level: str = "info"
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
    quota_exempt_paths: tuple[str, ...] = (USAGE_PATH,)
    exempt_paths: tuple[str, ...] = ("/health", "/openapi.json")

    @property
    def usage_path(self) -> str:
        """Where the usage endpoint is served."""
        return self.base_path + USAGE_PATH

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build the settings from `USAGE_*` variables (unset or empty: the default)."""
        env = os.environ if environ is None else environ
        d = cls()

        def text(name: str, default: str) -> str:
            value = env.get("USAGE_" + name, "").strip()
            return value or default

        def number(name: str, default: float, lo: float = 0.0) -> float:
            raw = env.get("USAGE_" + name, "").strip()
            if not raw:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise SettingsError(f"USAGE_{name}={raw!r} is not a number") from None
            if not value >= lo:
                raise SettingsError(f"USAGE_{name}={raw!r} must be at least {lo:g}")
            return value

        def paths(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
            # Set but empty means "none", unlike the other variables: it switches exemption off.
            if "USAGE_" + name not in env:
                return default
            return tuple(p.strip() for p in env["USAGE_" + name].split(",") if p.strip())

        base_path = text("BASE_PATH", "").rstrip("/")
        if base_path and not base_path.startswith("/"):
            raise SettingsError(f"USAGE_BASE_PATH={base_path!r} must start with '/'")
        failure_mode = text("RATELIMIT_FAILURE_MODE", d.ratelimit_failure_mode).lower()
        if failure_mode not in ("allow", "deny"):
            raise SettingsError(
                f"USAGE_RATELIMIT_FAILURE_MODE={failure_mode!r} (accepted: allow, deny)"
            )
        counter_mode = text("COUNTER_FAILURE_MODE", d.counter_failure_mode).lower()
        if counter_mode not in ("allow", "deny"):
            raise SettingsError(
                f"USAGE_COUNTER_FAILURE_MODE={counter_mode!r} (accepted: allow, deny)"
            )
        proxies = paths("TRUSTED_PROXIES", ())
        try:
            parse_networks(proxies)
        except ValueError as exc:
            raise SettingsError(f"USAGE_TRUSTED_PROXIES: {exc}") from None
        redis_url = text("REDIS_URL", d.redis_url)
        if "://" not in redis_url:
            # ratelimitd's REDIS_URL form (host:port) is accepted as it is.
            redis_url = "redis://" + redis_url

        def flag(name: str, default: bool) -> bool:
            value = text(name, "true" if default else "false").lower()
            if value not in ("true", "false", "1", "0"):
                raise SettingsError(f"USAGE_{name}={value!r} (accepted: true, false)")
            return value in ("true", "1")

        if env.get("USAGE_QUOTA_REFRESH_SECONDS", "").strip():
            # Removed, not ignored: quotas are exact now, read and counted on every request.
            raise SettingsError(
                "USAGE_QUOTA_REFRESH_SECONDS is no longer used: quotas are checked and counted "
                "atomically in Redis on every request; unset it"
            )
        sqlite_path = text("SQLITE_PATH", "")
        postgres_dsn = text("POSTGRES_DSN", "")
        if sqlite_path and postgres_dsn:
            # One system of record: a second one named but unused would be ignored silently.
            raise SettingsError("USAGE_SQLITE_PATH and USAGE_POSTGRES_DSN are exclusive; set one")
        if postgres_dsn:
            _check_dsn(postgres_dsn)
        # The ratelimitd address may be empty: the app then authenticates but asks no one.
        ratelimit_address = env.get("USAGE_RATELIMIT_ADDRESS", d.ratelimit_address).strip()
        return cls(
            host=text("HOST", d.host),
            port=int(number("PORT", d.port)),
            workers=int(number("WORKERS", d.workers, lo=1)),
            log_level=text("LOG_LEVEL", d.log_level).lower(),
            base_path=base_path,
            redis_url=redis_url,
            redis_timeout_seconds=number("REDIS_TIMEOUT_SECONDS", d.redis_timeout_seconds, 0.001),
            redis_pool_size=int(number("REDIS_POOL_SIZE", d.redis_pool_size, lo=1)),
            sqlite_path=sqlite_path or d.sqlite_path,
            postgres_dsn=postgres_dsn,
            database_timeout_seconds=number(
                "DATABASE_TIMEOUT_SECONDS", d.database_timeout_seconds, 0.001
            ),
            database_pool_size=int(number("DATABASE_POOL_SIZE", d.database_pool_size, lo=1)),
            key_prefix=env.get("USAGE_KEY_PREFIX", d.key_prefix),
            cache_key_prefix=env.get("USAGE_CACHE_KEY_PREFIX", d.cache_key_prefix),
            meter_domain=text("METER_DOMAIN", d.meter_domain),
            meter_key=text("METER_KEY", d.meter_key),
            plans_file=text("PLANS_FILE", d.plans_file),
            retry_after_seconds=int(number("RETRY_AFTER_SECONDS", d.retry_after_seconds, lo=1)),
            rate_limit=flag("RATE_LIMIT", True),
            count_error_responses=flag("COUNT_ERROR_RESPONSES", d.count_error_responses),
            counter_failure_mode=counter_mode,
            trusted_proxies=proxies,
            invalid_token_limit=int(number("INVALID_TOKEN_LIMIT", d.invalid_token_limit, lo=1)),
            invalid_token_window_seconds=int(
                number("INVALID_TOKEN_WINDOW_SECONDS", d.invalid_token_window_seconds, lo=1)
            ),
            max_header_bytes=int(number("MAX_HEADER_BYTES", d.max_header_bytes, lo=1024)),
            max_headers=int(number("MAX_HEADERS", d.max_headers, lo=8)),
            counter_buffer_hits=int(number("COUNTER_BUFFER_HITS", d.counter_buffer_hits)),
            ratelimit_address=ratelimit_address,
            ratelimit_domain=text("RATELIMIT_DOMAIN", d.ratelimit_domain),
            ratelimit_timeout_seconds=number(
                "RATELIMIT_TIMEOUT_SECONDS", d.ratelimit_timeout_seconds, 0.001
            ),
            ratelimit_failure_mode=failure_mode,
            quota_exempt_paths=paths("QUOTA_EXEMPT_PATHS", (base_path + USAGE_PATH,)),
            exempt_paths=paths("EXEMPT_PATHS", d.exempt_paths),
        )
