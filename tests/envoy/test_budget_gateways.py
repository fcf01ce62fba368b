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
        assert any(k.endswith(b"_budget") for k in master.client().keys("*"))
