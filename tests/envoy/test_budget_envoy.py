"""Token budgets through the real Envoy (examples/llm-budget), the fake OpenAI backend and
ratelimitd: what Envoy sends for each way a stream can end, the check-then-report baseline
(measured), the reserve/settle behaviour on both gRPC transports, and quota routing."""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemon import run_check_config
from support.llm_stack import (
    EXAMPLES,
    LlmStack,
    concurrent_streams,
    llm_stack,
    wait_stream_ends,
)
from support.ready import wait_for

# A config that limits nothing Envoy sends: only what reaches the service is looked at.
NO_LIMIT = """\
domain: llm-tokens
descriptors:
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 1}
"""

# The concurrency workload: 40 streams at once, each asking 1000 tokens and using 800,
# against 10,000 tokens per hour.
STREAMS, MAX_TOKENS, USAGE, LIMIT = 40, 1000, 800, 10_000


def example_config(example: str, limit: int) -> str:
    """The daemon config of an example with its per-user limit set to `limit`."""
    text = (EXAMPLES / example / "config" / "llm.yaml").read_text()
    return text.replace("requests_per_unit: 100000", f"requests_per_unit: {limit}")


def example_stack(tmp_path: Path, example: str, transport: str, **env: str) -> Iterator[LlmStack]:
    """Example `example` at LIMIT tokens per user and hour, straight to the daemon on gRPC
    transport `transport` (no tap: the transport is what is under test)."""
    config = example_config(example, LIMIT)
    with llm_stack(tmp_path, example, config, record=False, GRPC_TRANSPORT=transport, **env) as s:
        yield s


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[LlmStack]:
    """The reserve example in front of a daemon that limits none of its descriptors."""
    with llm_stack(tmp_path, "reserve", NO_LIMIT) as stack:
        yield stack


def test_the_example_sends_reserve_then_settle_and_close_with_one_transaction(
    recorded: LlmStack,
) -> None:
    s = recorded
    assert s.chat("bob", max_tokens=50, headers={"x-fake-usage": "42"}).status == 200
    assert s.chat("bob", max_tokens=None, stream=True, headers={"x-fake-usage": "30"}).status == 200
    assert recorded.recorder is not None
    wait_stream_ends(s, 2, lambda d: d.get("phase") == "close")
    reserves = recorded.recorder.phase("reserve")
    settles = recorded.recorder.phase("settle")
    closes = recorded.recorder.phase("close")
    # max_tokens from the JSON body (4096 when absent: json_to_metadata's on_missing).
    assert [d.hits_addend for d in reserves] == [50, 4096]
    # Beside it, in the same call: the prompt's bound (the body's size) and the guard.
    extras = recorded.recorder.phase("extra")
    assert [d.hits_addend for d in extras] == [s.body_bytes(0), s.body_bytes(1)]
    assert [d.hits_addend for d in recorded.recorder.phase("guard")] == [4096, 4096]
    asked = [c for c in recorded.recorder.snapshot() if c.descriptors[0].get("phase") == "reserve"]
    assert [[d.get("phase") for d in c.descriptors] for c in asked] == [
        ["reserve", "extra", "guard"]
    ] * 2
    # usage.total_tokens from the JSON answer, then from the last SSE event.
    assert [d.hits_addend for d in settles] == [42, 30]
    assert [d.hits_addend for d in closes] == [200, 200]
    for r, st, c in zip(reserves, settles, closes, strict=True):
        assert [k for k, _ in r.entries] == ["phase", "user", "txn"]
        assert r.get("user") == st.get("user") == c.get("user") == "bob"
        assert r.get("txn") == st.get("txn") == c.get("txn")  # x-request-id, both calls
    # A stream end is one call carrying settle then close.
    ends = [c for c in recorded.recorder.snapshot() if c.descriptors[0].get("phase") != "reserve"]
    assert [[d.get("phase") for d in c.descriptors] for c in ends] == [["settle", "close"]] * 2


def test_a_stream_end_without_usage_sends_only_the_close(recorded: LlmStack) -> None:
    s = recorded
    assert s.chat("bob", max_tokens=70, headers={"x-fake-status": "500"}).status == 500
    cut = s.chat("bob", max_tokens=80, stream=True, headers={"x-fake-abort-after": "1"})
    assert (cut.status, cut.complete) == (200, False)  # the upstream died mid-stream
    gone = s.chat(
        "bob",
        max_tokens=90,
        stream=True,
        headers={"x-fake-delay-ms": "200", "x-fake-chunks": "10"},
        cut_after=20,
    )
    assert gone.status == 200  # and the client hung up mid-stream
    wait_stream_ends(s, 3, lambda d: d.get("phase") == "close")
    assert recorded.recorder is not None
    assert recorded.recorder.phase("settle") == []
    # The close's hits are the status already sent: 200 for both aborts once streaming.
    assert [d.hits_addend for d in recorded.recorder.phase("close")] == [500, 200, 200]
    wait_for(lambda: s.backend.waiting() == 0, 30, "the backend to see the client gone")
    assert [r.ended for r in s.backend.requests] == ["completed", "aborted", "client_gone"]


