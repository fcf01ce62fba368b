"""The decision core as the tests drive it: `ratelimitd.core.build_core` (the daemon's own
factory) with shorthand for loading configs, deciding and reading a statistic.

Also what the tests/core modules split by subject share: the matcher twins
(test_match*.py), the ShouldRateLimit configs, clock and shorthand (test_service*.py) and
config loading from YAML texts (test_config_*.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ratelimitd.backends.base import Capabilities, PassThrough
from ratelimitd.backends.memory import MemoryBackend, stored, unpack
from ratelimitd.config import ConfigError, ConfigFile, RuleSet, load_ruleset
from ratelimitd.core import Core, build_core
from ratelimitd.messages import Descriptor, Request, Response
from ratelimitd.settings import CacheSettings, ReloadOptions, Settings
from ratelimitd.stats import RULE_STATS

from .clock import Clock
from .process import REPO

# Copies of the reference service's own test configs (see tests/configs/README.md).
CONFIGS = REPO / "tests" / "configs"
# This project's own test and bench configs, named after their users (same README).
SUITE_CONFIGS = CONFIGS / "suites"

Config = str | Path | ConfigFile


def config_files(configs: Iterable[Config]) -> list[ConfigFile]:
    """ConfigFiles from YAML texts (named config.<i>.yaml), paths or ConfigFiles."""
    files = []
    for i, c in enumerate(configs):
        if isinstance(c, ConfigFile):
            files.append(c)
        elif isinstance(c, Path):
            files.append(ConfigFile(str(c), c.read_text()))
        else:
            files.append(ConfigFile(f"config.{i}.yaml", c))
    return files


def single_rule(domain: str, unit: str, requests_per_unit: int, key: str = "k") -> str:
    """The YAML of a config of one rule: `key` (any value) limited per `unit`."""
    limit = f"{{unit: {unit}, requests_per_unit: {requests_per_unit}}}"
    return f"domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {limit}\n"


def suite_config(name: str) -> str:
    """The YAML text of tests/configs/suites/<name>.yaml."""
    return (SUITE_CONFIGS / f"{name}.yaml").read_text()


class Decider:
    """A built core: `decide(domain, [(k, v), ...], ...)`, `stat(name)`, and its parts."""

    def __init__(self, core: Core, clock: Callable[[], float]) -> None:
        self.core = core
        self.clock = clock
        self.ruleset: RuleSet | None = None

    def __getattr__(self, name: str) -> Any:
        # The core's parts (settings, stats, health, backend, local_cache, limiter,
        # service), until a test sets its own.
        return getattr(self.core, name)

    def load(self, *configs: Config, merge_domains: bool = False) -> RuleSet:
        """Put configs in force (see `config_files`); the RuleSet. Raises ConfigError."""
        self.ruleset = self.core.load(config_files(configs), merge_domains=merge_domains)
        return self.ruleset

    async def decide(self, domain: str, *descriptors: object, hits_addend: int = 0) -> Response:
        """Decide a request; each descriptor is a list of (key, value) pairs or a Descriptor."""
        ds = [d if isinstance(d, Descriptor) else Descriptor(tuple(d)) for d in descriptors]  # type: ignore[call-overload]
        return await self.service.should_rate_limit(Request(domain, ds, hits_addend))

    def stat(self, name: str) -> float:
        """One statistic by full name (0 when never created)."""
        return self.stats.snapshot().get(name, 0)

    def rule_stats(self, key: str) -> dict[str, float]:
        """The six per-rule counters (total_hits, over_limit, ...) of stats key `key`
        (`domain.key_value`): {name: value}."""
        snapshot = self.stats.snapshot()
        return {n: snapshot.get(f"ratelimit.service.rate_limit.{key}.{n}", 0) for n in RULE_STATS}


def rule_counts(
    total: int = 0, over: int = 0, near: int = 0, within: int = 0, olwlc: int = 0, shadow: int = 0
) -> dict[str, float]:
    """What `Decider.rule_stats` is expected to return: the six per-rule counters, zero
    unless given."""
    return {
        "total_hits": total,
        "over_limit": over,
        "near_limit": near,
        "within_limit": within,
        "over_limit_with_local_cache": olwlc,
        "shadow_mode": shadow,
    }


class StoreDouble(PassThrough):
    """A counter store a test writes: the awaited Backend contract (not a SyncBackend), every
    call going to a memory store at a fixed clock unless the test overrides it."""

    name = "double"
    capabilities = Capabilities()  # the defaults: fixed windows, raises, waits

    def __init__(self) -> None:
        super().__init__(MemoryBackend(clock=lambda: 1_000_000.0))


def preset(decider: Decider, key: str, value: int, ttl: int = 3600) -> None:
    """Set a counter of the memory backend as if earlier requests had counted it."""
    now = int(decider.clock.now)  # type: ignore[attr-defined]  # a support.clock.Clock
    decider.backend._counters[key] = stored(value, now + ttl)  # type: ignore[attr-defined]


def counter(decider: Decider, key: str) -> int | None:
    """A counter of the memory backend; None when it does not exist."""
    entry = decider.backend._counters.get(key)  # type: ignore[attr-defined]
    return None if entry is None else unpack(entry)[0]  # type: ignore[no-any-return]


def memory_decider(
    *configs: Config,
    options: ReloadOptions | None = None,
    near_limit_ratio: float = 0.8,
    cache_key_prefix: str = "",
    local_cache_bytes: int = 0,
    stop_increment: bool = False,
    merge_domains: bool = False,
    now: float = 1_000_000.0,
    impl: str | None = None,
) -> Decider:
    """A core on the memory backend (no expiry jitter) with a settable Clock at `now`."""
    settings = Settings(
        cache=CacheSettings(
            backend="memory",
            expiration_jitter_max_seconds=0,
            local_cache_size_in_bytes=local_cache_bytes,
            near_limit_ratio=near_limit_ratio,
            cache_key_prefix=cache_key_prefix,
            stop_cache_key_increment_when_overlimit=stop_increment,
        ),
        reload=options or ReloadOptions(),
    )
    clock = Clock(now)
    decider = Decider(build_core(settings, clock=clock, impl=impl), clock)
    decider.load(*configs, merge_domains=merge_domains)
    return decider


# RateLimitUnit numbers.
SECOND, MINUTE, HOUR, DAY = 1, 2, 3, 4


# --- descriptor matching on both twins (tests/core/test_match*.py) ---------------------------

MATCH_IMPLEMENTATIONS = ["ratelimitd.config._match", "ratelimitd.config._match_py"]


def ruleset_of(name_or_text: str) -> RuleSet:
    """A RuleSet from a tests/configs file name, or from inline YAML."""
    if name_or_text.endswith(".yaml"):
        return load_ruleset([ConfigFile(name_or_text, (CONFIGS / name_or_text).read_text())])
    return load_ruleset([ConfigFile("inline.yaml", name_or_text)])


class Matcher:
    """One RuleSet compiled by one implementation."""

    def __init__(self, impl: ModuleType, ruleset: RuleSet) -> None:
        self.impl = impl
        self.ruleset = ruleset
        self.roots = {d: impl.compile_level(specs) for d, specs in ruleset.specs.items()}

    def __call__(self, domain: str, *entries: tuple[str, str]) -> Any:
        return self.impl.lookup(self.roots[domain], domain, tuple(entries))

    def rule(self, domain: str, *entries: tuple[str, str]) -> Any:
        found = self(domain, *entries)
        assert found is not None, f"no limit for {entries}"
        return found[0]

    def key(self, domain: str, *entries: tuple[str, str]) -> str:
        found = self(domain, *entries)
        assert found is not None, f"no limit for {entries}"
        return found[1]


# --- ShouldRateLimit on the memory backend (tests/core/test_service*.py) ----------------------

# d: foo 10/min (named foo_limit), bar 5/min, second 10/s, hour 3/h, shadow 1/min in shadow
# mode, quota and quota2 1/min in quota mode, unl unlimited, free without a limit.
SERVICE_CONFIG = suite_config("core_service")
# m: all 1/min with metadata: one and two (nested maps and lists that overlap), three, sh in
# shadow mode, unl unlimited, det detailed_metric, named (N) replaced by replacer.
SERVICE_METADATA = suite_config("core_service_metadata")
SERVICE_NOW = 2222  # the reference service tests' clock: MINUTE reset header = 58


def exhaust(h: Any, domain: str, key: str, value: str, seconds: int, count: int) -> None:
    """Preset a counter so the next hit on (key, value) sees `count` + hits."""
    window = int(h.clock.now) // seconds * seconds
    h.backend._counters[f"{domain}_{key}_{value}_{window}"] = stored(
        count, int(h.clock.now) + seconds
    )


def brief(st: Any) -> tuple:
    """A descriptor status as (code, its rule's requests_per_unit or None, limit_remaining)."""
    return (st.code, st.rule.requests_per_unit if st.rule is not None else None, st.limit_remaining)


# --- config loading and its errors (tests/core/test_config_*.py) ------------------------------


def load_text(*texts: str, merge: bool = False) -> RuleSet:
    """Load YAML texts named a.yaml, b.yaml, ... in order."""
    files = [ConfigFile(f"{chr(ord('a') + i)}.yaml", t) for i, t in enumerate(texts)]
    return load_ruleset(files, merge_domains=merge)


def error_of(*texts: str, merge: bool = False) -> str:
    """The text of the ConfigError that loading these texts (as `load_text`) raises."""
    with pytest.raises(ConfigError) as info:
        load_text(*texts, merge=merge)
    return str(info.value)


def one_rule(unit_block: str) -> str:
    """Domain d, one descriptor k, rate_limit `unit_block` (its lines indented six spaces)."""
    return f"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{unit_block}"
