"""REDIS_TYPE=cluster: three masters, keys spread over slots, a slot migrated while serving."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from support import wait_for
from support.core import suite_config

from ratelimitd.backends.base import BackendError
from ratelimitd.backends.redis import key_slot
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor, Request

NOW = 1_000_000

# d: k 1000/h, small 2/h, sliding 2/s sliding window, bucket 2/s token bucket, two 2/s token
# bucket and 5/h (hourly).
CONFIG = suite_config("redis_cluster")


def clock() -> float:
    return float(NOW)


@pytest.fixture(scope="module")
def cluster(module_servers):
    """Three masters joined by `redis-cli --cluster create`, shared by this module's tests.

    Each test starts from empty nodes; the slot map may differ (a test migrates a slot),
    so tests look owners up; the node-down test runs last.
    """
    return module_servers.cluster(3)


@pytest.fixture(autouse=True)
def empty(cluster):
    for n in cluster:
        if n.proc.poll() is None:
            n.client().flushall()


def owner(nodes, key: str):
    """The node that owns a key's slot, according to the servers."""
    slot = nodes[0].client().cluster("keyslot", key)
    assert slot == key_slot(key.encode())
    for n in nodes:
        for start, end, *_ in n.client().execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return next(m for m in nodes if m.port == int(_[0][1]))
    raise AssertionError(f"slot {slot} not served")


async def test_keys_spread_over_nodes_one_pipeline_each(cluster, decider) -> None:
    seeds = ",".join(n.address for n in cluster[:2])
    d = await decider({"REDIS_TYPE": "cluster", "REDIS_URL": seeds}, CONFIG, clock=clock)
    descriptors = [[("k", f"v{i}")] for i in range(24)]
    before = d.backend.writes
    r = await d.decide("d", *descriptors)
    assert r.overall_code == OK
    # One pipeline per node for the whole request.
    assert d.backend.writes - before == 3
    keys = [f"d_k_v{i}_997200" for i in range(24)]
    owners = {owner(cluster, k).port for k in keys}
    assert len(owners) == 3
    for k in keys:
        node = owner(cluster, k)
        assert node.client().get(k) == b"1"
        assert 3599 <= node.client().ttl(k) <= 3600
    assert sum(n.client().dbsize() for n in cluster) == 24
    assert d.stat("ratelimit.redis_pool.cx_active") == 6  # pool of 2 per master


async def test_delete_routes_each_key_to_its_node(cluster, decider) -> None:
    # An admin's reset (DELETE /counters) on a cluster: DEL per key, per owning node.
    seeds = ",".join(n.address for n in cluster[:2])
    d = await decider({"REDIS_TYPE": "cluster", "REDIS_URL": seeds}, CONFIG, clock=clock)
    await d.decide("d", *[[("k", f"v{i}")] for i in range(12)])
    keys = [f"d_k_v{i}_997200" for i in range(12)]
    assert await d.backend.delete([*keys, "absent"]) == 12
    assert sum(n.client().dbsize() for n in cluster) == 0


async def test_stop_increment_get_round_on_cluster(cluster, decider) -> None:
    d = await decider(
        {
            "REDIS_TYPE": "cluster",
            "REDIS_URL": cluster[0].address,
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true",
        },
        CONFIG,
        clock=clock,
    )
    for _ in range(2):
        assert (await d.decide("d", [("k", "a")], [("small", "b")])).overall_code == OK
    r = await d.decide("d", [("k", "a")], [("small", "b")])
    assert r.overall_code == OVER_LIMIT
    assert owner(cluster, "d_k_a_997200").client().get("d_k_a_997200") == b"2"
    assert owner(cluster, "d_small_b_997200").client().get("d_small_b_997200") == b"3"


async def test_algorithms_on_cluster_one_pipeline_per_node(cluster, decider) -> None:
    d = await decider(
        {"REDIS_TYPE": "cluster", "REDIS_URL": cluster[0].address}, CONFIG, clock=clock
    )
    descriptors = [[(k, f"v{i}")] for i in range(8) for k in ("sliding", "bucket", "two")]
    r = await d.decide("d", *descriptors)  # every master has the scripts since the start
    assert {s.code for s in r.statuses} == {OK}
    before = d.backend.writes
    for expected in (OK, OVER_LIMIT):
        r = await d.decide("d", *descriptors)
        assert {s.code for s in r.statuses} == {expected}
    assert d.backend.writes - before == 6  # one script call per key, one pipeline per node
    keys = [f"d_sliding_v{i}_1s_sliding_window" for i in range(8)]
    keys += [f"d_two_v{i}_997200_3600s" for i in range(8)]
    assert len({owner(cluster, k).port for k in keys}) == 3
    for i in range(8):
        node = owner(cluster, f"d_sliding_v{i}_1s_sliding_window")
        assert node.client().hget(f"d_sliding_v{i}_1s_sliding_window", "c") == b"2"
        assert (
            owner(cluster, f"d_two_v{i}_997200_3600s").client().get(f"d_two_v{i}_997200_3600s")
            == b"3"
        )  # every limit counts every hit
    for n in cluster:  # the scripts are loaded again where they are missing
        n.client().script_flush()
    r = await d.decide("d", [("bucket", "new")], [("sliding", "new")])
    assert [s.code for s in r.statuses] == [OK, OK]