def test_no_budget_entry_means_no_call_at_all(recorded: LlmStack) -> None:
    # Without x-user every descriptor lacks an entry: Envoy sends nothing (fail-open).
    assert recorded.chat(None, max_tokens=90).status == 200
    assert recorded.chat("bob", max_tokens=1).status == 200
    assert recorded.recorder is not None
    wait_stream_ends(recorded, 1, lambda d: d.get("phase") == "close")
    users = {d.get("user") for c in recorded.recorder.snapshot() for d in c.descriptors}
    assert users == {"bob"}


def test_check_then_report_overshoots_by_what_is_in_flight_reserve_never(tmp_path: Path) -> None:
    # The baseline (Envoy Gateway's cost.request 0 / cost.response): every stream that
    # starts while the others are in flight passes the check, and all of them report.
    config = example_config("check-then-report", LIMIT)
    with llm_stack(tmp_path, "check-then-report", config) as s:
        answers = concurrent_streams(s, STREAMS, max_tokens=MAX_TOKENS, usage=USAGE)
        assert [a.status for a in answers] == [200] * STREAMS
        wait_for(lambda: s.counter("crowd")["value"] == STREAMS * USAGE, 30, "every report")
        used = s.counter("crowd")["value"]
    overshoot = used - LIMIT
    # 40 x 800 = 32,000 tokens charged against 10,000: overshot by 22,000 (220%).
    assert overshoot == STREAMS * USAGE - LIMIT == 22_000
    # The same workload in the same run, reserved at request time: never overshot.
    with llm_stack(tmp_path / "reserve", "reserve", example_config("reserve", LIMIT)) as s:
        answers = concurrent_streams(s, STREAMS, max_tokens=MAX_TOKENS, usage=USAGE)
        admitted = sum(a.status == 200 for a in answers)
        wait_for(lambda: s.counter("crowd")["reserved"] == 0, 30, "every settle")
        used = s.counter("crowd")["value"]
        estimate = MAX_TOKENS + s.body_bytes()  # max_tokens and the prompt's bound
    assert (admitted, used) == (LIMIT // estimate, admitted * USAGE)
    print(f"overshoot: check-then-report {overshoot}, reserve {max(0, used - LIMIT)}")
    assert used <= LIMIT


# -- reserve / settle ---------------------------------------------------------------------


@functools.cache
def budget_config_error() -> str:
    """Why the daemon refuses the reserve example's config ("" when it loads it)."""
    done = run_check_config(str(EXAMPLES / "reserve" / "config"))
    return "" if done.returncode == 0 else done.stdout + done.stderr


@pytest.fixture(params=["native", "grpcio"])
def budget_stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LlmStack]:
    """The reserve example at LIMIT tokens per user and hour, IETF headers on, straight to
    the daemon on each gRPC transport (no tap: the transport is what is under test)."""
    error = budget_config_error()
    assert not error, error
    yield from example_stack(
        tmp_path,
        "reserve",
        request.param,
        LIMIT_RESPONSE_HEADERS_ENABLED="true",
        LIMIT_RESPONSE_HEADERS_FORMAT="ietf",
    )


def test_concurrent_streams_never_overshoot_the_budget(budget_stack: LlmStack) -> None:
    s = budget_stack
    answers = concurrent_streams(s, STREAMS, max_tokens=MAX_TOKENS, usage=USAGE)
    admitted = [a for a in answers if a.status == 200]
    # Exactly LIMIT / estimate reservations fit (max_tokens and the prompt's bound, the
    # body's size); every other stream gets its 429 at once.
    assert len(admitted) == LIMIT // (MAX_TOKENS + s.body_bytes()) == 9
    assert sorted({a.status for a in answers}) == [200, 429]
    wait_for(lambda: s.counter("crowd")["reserved"] == 0, 30, "every settle")
    assert s.counter("crowd")["value"] == 9 * USAGE <= LIMIT  # overshoot 0


def test_prompts_are_reserved_too_so_the_budget_is_not_overshot(budget_stack: LlmStack) -> None:
    # The same workload with 300-token prompts: usage.total_tokens is 1,100 a request.
    s = budget_stack
    answers = concurrent_streams(s, STREAMS, max_tokens=MAX_TOKENS, usage=USAGE, prompt_tokens=300)
    admitted = sum(a.status == 200 for a in answers)
    estimate = MAX_TOKENS + s.body_bytes()
    assert estimate >= MAX_TOKENS + 300  # the body bounds the prompt's tokens
    assert admitted == LIMIT // estimate
    wait_for(lambda: s.counter("crowd")["reserved"] == 0, 30, "every settle")
    assert s.counter("crowd")["value"] == admitted * (USAGE + 300) <= LIMIT  # overshoot 0


