"""Token budgets the way Envoy Gateway configures Envoy, through a real Envoy and ratelimitd
(both gRPC transports): per-tenant limits from one rule (`limit.fromMetadata`, a request's
own `descriptor.limit`), on the memory store and on Redis behind a Sentinel address given in
Envoy Gateway's single Redis `url` field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.llm_stack import EXAMPLES, LlmStack, llm_stack
from support.ready import wait_for
from support.redis_server import RedisServers

TENANT_LIMITS = {"acme": 3000, "globex": 1000}  # per hour: the example's Lua table


@pytest.fixture(params=["native", "grpcio"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def per_tenant(tmp_path: Path, transport: str, **env: str) -> Iterator[LlmStack]:
    config = (EXAMPLES / "per-tenant" / "config" / "llm.yaml").read_text()
    with llm_stack(
        tmp_path, "per-tenant", config, record=False, GRPC_TRANSPORT=transport, **env
    ) as s:
        yield s


def spend(s: LlmStack, tenant: str) -> tuple[int, int]:
    """Requests of 400 max_tokens using 300 until the tenant is refused: (served, used)."""
    served = 0
    while True:
        got = s.chat(None, max_tokens=400, headers={"x-tenant": tenant, "x-fake-usage": "300"})
        if got.status == 429:
            break
        assert got.status == 200
        served += 1
        assert served < 20
    wait_for(lambda: s.counter(tenant, "tenant")["reserved"] == 0, 30, "every settle")
    return served, s.counter(tenant, "tenant")["value"]


def check_each_tenant_at_its_own_limit(s: LlmStack) -> None:
    for tenant, limit in TENANT_LIMITS.items():
        served, used = spend(s, tenant)
        estimate = 400 + s.body_bytes()
        # Reserved while in flight one at a time: a request passes while used + estimate fits.
        assert served == (limit - estimate) // 300 + 1, tenant
        assert used == served * 300 <= limit


def test_tenants_sharing_one_budget_rule_are_each_refused_at_their_own_limit(
    tmp_path: Path, transport: str
) -> None:
    for s in per_tenant(tmp_path, transport):
        check_each_tenant_at_its_own_limit(s)


def test_per_tenant_budgets_on_redis_through_a_sentinel_url(
    tmp_path: Path, transport: str, redis_servers: RedisServers
) -> None:
    # As Envoy Gateway configures its rate-limit service: REDIS_URL only, no REDIS_TYPE.
    master, _, sentinels = redis_servers.sentinels()
    url = "mymaster," + ",".join(f"127.0.0.1:{x.port}" for x in sentinels)
    for s in per_tenant(tmp_path, transport, BACKEND_TYPE="redis", REDIS_URL=url):
        check_each_tenant_at_its_own_limit(s)
        assert any(b"_budget" in k for k in master.client().keys("*"))


EG_DOMAIN = "default/eg/http"
EG_RULE = "httproute/default/llm/rule/0"


def eg_counter(s: LlmStack, tenant: str, model: str) -> int:
    entries = [(EG_RULE, EG_RULE), ("rule-0-match-0", tenant), ("rule-0-match-1", model)]
    value: int = s.counter_of(EG_DOMAIN, entries)["value"]
    return value


def test_envoy_gateway_usage_based_limits_count_the_response_cost(
    tmp_path: Path, transport: str
) -> None:
    # cost.request 0 checks, cost.response (usage.total_tokens) is what is counted: per
    # tenant and model, 1,000 tokens an hour.
    example = "envoy-gateway-usage"
    config = (EXAMPLES / example / "config" / "llm.yaml").read_text()
    with llm_stack(tmp_path, example, config, record=False, GRPC_TRANSPORT=transport) as s:

        def ask(tenant: str, usage: int) -> int:
            headers = {"x-tenant-id": tenant, "x-ai-eg-model": "gpt", "x-fake-usage": str(usage)}
            return s.chat(None, headers=headers).status

        assert ask("acme", 300) == 200
        wait_for(lambda: eg_counter(s, "acme", "gpt") == 300, 30, "the response cost")
        statuses = [ask("acme", 300)]
        while statuses[-1] == 200:
            n = len(statuses) + 1
            wait_for(lambda n=n: eg_counter(s, "acme", "gpt") == 300 * n, 30, "the cost")
            statuses.append(ask("acme", 300))
            assert len(statuses) < 10
        # Admitted while the count was under the limit (0, 300, 600, 900): the last one
        # took it to 1,200, over by what was in flight; the request-time calls added 0.
        assert statuses == [200, 200, 200, 429]
        assert eg_counter(s, "acme", "gpt") == 1200
        # Each tenant has its own count.
        assert ask("globex", 250) == 200
        wait_for(lambda: eg_counter(s, "globex", "gpt") == 250, 30, "globex's cost")
        assert eg_counter(s, "acme", "gpt") == 1200
