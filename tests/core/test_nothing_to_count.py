"""Requests with nothing to count: a domain the config does not know (Envoy Gateway sends one
call per listener domain, most of them unknown) and descriptors no rule matches.

The reference answers both OK without a limit (`src/service/ratelimit.go`): an unknown
domain counts `ratelimit.service.rate_limit.<domain>.domain_not_found` once per descriptor,
a descriptor no rule matches counts no per-rule statistic, and neither touches the cache.
The engine answers them without a plan (one shared response per number of descriptors):
these tests pin that the statistics, the statuses and the store are what the reference's
are, on every path (`decide_now`, the awaited halves), on either twin of the leaves.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import SERVICE_CONFIG as CONFIG
from support.core import brief

from ratelimitd.messages import OK, Descriptor, Request
from ratelimitd.settings import ReloadOptions

NOT_FOUND = "ratelimit.service.rate_limit.{}.domain_not_found"
IMPLS = ["compiled", "pure"]


def _request(domain: str, *descriptors: list[tuple[str, str]]) -> Request:
    return Request(domain, [Descriptor(tuple(d)) for d in descriptors])


def _rule_series(h: Any) -> dict[str, float]:
    """Every per-rule statistic with a non-zero value."""
    prefix = "ratelimit.service.rate_limit."
    return {
        k: v
        for k, v in h.stats.snapshot().items()
        if k.startswith(prefix) and v and not k.endswith(".domain_not_found")
    }


@pytest.mark.parametrize("impl", IMPLS)
def test_unknown_domain_counts_each_descriptor_of_every_call(harness: Any, impl: str) -> None:
    h = harness(CONFIG, impl=impl)
    decide = h.service._engine.decide_now
    for _ in range(300):  # past the small ints: every call is counted, none is cached away
        r = decide(_request("nope", [("foo", "bar")], [("hello", "world")]))
        assert r.overall_code == OK
        assert [brief(s) for s in r.statuses] == [(OK, None, 0)] * 2
        assert r.headers == [] and r.dynamic_metadata is None
    r = decide(_request("nope", [("a", "b")]))
    assert [brief(s) for s in r.statuses] == [(OK, None, 0)]
    assert h.stat(NOT_FOUND.format("nope")) == 601
    assert h.backend._counters == {}
    assert _rule_series(h) == {}


@pytest.mark.parametrize("impl", IMPLS)
def test_no_rule_matches_counts_no_rule_statistic(harness: Any, impl: str) -> None:
    h = harness(CONFIG, impl=impl)
    decide = h.service._engine.decide_now
    for i in range(50):
        r = decide(_request("d", [("hello", f"v{i}")], [("nothing", "here")]))
        assert r.overall_code == OK
        assert [brief(s) for s in r.statuses] == [(OK, None, 0)] * 2
    assert h.backend._counters == {}
    assert _rule_series(h) == {}
    assert h.stat(NOT_FOUND.format("d")) == 0
    # A decided call after them is decided as before.
    r = decide(_request("d", [("foo", "bar")]))
    assert [brief(s) for s in r.statuses] == [(OK, 10, 9)]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_awaited_halves_answer_them_without_a_round(harness: Any, impl: str) -> None:
    h = harness(CONFIG, impl=impl)
    engine = h.service._engine
    for request in (_request("nope", [("a", "b")]), _request("d", [("hello", "x")])):
        r = engine.prepare(request)
        assert [brief(s) for s in r.statuses] == [(OK, None, 0)]
    assert h.stat(NOT_FOUND.format("nope")) == 1
    assert h.backend._counters == {}


@pytest.mark.parametrize("impl", IMPLS)
def test_options_that_add_nothing_without_a_limit_keep_the_answer(harness: Any, impl: str) -> None:
    options = ReloadOptions(response_headers=True, all_descriptors_headers=True)
    h = harness(CONFIG, options=options, impl=impl)
    r = h.service._engine.decide_now(_request("nope", [("a", "b")]))
    assert r.headers == [] and r.request_headers == []
    assert h.stat(NOT_FOUND.format("nope")) == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_dynamic_metadata_still_echoes_an_unknown_domains_request(harness: Any, impl: str) -> None:
    options = ReloadOptions(response_dynamic_metadata=True)
    h = harness(CONFIG, options=options, impl=impl)
    engine = h.service._engine
    for domain in ("nope", "d"):
        r = engine.decide_now(_request(domain, [("hello", "world")]))
        assert r.dynamic_metadata == {
            "domain": domain,
            "descriptors": [{"entries": ["hello=world"]}],
        }
    assert h.stat(NOT_FOUND.format("nope")) == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_refusals_are_not_answered_early(harness: Any, impl: str) -> None:
    options = ReloadOptions(max_descriptors=2, max_entries=1)
    h = harness(CONFIG, options=options, impl=impl)
    decide = h.service._engine.decide_now
    with pytest.raises(Exception, match="MAX_DESCRIPTORS_PER_REQUEST=2"):
        decide(_request("nope", [("a", "b")], [("a", "b")], [("a", "b")]))
    with pytest.raises(Exception, match="MAX_ENTRIES_PER_DESCRIPTOR=1"):
        decide(_request("nope", [("a", "b"), ("c", "d")]))
    with pytest.raises(Exception, match="descriptor list must not be empty"):
        decide(_request("nope"))
    assert h.stat(NOT_FOUND.format("nope")) == 0
    assert h.stat("ratelimit.service.call.should_rate_limit.service_error") == 3
