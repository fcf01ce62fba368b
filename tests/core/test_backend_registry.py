"""A backend is one module and one registry line: a counter store written here plugs in with
`BACKENDS["tally"] = Registered(TALLY, TallyBackend)` and is then selected, checked and
used exactly as the built-in ones, through what it declares (`Capabilities`), never its name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.core import single_rule
from support.decisions import explain_then_decide

from ratelimitd.backends import BACKENDS, Backend, Capabilities, Registered, load_settings
from ratelimitd.backends.base import Op
from ratelimitd.backends.memory import simulate
from ratelimitd.config import ConfigError, ConfigFile
from ratelimitd.core import build_core
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor, Request
from ratelimitd.process import cli
from ratelimitd.settings import Settings, SettingsError

# Fixed windows only, fails by raising, no circuit breakers, waits for its (pretend) I/O.
TALLY = Capabilities(span="Tally Pipeline Execution")

CONFIG = single_rule("d", "minute", 2)


class TallyBackend:
    """Counters in a dict, behind the awaited contract (no synchronous fast path)."""

    name = "tally"
    capabilities = TALLY

    def __init__(self, settings: Settings, *_: Any) -> None:
        self.counts: dict[str, int] = {}
        self.rounds = 0

    async def connect(self) -> None:
        return None

    async def increment(self, ops: Sequence[Op]) -> list[Any]:
        self.rounds += 1
        out = []
        for op in ops:
            value = self.counts.get(op.key, 0)
            value = max(0, value - op.hits) if op.refund else value + op.hits
            self.counts[op.key] = value
            out.append(value)
        return out

    async def get(self, ops: Sequence[Op]) -> list[int]:
        return [self.counts.get(op.key, 0) for op in ops]

    async def peek(self, ops: Sequence[Op]) -> list[Any]:
        # It keeps counters as the memory store keeps them: its dry run is that store's.
        return simulate(ops, [self.counts.get(op.key) for op in ops], 0)

    async def delete(self, keys: Sequence[str]) -> int:
        return sum(self.counts.pop(key, None) is not None for key in keys)

    async def close(self) -> None:
        return None


@pytest.fixture
def tally(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(BACKENDS, "tally", Registered(TALLY, TallyBackend))  # the one line
    yield


def test_selected_by_its_name(tally: None) -> None:
    settings = load_settings({"BACKEND_TYPE": "tally", "MAX_INFLIGHT_DECISIONS": "5"})
    core = build_core(settings)
    assert isinstance(core.backend, TallyBackend) and isinstance(core.backend, Backend)
    assert not core.limiter.synchronous  # no SyncBackend: the limiter awaits it
    assert core.service.max_in_flight == 5  # it waits: the bound applies


def test_its_declaration_drives_the_settings_checks(tally: None) -> None:
    # It raises but has no breakers: BACKEND_BREAKER_FAILURES would do nothing.
    with pytest.raises(SettingsError, match=r"^BACKEND_BREAKER_FAILURES: has no effect with "):
        load_settings({"BACKEND_TYPE": "tally", "BACKEND_BREAKER_FAILURES": "3"})
    # It raises: the failure policy applies.
    policy = load_settings({"BACKEND_TYPE": "tally", "BACKEND_FAILURE_POLICY": "allow"})
    assert policy.cache.failure_policy == "allow"
    with pytest.raises(SettingsError, match="accepted: redis, memcache, memory, tally"):
        load_settings({"BACKEND_TYPE": "nope"})


def test_its_algorithms_are_checked_at_load(tally: None, tmp_path: Path) -> None:
    core = build_core(load_settings({"BACKEND_TYPE": "tally"}))
    sliding = CONFIG.replace(
        "requests_per_unit: 2}", "requests_per_unit: 2, algorithm: sliding_window}"
    )
    with pytest.raises(ConfigError, match="cannot be counted exactly by the tally backend"):
        core.load([ConfigFile("c.yaml", sliding)])
    (tmp_path / "c.yaml").write_text(sliding)
    assert cli.check_config(["--backend-type", "tally", str(tmp_path / "c.yaml")]) == 1


async def test_it_decides_and_explains(tally: None) -> None:
    clock: Callable[[], float] = lambda: 1_000_000.0  # noqa: E731
    core = build_core(load_settings({"BACKEND_TYPE": "tally"}), clock=clock)
    core.load([ConfigFile("c.yaml", CONFIG)])
    request = Request("d", [Descriptor((("k", "v"),))])
    codes = []
    for _ in range(3):
        await explain_then_decide(core.service, core.stats, request)
        codes.append((await core.service.should_rate_limit(request)).overall_code)
    assert codes == [OK, OVER_LIMIT, OVER_LIMIT]
    assert core.backend.rounds == 6  # type: ignore[attr-defined]  # one round per decision