# What a client may send as max_tokens that Envoy cannot send as a count: it drops the
# reserve entry ("Invalid hits_addend"), and the guard reserves 4096 in its place.
UNCOUNTABLE = [-5, 4294967296, 1e18]
# What json_to_metadata itself turns into its default (4096): absent, not a number, null.
DEFAULTED = [None, "abc", "null"]


def test_envoy_drops_a_reserve_it_cannot_count_and_still_sends_the_guard(
    tmp_path: Path,
) -> None:
    with llm_stack(tmp_path, "reserve", NO_LIMIT) as s:
        for value in UNCOUNTABLE:
            assert s.chat("bob", max_tokens=None, body={"max_tokens": value}).status == 200
        assert s.recorder is not None
        asked = [c for c in s.recorder.snapshot() if c.descriptors[0].get("phase") != "settle"]
        asked = [c for c in asked if c.descriptors[0].get("phase") != "close"]
        phases = [[d.get("phase") for d in c.descriptors] for c in asked]
        assert phases == [["extra", "guard"]] * len(UNCOUNTABLE)


def test_no_max_tokens_gets_a_request_past_a_spent_budget(budget_stack: LlmStack) -> None:
    s = budget_stack
    # 9,920 of 10,000 used: no estimate fits any more.
    headers = {"x-fake-usage": "9900", "x-fake-prompt": "20"}
    assert s.chat("eve", max_tokens=9900, headers=headers).status == 200
    wait_for(lambda: s.counter("eve")["value"] == 9920, 30, "the budget spent")
    for value in UNCOUNTABLE + DEFAULTED:
        body = {} if value is None else {"max_tokens": None if value == "null" else value}
        got = s.chat("eve", max_tokens=None, body=body, headers={"x-fake-usage": "10"})
        assert got.status == 429, value
    assert len(s.backend.requests) == 1
    left = s.counter("eve")
    assert (left["value"], left["reserved"]) == (9920, 0)


@pytest.mark.parametrize("value", [*UNCOUNTABLE, "abc"])
def test_a_max_tokens_envoy_drops_still_reserves(budget_stack: LlmStack, value: object) -> None:
    # With room, the request is served on a reservation: the guard's 4096 and the prompt's
    # bound, settled at stream end with the real usage.
    s = budget_stack
    held = threading.Thread(
        target=s.chat,
        args=("fay",),
        kwargs={
            "max_tokens": None,
            "body": {"max_tokens": value},
            "stream": True,
            "headers": {"x-fake-gate": "hold", "x-fake-usage": "70"},
        },
    )
    held.start()
    wait_for(lambda: s.backend.waiting() == 1, 30, "the stream in flight")
    assert s.counter("fay")["reserved"] == 4096 + s.body_bytes()
    s.backend.open("hold")
    held.join(30)
    wait_for(lambda: s.counter("fay")["reserved"] == 0, 30, "the settle")
    assert s.counter("fay")["value"] == 70


def test_a_client_that_hangs_up_mid_stream_pays_its_reservation(budget_stack: LlmStack) -> None:
    # 15 streams, each cut by the client after its first content chunk (before the usage
    # chunk): content flowed, so each is charged what it reserved, and the budget runs out.
    s = budget_stack
    answers = [
        s.chat(
            "gil",
            max_tokens=MAX_TOKENS,
            stream=True,
            headers={"x-fake-delay-ms": "100", "x-fake-chunks": "20"},
            cut_after=20,
        )
        for _ in range(15)
    ]
    served = sum(a.status == 200 for a in answers)
    estimate = MAX_TOKENS + s.body_bytes()
    assert served == LIMIT // estimate < 15
    wait_for(lambda: s.backend.waiting() == 0, 60, "the backend to see every client gone")
    assert {r.ended for r in s.backend.requests} == {"client_gone"}
    wait_for(lambda: s.counter("gil")["reserved"] == 0, 30, "every stream end")
    assert s.counter("gil")["value"] == served * estimate <= LIMIT


