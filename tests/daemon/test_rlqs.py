"""StreamRateLimitQuotas on both gRPC transports, message by message (support.rlqs_client):
assignments from the rule set, bad input, bounds, shutdown, /counters and the statistics."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from support import free_port, http_get, wait_for
from support.daemon import DaemonProcess, daemon_environment, start_daemon, write_config
from support.pki import Pki
from support.rlqs_client import QuotaClient, strategy

from ratelimitd.quota.service import FILL_SECONDS

# A daily limit: a subscription may also spend at the pace that uses the rest of the window
# evenly, which for 30 a day is less than the one request per second its report shows, so
# the first assignment does not depend on when in its window the test runs.
CONFIG = """
domain: rlqs
descriptors:
  - key: name
    value: api
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 30}
  - key: name
    value: open
"""
TOKEN = "admin-token"


@pytest.fixture(params=["native", "grpcio"])
def start(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., DaemonProcess]]:
    """`start(**env)` -> a daemon serving CONFIG on the transport of the parameter."""
    started: list[DaemonProcess] = []
    clients: list[QuotaClient] = []

    def run(**env: str) -> DaemonProcess:
        environ = daemon_environment(
            tmp_path / "runtime",
            **(
                {
                    "BACKEND_TYPE": "memory",
                    "LOG_LEVEL": "warning",
                    "GRPC_TRANSPORT": request.param,
                    "RLQS_BUCKET_KEYS": "name,user",
                    "ADMIN_TOKEN": TOKEN,
                }
                | env
            ),
        )
        write_config(environ, "rlqs.yaml", CONFIG)
        daemon = start_daemon(environ, tmp_path)
        started.append(daemon)
        return daemon

    run.clients = clients  # type: ignore[attr-defined]
    run.transport = request.param  # type: ignore[attr-defined]
    yield run
    for client in clients:
        client.close()
    for daemon in started:
        daemon.close()


def client(start: Callable[..., DaemonProcess], daemon: DaemonProcess) -> QuotaClient:
    c = QuotaClient(daemon.grpc_target)
    start.clients.append(c)  # type: ignore[attr-defined]
    return c


def alice(user: str = "alice") -> dict[str, str]:
    return {"user": user, "name": "api"}


def counters(daemon: DaemonProcess, query: str = "rlqs") -> dict:
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{daemon.debug_port}/counters?{query}",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_a_subscription_is_answered_at_once_from_the_rule(start) -> None:
    daemon = start()
    c = client(start, daemon)
    c.report("rlqs", (alice(), 1, 0, 0.0))  # Envoy's first report: time_elapsed 0s
    action = c.receive().bucket_action[0]
    assert dict(action.bucket_id.bucket) == alice()
    assert action.quota_assignment_action.assignment_time_to_live.seconds == 7
    # 1 request per second over two report periods; the request already admitted by the
    # filter's fallback is charged to the counter as well.
    assert strategy(action) == ("tokens", 10, FILL_SECONDS)
    assert counters(daemon, "rlqs&domain=rlqs")["buckets"][0]["streams"][0]["tokens"] == 10
    stats = daemon.stats()
    assert stats["ratelimit.service.rate_limit.rlqs.name_api.user.total_hits"] == 11


def test_the_same_strategy_is_sent_again_until_more_tokens_are_needed(start) -> None:
    daemon = start()
    c = client(start, daemon)
    c.report("rlqs", (alice(), 0, 1, 0.0))
    first = strategy(c.receive().bucket_action[0])
    assert first == ("tokens", 10, FILL_SECONDS)
    # 2 of the 10 tokens used in 5 s: demand falls, what is left covers it: extended.
    c.report("rlqs", (alice(), 2, 0, 5.0))
    assert strategy(c.receive().bucket_action[0]) == first
    # A busy period: 8 more used, demand up: a new bucket of what is left plus the grant,
    # after a DENY_ALL in the same response (in Envoy 1.40 a token bucket replacing another
    # keeps the old one's state; one replacing a blanket rule starts full).
    c.report("rlqs", (alice(), 8, 30, 5.0))
    deny, topped = (strategy(a) for a in c.receive().bucket_action)
    assert deny == ("DENY_ALL",)
    # The demand wants more than the 20 left of the 30 a day: it gets the 20.
    assert topped == ("tokens", 20, FILL_SECONDS)


def test_streams_share_what_is_left_and_never_exceed_the_limit(start) -> None:
    daemon = start()
    streams = [client(start, daemon) for _ in range(4)]
    granted = 0
    for c in streams:
        # Each asks 20/s: far more than the 30 left.
        c.report("rlqs", (alice("shared"), 0, 20, 1.0))
        s = strategy(c.receive().bucket_action[0])
        granted += s[1] if s[0] == "tokens" else 0
    assert 0 < granted <= 30
    c = streams[-1]
    c.report("rlqs", (alice("shared"), 0, 20, 5.0))
    assert strategy(c.receive().bucket_action[0]) == ("DENY_ALL",)


def test_buckets_without_a_limit_get_allow_all(start) -> None:
    daemon = start()
    c = client(start, daemon)
    c.report("rlqs", ({"name": "open"}, 1, 0, 0.0), ({"name": "nothing"}, 1, 0, None))
    actions = c.receive().bucket_action
    assert [strategy(a) for a in actions] == [("ALLOW_ALL",), ("ALLOW_ALL",)]
    other = client(start, daemon)
    other.report("unknown-domain", (alice(), 1, 0, 0.0))
    assert strategy(other.receive().bucket_action[0]) == ("ALLOW_ALL",)


def test_undecodable_messages_end_the_stream_invalid_argument(start) -> None:
    daemon = start()
    c = client(start, daemon)
    c.send(b"\xff\xff\xff")
    with pytest.raises(grpc.RpcError) as err:
        c.receive()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a RateLimitQuotaUsageReports" in err.value.details()


def test_a_first_report_without_a_domain_or_a_changed_domain_is_refused(start) -> None:
    daemon = start()
    c = client(start, daemon)
    c.report("", (alice(), 1, 0, 0.0))
    with pytest.raises(grpc.RpcError) as err:
        c.receive()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "the first report has no domain"

    c = client(start, daemon)
    c.report("rlqs", (alice(), 1, 0, 0.0))
    c.receive()
    c.report("other", (alice(), 1, 0, 5.0))
    with pytest.raises(grpc.RpcError) as err:
        c.receive()
    assert "a new domain needs a new stream" in err.value.details()


def test_malformed_buckets_and_buckets_past_the_bound_get_no_assignment(start) -> None:
    daemon = start(RLQS_MAX_BUCKETS_PER_STREAM="3", MAX_DESCRIPTOR_VALUE_LENGTH="16")
    c = client(start, daemon)
    c.report(
        "rlqs",
        ({"name": "api", "user": "x" * 17}, 1, 0, 0.0),  # past MAX_DESCRIPTOR_VALUE_LENGTH
        (alice("a"), 1, 0, 0.0),
        (alice("b"), 1, 0, 0.0),
        (alice("c"), 1, 0, 0.0),  # the fourth bucket of the stream: past the bound
    )
    actions = c.receive().bucket_action
    assert [dict(a.bucket_id.bucket)["user"] for a in actions] == ["a", "b"]
    assert daemon.stats()["ratelimit.rlqs.refused_buckets"] == 2
    # A refused bucket stays refused (and counted once against the bound), quietly.
    c.report("rlqs", (alice("a"), 0, 0, 5.0), (alice("c"), 1, 0, 5.0))
    assert [dict(a.bucket_id.bucket)["user"] for a in c.receive().bucket_action] == ["a"]


def test_idle_buckets_are_abandoned_and_ended_streams_forgotten(start) -> None:
    daemon = start(RLQS_IDLE_TIMEOUT="1s")
    c = client(start, daemon)
    c.report("rlqs", (alice("idle"), 1, 0, 0.0))
    assert strategy(c.receive().bucket_action[0])[0] == "tokens"
    assert len(counters(daemon)["buckets"]) == 1

    def abandoned() -> bool:
        c.report("rlqs", (alice("idle"), 0, 0, 1.0))
        return c.receive().bucket_action[0].HasField("abandon_action")

    wait_for(abandoned, 30, "the idle bucket abandoned")
    assert counters(daemon)["buckets"] == []

    other = client(start, daemon)
    other.report("rlqs", (alice("gone"), 1, 0, 0.0))
    other.receive()
    assert daemon.stats()["ratelimit.rlqs.streams"] == 2
    other.done()
    assert other.receive() is None  # ended OK by the server after the client's end
    wait_for(lambda: daemon.stats()["ratelimit.rlqs.streams"] == 1, 10, "the stream forgotten")
    assert counters(daemon)["buckets"] == []


def test_per_bucket_and_per_stream_series(start) -> None:
    daemon = start()
    c = client(start, daemon)
    c.report("rlqs", (alice("m"), 1, 2, 0.0))
    c.receive()
    c.report("rlqs", (alice("m"), 3, 4, 5.0))
    c.receive()
    stats = daemon.stats()
    bucket = "ratelimit.rlqs.bucket.rlqs.name_api.user_m."
    assert stats[bucket + "reports"] == 2
    assert stats[bucket + "allowed"] == 4
    assert stats[bucket + "denied"] == 6
    assert stats[bucket + "assignments"] == 2
    assert stats[bucket + "streams"] == 1
    streams = {k for k in stats if k.startswith("ratelimit.rlqs.stream.")}
    assert {k.rsplit(".", 1)[1] for k in streams} == {
        "reports", "allowed", "denied", "assignments", "buckets", "tokens",
    }  # fmt: skip
    seen = counters(daemon)["buckets"][0]
    assert seen["entries"] == [["name", "api"], ["user", "m"]]
    assert seen["limit"] == 30
    assert seen["streams"][0]["reports"] == 2


def test_sigterm_sends_every_assignment_again_with_ttl_zero(start) -> None:
    daemon = start()
    c = client(start, daemon)
    c.report("rlqs", (alice("t"), 1, 0, 0.0), ({"name": "open"}, 1, 0, 0.0))
    sent = [strategy(a) for a in c.receive().bucket_action]
    assert daemon.terminate() == 0
    last = c.receive()
    assert [strategy(a) for a in last.bucket_action] == sent
    for action in last.bucket_action:
        ttl = action.quota_assignment_action
        assert ttl.HasField("assignment_time_to_live")
        assert ttl.assignment_time_to_live.ToNanoseconds() == 0
    with pytest.raises(grpc.RpcError) as err:
        c.receive()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_streams_past_the_bound_are_refused_even_before_they_report(start) -> None:
    daemon = start(RLQS_MAX_STREAMS="2")
    silent = [client(start, daemon) for _ in range(2)]  # streams that never report
    wait_for(lambda: daemon.stats()["ratelimit.rlqs.streams"] == 2, 20, "two streams open")
    third = client(start, daemon)
    with pytest.raises(grpc.RpcError) as err:
        third.receive()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details() == "RLQS_MAX_STREAMS=2 streams open"
    silent[0].close()
    wait_for(lambda: daemon.stats()["ratelimit.rlqs.streams"] == 1, 20, "the stream forgotten")


def test_the_process_bound_on_buckets_counts_their_size(start) -> None:
    # 3 units: two short buckets, or one whose keys and values pass 256 characters.
    daemon = start(RLQS_MAX_BUCKETS="3", STATS_MAX_REQUEST_SERIES="1")
    c = client(start, daemon)
    c.report("rlqs", ({"name": "api", "user": "u" * 300}, 1, 0, 0.0), (alice("s"), 1, 0, 0.0))
    assert len(c.receive().bucket_action) == 2
    other = client(start, daemon)
    # Both refused: no assignment, so no response at all (an empty one is not valid).
    other.report("rlqs", (alice("t"), 1, 0, 0.0), (alice("u"), 1, 0, 0.0))
    wait_for(lambda: daemon.stats()["ratelimit.rlqs.refused_buckets"] == 2, 20, "refusals")
    stats = daemon.stats()
    assert stats["ratelimit.rlqs.stream_buckets"] == 3
    # STATS_MAX_REQUEST_SERIES=1: one bucket and one stream by name, the rest folded.
    buckets = {k.split(".")[3] for k in stats if k.startswith("ratelimit.rlqs.bucket.")}
    assert len(buckets) == 2 and "_overflow" in buckets
    assert stats["ratelimit.rlqs.bucket._overflow.reports"] == 1


def test_bucket_and_stream_series_on_prometheus_as_labels(start) -> None:
    port = free_port()
    daemon = start(USE_PROMETHEUS="true", PROMETHEUS_ADDR=f"127.0.0.1:{port}")
    c = client(start, daemon)
    c.report("rlqs", (alice("prom"), 2, 3, 0.0))
    c.receive()
    _, body = http_get(f"http://127.0.0.1:{port}/metrics")
    lines = body.decode().splitlines()
    bucket = '{bucket="name_api.user_prom",domain="rlqs"}'
    assert f"ratelimit_rlqs_bucket_allowed{bucket} 2" in lines
    assert f"ratelimit_rlqs_bucket_denied{bucket} 3" in lines
    assert any(line.startswith("ratelimit_rlqs_stream_reports{stream=") for line in lines)
    assert "ratelimit_rlqs_streams 1" in lines


def test_mtls_with_client_san_as_the_rls_port(start, tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    certs = Pki(tmp_path / "pki")
    daemon = start(
        **certs.server_env(),
        GRPC_CLIENT_TLS_CACERT=str(certs.ca),
        GRPC_CLIENT_TLS_SAN="client.example.com",
    )
    target = f"localhost:{daemon.grpc_port}"
    good = QuotaClient(target, grpc.secure_channel(target, certs.creds(certs.ca, certs.client)))
    start.clients.append(good)  # type: ignore[attr-defined]
    good.report("rlqs", (alice("tls"), 1, 0, 0.0))
    assert strategy(good.receive().bucket_action[0])[0] == "tokens"
    # A wrong SAN: refused at the handshake (native) or per call (grpc.aio), as for RLS.
    wrong = QuotaClient(target, grpc.secure_channel(target, certs.creds(certs.ca, certs.other)))
    start.clients.append(wrong)  # type: ignore[attr-defined]
    wrong.report("rlqs", (alice("tls"), 1, 0, 0.0))
    with pytest.raises(grpc.RpcError) as err:
        wrong.receive()
    assert err.value.code() == (
        grpc.StatusCode.UNAVAILABLE
        if start.transport == "native"  # type: ignore[attr-defined]
        else grpc.StatusCode.UNAUTHENTICATED
    )