async def test_refunds_on_cluster_route_by_their_key(cluster, decider) -> None:
    # The refund script declares its key, so each call goes to the key's own master (no
    # CROSSSLOT, no MOVED), all nodes' calls in one round.
    d = await decider(
        {"REDIS_TYPE": "cluster", "REDIS_URL": cluster[0].address}, CONFIG, clock=clock
    )
    values = [f"v{i}" for i in range(12)]
    await d.decide("d", *([("k", v)] for v in values))
    await d.decide("d", *([("k", v)] for v in values))
    refunds = [Descriptor((("k", v),), hits_addend=1, is_negative_hits=True) for v in values]
    redirects = d.backend.main.redirects
    r = await d.service.should_rate_limit(Request("d", refunds))
    assert [(s.code, s.limit_remaining) for s in r.statuses] == [(OK, 999)] * 12
    assert d.backend.main.redirects == redirects
    keys = [f"d_k_{v}_997200" for v in values]
    assert len({owner(cluster, k).port for k in keys}) == 3
    assert all(owner(cluster, k).client().get(k) == b"1" for k in keys)


def one_value_per_node(nodes) -> list[str]:
    """Three values whose `k` keys live on three different masters, in node order."""
    found: dict[int, str] = {}
    for i in range(1000):
        value = f"p{i}"
        found.setdefault(owner(nodes, f"d_k_{value}_997200").port, value)
        if len(found) == 3:
            return list(found.values())
    raise AssertionError("no three values on three nodes")


@pytest.mark.parametrize(("parallelism", "reached"), [("1", 0), ("2", 1), ("0", 2)])
async def test_pipeline_parallelism_bounds_node_pipelines_in_flight(
    cluster, decider, parallelism: str, reached: int
) -> None:
    # REDIS_CLUSTER_PIPELINE_PARALLELISM as the reference reads it: 1 (its default) sends a
    # request's node pipelines one after another, N at most N at once, 0 all at once. With
    # the first node stopped, the nodes after it see the request only within the bound.
    d = await decider(
        {
            "REDIS_TYPE": "cluster",
            "REDIS_URL": cluster[0].address,
            "REDIS_CLUSTER_PIPELINE_PARALLELISM": parallelism,
            "REDIS_REQUEST_TIMEOUT": "300ms",
        },
        CONFIG,
        clock=clock,
    )
    values = one_value_per_node(cluster)
    first = owner(cluster, f"d_k_{values[0]}_997200")
    first.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(BackendError):
            await d.decide("d", *([("k", v)] for v in values))
    finally:
        first.proc.send_signal(signal.SIGCONT)
    later = [owner(cluster, f"d_k_{v}_997200").client().get(f"d_k_{v}_997200") for v in values[1:]]
    assert later == [b"1"] * reached + [None] * (2 - reached)
    # Served normally once the node is back: every key counted, one pipeline per node.
    wait_for(lambda: first.client().ping(), what="node back")
    before = d.backend.writes
    r = await d.decide("d", *([("k", v)] for v in values))
    assert r.overall_code == OK
    assert d.backend.writes - before == 3


async def test_slot_migrated_while_serving(cluster, decider) -> None:
    d = await decider(
        {"REDIS_TYPE": "cluster", "REDIS_URL": cluster[0].address}, CONFIG, clock=clock
    )
    key = "d_k_hot_997200"
    slot = key_slot(key.encode())
    source = owner(cluster, key)
    target = next(n for n in cluster if n is not source)
    ids = {n.port: n.client().execute_command("CLUSTER", "MYID").decode() for n in cluster}
    assert (await d.decide("d", [("k", "hot")])).overall_code == OK

    served = 0
    stop = asyncio.Event()

    async def serve() -> None:
        nonlocal served
        while not stop.is_set():
            r = await d.decide("d", [("k", "hot")], [("k", "other")])
            assert r.overall_code == OK
            served += 1
            await asyncio.sleep(0.001)

    def migrate() -> None:
        src, dst = source.client(), target.client()
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])
        time.sleep(0.1)  # serve while the slot is half-migrated (ASK for new keys)
        for k in src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", target.port, k, 0, 5000)
        time.sleep(0.1)  # the key lives on the target now: ASK redirections
        for n in (target, source, *(n for n in cluster if n not in (source, target))):
            n.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target.port])
        time.sleep(0.1)  # MOVED from the source from here on

    servers_task = [asyncio.ensure_future(serve()) for _ in range(3)]
    try:
        await asyncio.to_thread(migrate)
    finally:
        stop.set()
        await asyncio.gather(*servers_task)
    assert served > 10
    assert target.client().get(key) == str(served + 1).encode()
    assert source.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    cluster_instance = d.backend.main
    assert cluster_instance.asks > 0  # half-migrated slot
    assert cluster_instance.redirects > cluster_instance.asks  # MOVED after the hand-over
    assert cluster_instance.refreshes >= 2  # startup + after MOVED
    assert cluster_instance.slots[slot] == target.address
    # The next request goes straight to the new owner.
    redirects = cluster_instance.redirects
    await d.decide("d", [("k", "hot")])
    assert cluster_instance.redirects == redirects


async def test_cluster_node_down_fails_fast(cluster, decider) -> None:
    # Last in the module: it stops a node of the shared cluster.
    d = await decider(
        {"REDIS_TYPE": "cluster", "REDIS_URL": cluster[0].address, "REDIS_POOL_SIZE": "1"},
        CONFIG,
        clock=clock,
    )
    victim = owner(cluster, "d_k_x_997200")
    victim.stop()
    start = time.monotonic()
    with pytest.raises(BackendError):
        await d.decide("d", [("k", "x")])
    assert time.monotonic() - start < 0.5
