"""Decision-core benchmarks: groups `match`, `keys`, `decision`; compiled vs pure side by side.

Run with `make bench` (CPU time via time.process_time). Each group is measured at 10,
1 000 and 100 000 rules in one domain; the request matches one rule in the middle.
"""

from __future__ import annotations

import importlib
from collections.abc import Coroutine
from typing import Any

import pytest

from ratelimitd import _keys_py, _match_py, limiter, service
from ratelimitd.backends import MemoryBackend
from ratelimitd.config import ConfigFile, load_ruleset
from ratelimitd.limiter import Limiter
from ratelimitd.messages import Descriptor, Request
from ratelimitd.service import RateLimitService
from ratelimitd.stats import StatsStore

SIZES = [10, 1_000, 100_000]
LIMIT = "{unit: second, requests_per_unit: 1000000000}"
IMPLS = ["compiled", "pure"]


def _config(rules: int) -> str:
    lines = [
        "domain: bench",
        "descriptors:",
        "  - key: user",
        "    rate_limit: {unit: minute, requests_per_unit: 1000000000}",
    ]
    for i in range(rules - 1):
        lines.append(f"  - key: user\n    value: u{i}\n    rate_limit: {LIMIT}")
    return "\n".join(lines) + "\n"


_RULESETS: dict[int, Any] = {}


def _ruleset(rules: int, stats: StatsStore | None = None) -> Any:
    if stats is not None:
        return load_ruleset([ConfigFile("bench.yaml", _config(rules))], stats=stats)
    if rules not in _RULESETS:
        _RULESETS[rules] = load_ruleset([ConfigFile("bench.yaml", _config(rules))])
    return _RULESETS[rules]


def _modules(impl: str) -> tuple[Any, Any]:
    if impl == "compiled":
        return importlib.import_module("ratelimitd._match"), importlib.import_module(
            "ratelimitd._keys"
        )
    return _match_py, _keys_py


def _entries(rules: int) -> tuple[tuple[str, str], ...]:
    return (("user", f"u{max(rules // 2 - 1, 0)}"),)


def drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (memory backend) without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("the decision suspended")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("rules", SIZES)
def test_match(benchmark: Any, impl: str, rules: int) -> None:
    benchmark.group = f"match rules={rules}"
    m, _ = _modules(impl)
    root = m.compile_level(_ruleset(rules)._specs["bench"])
    entries = _entries(rules)
    assert m.lookup(root, "bench", entries) is not None
    benchmark(m.lookup, root, "bench", entries)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("rules", SIZES)
def test_keys(benchmark: Any, impl: str, rules: int) -> None:
    benchmark.group = f"keys rules={rules}"
    _, k = _modules(impl)
    entries = _entries(rules)

    def key_and_maths() -> Any:
        key = k.cache_key("", "bench", entries, None, 1, 1_700_000_000)
        return (
            key,
            k.evaluate(100, 1, 50, k.near_threshold(100, 0.8)),
            k.reset_seconds(1_700_000_000, 60),
        )

    benchmark(key_and_maths)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("rules", SIZES)
def test_decision(benchmark: Any, monkeypatch: pytest.MonkeyPatch, impl: str, rules: int) -> None:
    """One-descriptor ShouldRateLimit on the memory backend, end to end in the service."""
    benchmark.group = f"decision rules={rules}"
    m, k = _modules(impl)
    for name in ("cache_key", "evaluate", "near_threshold"):
        monkeypatch.setattr(limiter, name, getattr(k, name))
    monkeypatch.setattr(service, "lookup", m.lookup)
    monkeypatch.setattr(service, "reset_seconds", k.reset_seconds)
    stats = StatsStore()
    ruleset = _ruleset(rules, stats)
    ruleset.domains["bench"] = m.compile_level(ruleset._specs["bench"])
    svc = RateLimitService(Limiter(MemoryBackend()), stats)
    svc.set_ruleset(ruleset)
    request = Request("bench", [Descriptor(_entries(rules))])
    assert drive(svc.should_rate_limit(request)).overall_code == 1
    benchmark(lambda: drive(svc.should_rate_limit(request)))
