"""ratelimitd as the rate-limit service Envoy AI Gateway's QuotaPolicy expects, end to end
(both gRPC transports): a stock Envoy configured as AI Gateway's extension server
configures it (examples/llm-budget/ai-gateway-quota), its config over plaintext ADS with
node id `envoy-ai-gateway-ratelimit` in the translator's shape, and the fake OpenAI
upstream. Then the same workload on ratelimitd's reserve / settle route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import free_port
from support.ads_server import AdsServer, Unit, rl_config, rl_descriptor
from support.llm_stack import EXAMPLES, LlmStack, concurrent_streams, llm_stack
from support.ready import wait_for

NODE_ID = "envoy-ai-gateway-ratelimit"
DOMAIN = "ai-gateway-quota"
BACKEND, MODEL = "default/openai", "gpt"
# The concurrency workload of test_budget_envoy: 40 streams at once, each asking 1000
# tokens and using 800, against 10,000 tokens an hour.
STREAMS, MAX_TOKENS, USAGE, LIMIT = 40, 1000, 800, 10_000
# What the AI Gateway controller's translator serves for a QuotaPolicy on backend
# default/openai with perModelQuotas [{modelName: gpt, quota: {defaultBucket: {limit:
# 10000, duration: 1h}}}] (internal/ratelimit/translator).
QUOTA = rl_config(
    DOMAIN,
    DOMAIN,
    rl_descriptor(
        "backend_name",
        BACKEND,
        children=[
            rl_descriptor(
                "model_name_override",
                MODEL,
                unit=Unit.HOUR,
                requests_per_unit=LIMIT,
                quota_mode=True,
            )
        ],
    ),
)
# The daemon's own file config is not read (CONFIG_TYPE=GRPC_XDS_SOTW).
UNREAD = "domain: unread\ndescriptors: []\n"


@pytest.fixture(params=["native", "grpcio"])
def quota_stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LlmStack]:
    ads = AdsServer(free_port(), node_id=NODE_ID)
    ads.set_snapshot("1", [QUOTA])
    ads.start()
    try:
        with llm_stack(
            tmp_path,
            "ai-gateway-quota",
            UNREAD,
            record=False,
            GRPC_TRANSPORT=request.param,
            CONFIG_TYPE="GRPC_XDS_SOTW",
            CONFIG_GRPC_XDS_SERVER_URL=f"127.0.0.1:{ads.port}",
            CONFIG_GRPC_XDS_NODE_ID=NODE_ID,
        ) as s:
            ads.wait_ack("1")
            # The daemon subscribed as the controller expects it to, in plaintext.
            assert ads.received[0].request.node.id == NODE_ID
            yield s
    finally:
        ads.stop()


def used(s: LlmStack) -> int:
    entries = [("backend_name", BACKEND), ("model_name_override", MODEL)]
    value: int = s.counter_of(DOMAIN, entries)["value"]
    return value


def test_quota_policy_counts_each_request_at_its_cost_and_refuses_once_spent(
    quota_stack: LlmStack, tmp_path: Path
) -> None:
    s = quota_stack
    # One request: its cost (usage.total_tokens, 300) at stream end, plus the 1 the
    # request-time entry adds (it has no hits_addend: the request's default applies).
    assert s.chat(None, headers={"x-fake-usage": "300"}).status == 200
    wait_for(lambda: used(s) == 301, 30, "the request's cost")
    # The concurrency workload: every stream passes the check while the others are in
    # flight, and all report: overshoot by what was in flight, as envoyproxy/ratelimit.
    answers = concurrent_streams(s, STREAMS, max_tokens=MAX_TOKENS, usage=USAGE)
    assert [a.status for a in answers] == [200] * STREAMS
    charged = 301 + STREAMS * (USAGE + 1)
    wait_for(lambda: used(s) == charged, 30, "every stream's cost")
    # Spent: the next request is refused at once, without x-envoy-ratelimited (disabled).
    refused = s.chat(None, headers={"x-fake-usage": "10"})
    assert refused.status == 429
    assert "x-envoy-ratelimited" not in refused.headers
    assert refused.headers["x-ratelimit-limit"].startswith(f"{LIMIT}, {LIMIT};w=3600")
    overshoot = charged - LIMIT
    assert overshoot == 22_341
    # The same workload on ratelimitd's reserve / settle route: overshoot 0.
    text = (EXAMPLES / "reserve" / "config" / "llm.yaml").read_text()
    config = text.replace("requests_per_unit: 100000", f"requests_per_unit: {LIMIT}")
    with llm_stack(tmp_path / "reserve", "reserve", config, record=False) as r:
        answers = concurrent_streams(r, STREAMS, max_tokens=MAX_TOKENS, usage=USAGE)
        admitted = sum(a.status == 200 for a in answers)
        wait_for(lambda: r.counter("crowd")["reserved"] == 0, 30, "every settle")
        assert r.counter("crowd")["value"] == admitted * USAGE <= LIMIT
