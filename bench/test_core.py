"""Decision-core benchmarks: groups `match`, `keys`, `decision`; compiled vs pure side by side.

Run with `make bench` (CPU time via time.process_time). Each group is measured at 10,
1 000 and 100 000 rules in one domain; the request matches one rule in the middle. The
implementation is an argument (`build_core(impl=...)`, `load_ruleset(matcher=...)`), so the
pure rows run exactly the twins and nothing is patched. The decision model itself has no twin:
its pure rows are the compiled model calling the leaves' twins (`match`, `keys`).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from ratelimitd.backends import MemoryBackend
from ratelimitd.config import ConfigSource, RuleSet, build_ruleset, keys, match
from ratelimitd.config.yamlfile import parse
from ratelimitd.core import build_core
from ratelimitd.messages import Descriptor, Request
from ratelimitd.transport import protocodec

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


# Parsing 100 000 rules of YAML takes a minute: each size is parsed once.
_SOURCES: dict[int, list[ConfigSource]] = {}


def _sources(rules: int) -> list[ConfigSource]:
    if rules not in _SOURCES:
        _SOURCES[rules] = [ConfigSource("bench.yaml", parse("bench.yaml", _config(rules)))]
    return _SOURCES[rules]


def _ruleset(rules: int, impl: str, stats: Any = None) -> RuleSet:
    return build_ruleset(_sources(rules), stats=stats, matcher=match.implementation(impl))


def _modules(impl: str) -> tuple[ModuleType, ModuleType]:
    return match.implementation(impl), keys.implementation(impl)


def _entries(rules: int) -> tuple[tuple[str, str], ...]:
    return (("user", f"u{max(rules // 2 - 1, 0)}"),)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("rules", SIZES)
def test_match(benchmark: Any, impl: str, rules: int) -> None:
    benchmark.group = f"match rules={rules}"
    ruleset = _ruleset(rules, impl)
    root = ruleset.domains["bench"]
    entries = _entries(rules)
    assert ruleset.lookup is match.implementation(impl).lookup
    assert ruleset.lookup(root, "bench", entries) is not None
    benchmark(ruleset.lookup, root, "bench", entries)


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
def test_decision(benchmark: Any, impl: str, rules: int) -> None:
    """One-descriptor ShouldRateLimit on the memory backend, end to end in the service (the
    compiled model on the `impl` leaves)."""
    benchmark.group = f"decision rules={rules}"
    core = build_core(backend=MemoryBackend(), impl=impl)
    core.service.set_ruleset(_ruleset(rules, impl, core.stats))
    svc = core.service
    request = Request("bench", [Descriptor(_entries(rules))])
    assert svc.decide(request).overall_code == 1
    benchmark(lambda: svc.decide(request))


# The RLS codec: the compiled `_wire` pair against protobuf's upb-backed classes (the codec
# has no pure twin; upb is what the daemon would otherwise run).
CODECS = {
    "compiled": (protocodec.decode_request, protocodec.encode_response),
    "upb": (protocodec.decode_request_upb, protocodec.encode_response_upb),
}


@pytest.mark.parametrize("impl", list(CODECS))
@pytest.mark.parametrize("op", ["decode", "encode"])
def test_codec(benchmark: Any, impl: str, op: str) -> None:
    """One-descriptor RateLimitRequest decode / OK RateLimitResponse (one status) encode."""
    if impl == "compiled" and protocodec.IMPLEMENTATION != "compiled":
        pytest.skip("ratelimitd.transport._wire is not built")
    benchmark.group = f"codec {op}"
    decode, encode = CODECS[impl]
    data = protocodec.encode_request("bench", [_entries(10)])
    core = build_core(backend=MemoryBackend(), impl="compiled")
    core.service.set_ruleset(_ruleset(10, "compiled", core.stats))
    response = core.service.decide(decode(data))
    assert response.overall_code == 1 and response.statuses[0].rule is not None
    assert protocodec.decode_response(encode(response)).overall_code == 1
    if op == "decode":
        benchmark(decode, data)
    else:
        benchmark(encode, response)
