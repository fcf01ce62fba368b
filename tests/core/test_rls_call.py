"""The ShouldRateLimit call's twins agree: the compiled `_rls.SyncCall` and its pure twin
`RlsHandler._call_now` turn the same request bytes into the same (gRPC status, reply) and
count the same statistics, side by side in one process (whatever RATELIMITD_NO_EXTENSIONS
says, as the pure pass would otherwise never run the pure one).

Each twin has a core of its own (memory backend, the same clock, the service tests' config),
fed the same calls in turn: decodable requests (known and unknown domains, over the limit,
refused by the service), bytes the decoder refuses, and requests past the decoder's bounds.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.core import SERVICE_CONFIG, Decider, load_text, memory_decider

from ratelimitd.grpcstatus import INTERNAL, OK, RESOURCE_EXHAUSTED, UNKNOWN
from ratelimitd.messages import OVER_LIMIT, Descriptor
from ratelimitd.settings import ReloadOptions
from ratelimitd.transport import _rls, protocodec
from ratelimitd.transport.rls import RlsHandler, refused

# Small bounds, so that a generated request can pass them (refused while decoded).
OPTIONS = ReloadOptions(max_descriptors=3, max_entries=2)


class Ticks:
    """A clock that moves 0.25 ms per reading: the calls' response times are the same in
    both twins, so their statistics compare whole."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.00025
        return self.now


def twins() -> tuple[tuple[Decider, Any], tuple[Decider, Any]]:
    """(core, call) of the compiled call and of the pure twin, each on a core of its own."""
    compiled_core = memory_decider(SERVICE_CONFIG, options=OPTIONS)
    pure_core = memory_decider(SERVICE_CONFIG, options=OPTIONS)
    # Built as RlsHandler builds it, in either pass (the pure one does not pick it).
    h = RlsHandler(compiled_core.service, compiled_core.stats, clock=Ticks())
    compiled = _rls.SyncCall(
        protocodec.decode_request,
        h.service,
        protocodec.encode_response,
        h.clock,
        h.stats.service,
        h.timer,
        h.failed,
        refused,
    )
    pure = RlsHandler(pure_core.service, pure_core.stats, clock=Ticks())._call_now
    return (compiled_core, compiled), (pure_core, pure)


keys = st.sampled_from(["bar", "hour", "shadow", "quota", "unl", "free", ""])
entry = st.tuples(keys, st.sampled_from(["a", "b", "", "é"]))
descriptor = st.builds(
    Descriptor,
    st.lists(entry, min_size=0, max_size=3).map(tuple),
    st.none() | st.tuples(st.integers(0, 3), st.integers(0, 7)),
    st.none() | st.integers(0, 3),
    st.booleans(),
)
encoded = st.builds(
    protocodec.encode_request,
    st.sampled_from(["d", "unknown", "elsewhere", "ü", ""]),
    st.lists(descriptor, max_size=4),
    st.integers(0, 3),
)
calls = st.lists(encoded | st.binary(max_size=24), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(calls)
def test_compiled_and_pure_calls_agree(datas: list[bytes]) -> None:
    (compiled_core, compiled), (pure_core, pure) = twins()
    for data in datas:
        assert compiled(data) == pure(data)
    assert compiled_core.stats.snapshot() == pure_core.stats.snapshot()


def test_each_kind_of_outcome_alike() -> None:
    """One call of each outcome, so that none is left to chance: decided, over the limit,
    undecodable, too large for the decoder, refused by the service, and one the call hands
    back (None: decided only asynchronously)."""
    (compiled_core, compiled), (pure_core, pure) = twins()
    k = [Descriptor((("hour", "a"),))]  # 3 an hour
    cases = [
        (protocodec.encode_request("d", k), OK),
        (protocodec.encode_request("d", k), OK),
        (protocodec.encode_request("d", k), OK),
        (b"\xff\xff", INTERNAL),
        (protocodec.encode_request("d", k * 4), RESOURCE_EXHAUSTED),
        (protocodec.encode_request("", k), UNKNOWN),
        (protocodec.encode_request("d", [Descriptor((("bar", "a"),), (1, 99))]), UNKNOWN),
    ]
    for data, code in cases:
        got = compiled(data)
        assert got == pure(data)
        assert got is not None and got[0] == code, got
    reply = compiled(protocodec.encode_request("d", k))  # over the limit: still a reply
    assert reply is not None
    assert protocodec.decode_response(reply[1]).overall_code == OVER_LIMIT
    assert pure(protocodec.encode_request("d", k)) == reply
    snapshot = compiled_core.stats.snapshot()
    assert snapshot == pure_core.stats.snapshot()
    assert snapshot["ratelimit_server.ShouldRateLimit.total_requests"] == len(cases) + 1
    assert snapshot["ratelimit.service.call.should_rate_limit.service_error"] == 3


def test_runs_answered_undecoded_alike() -> None:
    """Runs of one request with nothing to count, which the compiled call answers without
    decoding it once it has seen it (an unknown domain: counted per descriptor; a known
    domain no rule matches: no statistic), between decided calls and requests that must
    still be decoded (a non-ASCII key, past the bounds, no descriptor, a domain longer
    than the decoder's string table keeps), then after a reload that makes the unknown
    domain known: the same replies and statistics as the pure twin's."""
    (compiled_core, compiled), (pure_core, pure) = twins()
    one = [Descriptor((("bar", "a"),))]
    unmatched = protocodec.encode_request("d", [Descriptor((("nothing", "here"),))])
    cases = [
        protocodec.encode_request("nowhere", one),
        protocodec.encode_request("nowhere", one * 2),
        unmatched,
        protocodec.encode_request("d", one),
        protocodec.encode_request("elsewhere", one),
        protocodec.encode_request("nowhere", [Descriptor((("clé", "ü"),))]),
        protocodec.encode_request("nowhere", [Descriptor((("a", "1"), ("b", "2"), ("c", "3")))]),
        protocodec.encode_request("nowhere", one * 4),
        protocodec.encode_request("nowhere", []),
        protocodec.encode_request("x" * 100, one),
        protocodec.encode_request("d", [Descriptor((("nothing", "else"),))]),
    ]
    for data in cases:
        for _ in range(3):
            assert compiled(data) == pure(data)
        assert compiled(unmatched) == pure(unmatched)
    reloaded = SERVICE_CONFIG.replace("domain: d", "domain: nowhere")
    for core in (compiled_core, pure_core):
        core.service.set_ruleset(load_text(reloaded), OPTIONS)
    for data in cases[:3]:
        for _ in range(3):
            assert compiled(data) == pure(data)
    snapshot = compiled_core.stats.snapshot()
    assert snapshot == pure_core.stats.snapshot()
    assert snapshot["ratelimit.service.rate_limit.nowhere.domain_not_found"] == 3 * (1 + 2 + 1)
    assert snapshot["ratelimit.service.rate_limit.elsewhere.domain_not_found"] == 3
    assert "ratelimit.service.rate_limit.nowhere.bar.total_hits" in snapshot