def test_budgets_come_out_exact_however_a_stream_ends(budget_stack: LlmStack) -> None:
    s = budget_stack
    assert s.chat("ann", max_tokens=200, headers={"x-fake-usage": "120"}).status == 200
    assert s.chat("ann", max_tokens=400, stream=True, headers={"x-fake-usage": "300"}).status == 200
    assert s.chat("ann", max_tokens=500, headers={"x-fake-status": "500"}).status == 500
    assert not s.chat("ann", stream=True, headers={"x-fake-abort-after": "1"}).complete
    s.chat(
        "ann", stream=True, headers={"x-fake-delay-ms": "200", "x-fake-chunks": "10"}, cut_after=9
    )
    # Settled usage (120 + 300); the upstream error released its reservation; the two
    # streams cut after they started (by the upstream, by the client) are charged theirs
    # (the default `unsettled: charge_served`): max_tokens and the prompt's bound each.
    wait_for(lambda: s.counter("ann")["reserved"] == 0, 30, "every stream end")
    cut = 2 * (100 + s.body_bytes())  # chat's max_tokens
    assert s.counter("ann")["value"] == 420 + cut


def test_a_429_reaches_the_client_when_the_budget_is_reserved_away(
    budget_stack: LlmStack,
) -> None:
    # One stream holds 8,000 tokens while another asks for 3,000.
    s = budget_stack
    first = threading.Thread(
        target=s.chat,
        args=("bea",),
        kwargs={"max_tokens": 8000, "stream": True, "headers": {"x-fake-gate": "hold"}},
    )
    first.start()
    wait_for(lambda: s.backend.waiting() == 1, 30, "the first stream in flight")
    refused = s.chat("bea", max_tokens=3000)
    assert refused.status == 429
    assert refused.headers["x-envoy-ratelimited"] == "true"
    policy = '"llm-tokens.user"'
    # Remaining counts the reservation: 10,000 - 8,000 in use or held, not 10,000.
    match = re.fullmatch(rf"{policy};r=0;t=(\d+)", refused.headers["ratelimit"])
    assert match is not None
    assert 0 < int(refused.headers["retry-after"]) <= 3600
    assert s.chat("bea", max_tokens=2000).headers["ratelimit"].startswith(f"{policy};r=0;")
    s.backend.open("hold")
    first.join(30)
    wait_for(lambda: s.counter("bea")["reserved"] == 0, 30, "the settle")
    assert s.chat("bea", max_tokens=3000).status == 200


def test_ietf_headers_reflect_reservations(budget_stack: LlmStack) -> None:
    s = budget_stack
    ok = s.chat("cat", max_tokens=2500, headers={"x-fake-usage": "100"})
    assert ok.status == 200
    # At request time the reservation is the usage so far: 10,000 - 2,500 - the prompt's
    # bound.
    left = 7500 - s.body_bytes()
    assert re.fullmatch(rf'"llm-tokens\.user";r={left};t=\d+', ok.headers["ratelimit"])
    assert ok.headers["ratelimit-policy"] == '"llm-tokens.user";q=10000;w=3600'
    wait_for(lambda: s.counter("cat")["value"] == 100, 30, "the settle")
    again = s.chat("cat", max_tokens=100)
    left = 9800 - s.body_bytes()
    assert re.fullmatch(rf'"llm-tokens\.user";r={left};t=\d+', again.headers["ratelimit"])


@pytest.fixture(params=["native", "grpcio"])
def quota_stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LlmStack]:
    """The quota-routing example at LIMIT tokens per user and hour: a primary backend while
    the budget has room, a fallback once it has not (on each gRPC transport)."""
    yield from example_stack(
        tmp_path, "quota-routing", request.param, RESPONSE_DYNAMIC_METADATA="true"
    )


def test_quota_mode_metadata_routes_to_a_backend_with_budget_left(quota_stack: LlmStack) -> None:
    # The budget rule is in quota_mode with metadata naming its backend; once a request's
    # max_tokens no longer fit, the fallback rule's metadata wins and Envoy routes there.
    s = quota_stack
    served = [s.chat("dan", max_tokens=3000, headers={"x-fake-usage": "3000"}) for _ in range(3)]
    assert [(a.status, a.headers["x-served-by"]) for a in served] == [(200, "primary")] * 3
    wait_for(lambda: s.counter("dan")["value"] == 9000, 30, "the settles")
    routed = s.chat("dan", max_tokens=3000, headers={"x-fake-usage": "2500"})
    assert (routed.status, routed.headers["x-served-by"]) == (200, "fallback")
    streamed = s.chat("dan", max_tokens=3000, stream=True, headers={"x-fake-usage": "2500"})
    assert (streamed.status, streamed.headers["x-served-by"]) == (200, "fallback")
    # What the fallback served is not the user's budget's: a request that fits still goes
    # to the primary, and only its own usage is charged.
    fits = s.chat("dan", max_tokens=800, headers={"x-fake-usage": "400"})  # + its body
    assert (fits.status, fits.headers["x-served-by"]) == (200, "primary")
    wait_for(lambda: s.counter("dan")["value"] == 9400, 30, "the last settle")
    assert s.counter("dan")["reserved"] == 0
    assert s.fallback is not None and len(s.fallback.requests) == 2
