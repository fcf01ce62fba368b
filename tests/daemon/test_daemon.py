"""The daemon as users run it: a subprocess on free ports, driven over real sockets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import REPO, free_port, wait_for
from support.daemon import write_config

from ratelimitd.backends import load_settings
from ratelimitd.messages import OK, OVER_LIMIT
from ratelimitd.transport.client import RateLimitError
from ratelimitd.transport.protocodec import METHOD_PATH, decode_response, encode_request

LIMITED = """\
domain: test
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: open
    rate_limit:
      unlimited: true
"""


def test_grpc_and_json_decisions(grpc_env, start_daemon) -> None:
    write_config(grpc_env, "test.yaml", LIMITED)
    d = start_daemon(grpc_env)
    codes = [d.decide("test", [("user", "alice")]).overall_code for _ in range(3)]
    assert codes == [OK, OK, OVER_LIMIT]
    unlimited = d.decide("test", [("open", "x")]).statuses[0]
    assert (unlimited.code, unlimited.limit_remaining) == (OK, 4294967295)

    status, body = d.decide_json("test", {"user": "bob"})
    assert status == 200
    assert body["overallCode"] == "OK"
    assert body["statuses"][0]["currentLimit"] == {"requestsPerUnit": 2, "unit": "MINUTE"}
    assert body["statuses"][0]["limitRemaining"] == 1
    d.decide_json("test", {"user": "bob"})
    assert d.decide_json("test", {"user": "bob"})[0] == 429
    assert d.http("/json", b"{not json")[0] == 400
    assert d.decide_json("nowhere", {"user": "bob"}) == (
        200,
        {"overallCode": "OK", "statuses": [{"code": "OK"}]},
    )

    stats = d.stats()
    assert stats["ratelimit.service.rate_limit.test.user.total_hits"] == 6
    assert stats["ratelimit.service.rate_limit.test.user.over_limit"] == 2
    assert stats["ratelimit.service.rate_limit.nowhere.domain_not_found"] == 1
    assert stats["ratelimit.service.config_load_success"] == 1
    assert stats["ratelimit_server.ShouldRateLimit.total_requests"] == 4
    assert d.debug("/rlconfig") == (
        200,
        b"test.user: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"
        b"test.open: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n",
    )
    index = d.debug("/")[1].decode()
    assert "/rlconfig: print out the currently loaded configuration for debugging" in index
    assert d.terminate() == 0


def _limited_daemon(grpc_env, start_daemon, backend, request):
    """A daemon serving LIMITED on `backend` (memory, or Redis on a fresh server)."""
    write_config(grpc_env, "test.yaml", LIMITED)
    env = dict(grpc_env, BACKEND_TYPE=backend)
    if backend == "redis":
        server = request.getfixturevalue("redis_server")
        env.update(REDIS_SOCKET_TYPE="tcp", REDIS_URL=server.address)
    d = start_daemon(env)
    return d


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_answers_with_nothing_to_count_between_decided_ones(
    grpc_env, start_daemon, backend, request
) -> None:
    """Unknown domains and unmatched descriptors (one shared answer per number of
    descriptors, its encoding reused) interleaved with decided calls: each gets its own,
    on the synchronous route (memory) and the one that waits for the store (Redis)."""
    d = _limited_daemon(grpc_env, start_daemon, backend, request)
    for i in range(3):
        for n in (1, 2, 1):
            r = d.decide("nowhere", *[[("user", "x")]] * n)
            assert r.overall_code == OK
            assert [(s.code, s.limit_remaining) for s in r.statuses] == [(OK, 0)] * n
            assert all(s.rule is None for s in r.statuses)
        r = d.decide("test", [("user", f"u{i}")])
        assert (r.statuses[0].code, r.statuses[0].limit_remaining) == (OK, 1)
        r = d.decide("test", [("nothing", "here")])
        assert r.statuses[0].rule is None
    stats = d.stats()
    assert stats["ratelimit.service.rate_limit.nowhere.domain_not_found"] == 12
    assert stats["ratelimit_server.ShouldRateLimit.total_requests"] == 15
    assert d.terminate() == 0


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_unknown_domains_answered_undecoded_are_counted(
    grpc_env, start_daemon, backend, request
) -> None:
    """Runs of unknown domains, which the native transport answers without decoding them
    once it has seen their domain (their count kept in C until the statistics are read):
    `domain_not_found` per descriptor and `total_requests` per call, as the reference counts
    them, read between runs and after a switch from one unknown domain to another."""
    d = _limited_daemon(grpc_env, start_daemon, backend, request)
    for _ in range(5):
        assert d.decide("nowhere", [("user", "x")]).overall_code == OK
    stats = d.stats()
    assert stats["ratelimit.service.rate_limit.nowhere.domain_not_found"] == 5
    for _ in range(4):
        assert len(d.decide("nowhere", [("user", "x")], [("user", "y")]).statuses) == 2
        d.decide("elsewhere", [("user", "x")])
    for _ in range(3):
        d.decide("elsewhere", [("user", "x")])
    r = d.decide("test", [("user", "alice")])
    assert r.statuses[0].limit_remaining == 1
    stats = d.stats()
    assert stats["ratelimit.service.rate_limit.nowhere.domain_not_found"] == 5 + 8
    assert stats["ratelimit.service.rate_limit.elsewhere.domain_not_found"] == 7
    assert stats["ratelimit.service.rate_limit.test.user.total_hits"] == 1
    assert stats["ratelimit_server.ShouldRateLimit.total_requests"] == 5 + 8 + 3 + 1
    assert d.terminate() == 0


def test_service_errors_over_grpc(grpc_env, start_daemon) -> None:
    write_config(grpc_env, "test.yaml", LIMITED)
    d = start_daemon(grpc_env)
    for domain, descriptors, message in [
        ("", [[("user", "a")]], "rate limit domain must not be empty"),
        ("test", [], "rate limit descriptor list must not be empty"),
    ]:
        with pytest.raises(RateLimitError) as err:
            d.decide(domain, *descriptors)
        assert err.value.code == grpc.StatusCode.UNKNOWN
        assert err.value.details == message
    assert d.stats()["ratelimit.service.call.should_rate_limit.service_error"] == 2


def test_reload_on_file_write_keeps_serving_through_a_broken_file(daemon_env, start_daemon) -> None:
    path = write_config(daemon_env, "test.yaml", LIMITED)
    d = start_daemon(daemon_env)
    assert d.decide("test", [("user", "a")]).statuses[0].rule.requests_per_unit == 2

    path.write_text(LIMITED.replace("requests_per_unit: 2", "requests_per_unit: 7"))
    wait_for(
        lambda: d.decide("test", [("user", "a")]).statuses[0].rule.requests_per_unit == 7,
        what="reload after a write",
    )
    path.write_text(
        "domain: test\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight}\n"
    )
    wait_for(lambda: d.stats()["ratelimit.service.config_load_error"] >= 1, what="rejected reload")
    assert "config.test.yaml" not in d.log()  # watch_root=false names files by their bare name
    assert "test.yaml: invalid rate limit unit 'fortnight'" in d.log()
    # The previous config keeps serving.
    assert d.decide("test", [("user", "b")]).statuses[0].rule.requests_per_unit == 7

    # Adding and removing a file both reload.
    write_config(
        daemon_env,
        "other.yaml",
        "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n",
    )
    path.unlink()
    wait_for(lambda: d.decide("other", [("k", "v")]).statuses[0].rule is not None, what="add")
    assert d.decide("test", [("user", "a")]).statuses[0].rule is None
    assert d.terminate() == 0


def test_reload_by_symlink_swap(daemon_env, start_daemon, tmp_path: Path) -> None:
    for version, limit in (("v1", 3), ("v2", 9), ("v3", None)):
        config = tmp_path / version / "config"
        config.mkdir(parents=True)
        text = LIMITED.replace("requests_per_unit: 2", f"requests_per_unit: {limit}")
        (config / "test.yaml").write_text(text if limit else "domain: [broken\n")
    current = tmp_path / "current"
    current.symlink_to(tmp_path / "v1")
    env = dict(daemon_env, RUNTIME_ROOT=str(current), RUNTIME_WATCH_ROOT="true")
    d = start_daemon(env)
    assert d.decide("test", [("user", "a")]).statuses[0].rule.requests_per_unit == 3
    assert "test.user" in d.debug("/rlconfig")[1].decode()

    def swap(target: str) -> None:
        tmp = tmp_path / "current.tmp"
        tmp.symlink_to(tmp_path / target)
        os.replace(tmp, current)

    swap("v2")
    wait_for(
        lambda: d.decide("test", [("user", "a")]).statuses[0].rule.requests_per_unit == 9,
        what="reload after the symlink swap",
    )
    swap("v3")
    wait_for(lambda: d.stats()["ratelimit.service.config_load_error"] >= 1, what="rejected swap")
    assert "config.test.yaml: error loading config file" in d.log()
    assert d.decide("test", [("user", "b")]).statuses[0].rule.requests_per_unit == 9
    assert d.terminate() == 0


def test_health_follows_config_and_sigterm(grpc_env, start_daemon) -> None:
    env = dict(grpc_env, HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED="true")
    path = write_config(env, "test.yaml", LIMITED)
    d = start_daemon(env)
    stub = health_pb2_grpc.HealthStub(d.channel())
    check = lambda name: stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status  # noqa: E731
    assert check("ratelimit") == health_pb2.HealthCheckResponse.SERVING
    assert check("") == health_pb2.HealthCheckResponse.SERVING

    # A successful load with no domain turns the config component unhealthy.
    path.write_text("")
    write_config(env, "empty.yaml", "")
    path.unlink()
    (Path(env["RUNTIME_ROOT"]) / "config" / "empty.yaml").unlink()
    wait_for(lambda: d.http("/healthcheck")[0] == 500, what="unhealthy with no domain")
    assert d.http("/healthcheck")[1] == b""
    assert check("ratelimit") == health_pb2.HealthCheckResponse.NOT_SERVING
    write_config(env, "test.yaml", LIMITED)
    wait_for(lambda: d.http("/healthcheck") == (200, b"OK"), what="healthy again")
    assert d.terminate() == 0


def test_json_logs_from_the_first_line_to_the_last(daemon_env, start_daemon) -> None:
    # Upstream #1192: LOG_FORMAT applies before anything is logged, start-up lines included
    # (the backend choice, the listeners, the config load) and the drain at SIGTERM.
    write_config(daemon_env, "test.yaml", LIMITED)
    d = start_daemon(dict(daemon_env, LOG_FORMAT="json"))
    assert d.decide_json("test", {"key": "k", "value": "v"})[0] == 200
    assert d.terminate() == 0
    lines = d.log().splitlines()
    assert len(lines) >= 3
    for line in lines:
        record = json.loads(line)
        if record.get("logger") == "gostats.loggingsink":
            continue  # the stats sink's own zap lines, JSON whatever LOG_FORMAT says (gostats)
        assert {"@timestamp", "level", "@message"} <= set(record), line
    assert any("@message" in json.loads(line) for line in lines[:1])


def test_sigterm_drains_an_in_flight_request(daemon_env, start_daemon) -> None:
    write_config(daemon_env, "test.yaml", LIMITED)
    d = start_daemon(dict(daemon_env, DEBUG_PROFILE_ENABLED="true"))  # a 2 s request
    result: dict[str, object] = {}

    def profile() -> None:
        result["reply"] = d.debug("/debug/pprof/profile?seconds=2")

    worker = threading.Thread(target=profile)
    worker.start()
    time.sleep(0.5)  # let the request reach the server before the signal
    d.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: not d.ready() if d.proc.poll() is None else True, what="stop accepting")
    worker.join(15)
    status, body = result["reply"]  # type: ignore[misc]
    assert status == 200 and b"CPU profile" in body
    assert d.proc.wait(20) == 0


def test_invalid_setting_stops_startup_with_one_line(daemon_env, serve_until_exit) -> None:
    env = dict(daemon_env, REDIS_TYPE="galaxy", BACKEND_TYPE="redis")
    out = serve_until_exit(env, 30)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "ratelimitd: REDIS_TYPE: invalid value 'galaxy' (accepted: single, sentinel, cluster)"
    ]


def test_workers_share_ports_and_a_killed_worker_is_replaced(grpc_env, start_daemon) -> None:
    write_config(grpc_env, "test.yaml", LIMITED)
    d = start_daemon(dict(grpc_env, RATELIMITD_WORKERS="2"))
    workers = d.worker_pids

    wait_for(lambda: len(workers()) == 2, what="two workers")
    first = workers()
    os.kill(first[0], signal.SIGKILL)
    wait_for(lambda: len(workers()) == 2 and first[0] not in workers(), what="worker restarted")
    wait_for(d.ready, what="serving after the restart")
    for _ in range(20):
        assert d.decide("nowhere", [("k", "v")]).overall_code == OK
    assert d.terminate() == 0
    assert not workers()


def test_run_script_example_config_ok_then_over_limit(tmp_path: Path) -> None:
    """The README's run command config and client: OK, then OVER_LIMIT."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "MEMCACHE_"))}
    grpc_port = free_port()
    env.update(
        PORT=str(free_port()),
        GRPC_PORT=str(grpc_port),
        DEBUG_PORT=str(free_port()),
        RUNTIME_ROOT=str(REPO / "examples"),
        RUNTIME_APPDIRECTORY="config",
        RUNTIME_WATCH_ROOT="false",
        USE_STATSD="false",
        PYTHONPATH=str(REPO),
    )
    proc = subprocess.Popen([sys.executable, "-m", "ratelimitd"], env=env, start_new_session=True)
    try:
        client = [
            sys.executable,
            "-m",
            "ratelimitd",
            "client",
            "-dial_string",
            f"127.0.0.1:{grpc_port}",
            "-domain",
            "example",
            "-descriptors",
            "user=readme",
        ]
        wait_for(
            lambda: (
                subprocess.run(
                    [*client[:-2], "-descriptors", "probe=1"],
                    env=env,
                    capture_output=True,
                    check=False,
                ).returncode
                == 0
            ),
            what="example daemon",
        )
        for attempt in range(2):  # a minute boundary between the two calls resets the count
            client[-1] = f"user=readme{attempt}"
            first = subprocess.run(client, env=env, capture_output=True, text=True, check=True)
            second = subprocess.run(client, env=env, capture_output=True, text=True, check=True)
            assert "overall_code:OK" in first.stdout
            if "overall_code:OVER_LIMIT" in second.stdout:
                break
        else:
            raise AssertionError(second.stdout)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def test_mtls_with_client_san(grpc_env, start_daemon, certs) -> None:
    write_config(grpc_env, "test.yaml", LIMITED)
    env = dict(
        grpc_env,
        GRPC_SERVER_USE_TLS="true",
        GRPC_SERVER_TLS_CERT=str(certs.server[0]),
        GRPC_SERVER_TLS_KEY=str(certs.server[1]),
        GRPC_CLIENT_TLS_CACERT=str(certs.ca),
        GRPC_CLIENT_TLS_SAN="client.example.com",
    )
    d = start_daemon(env)
    target = f"localhost:{d.grpc_port}"

    def call(creds: grpc.ChannelCredentials) -> object:
        with grpc.secure_channel(target, creds) as channel:
            raw = channel.unary_unary(METHOD_PATH)(
                encode_request("test", [[("user", "tls")]]), timeout=10
            )
            return decode_response(raw).overall_code

    assert call(certs.creds(certs.ca, certs.client)) == OK
    # The native transport refuses a wrong SAN at the handshake (as the reference does),
    # grpc.aio per call.
    wrong_san = (
        grpc.StatusCode.UNAVAILABLE
        if env["GRPC_TRANSPORT"] == "native"
        else grpc.StatusCode.UNAUTHENTICATED
    )
    for creds, code in [
        (certs.creds(certs.ca), grpc.StatusCode.UNAVAILABLE),  # no client certificate
        (certs.creds(certs.ca, certs.other), wrong_san),  # wrong SAN
    ]:
        try:
            call(creds)
        except grpc.RpcError as err:
            assert err.code() == code
        else:
            raise AssertionError("expected the call to be refused")

    # The reference client's TLS flags.
    out = subprocess.run(
        [
            sys.executable, "-m", "ratelimitd", "client", "-dial_string", target,
            "-domain", "test", "-descriptors", "user=cli", "-grpc-use-tls",
            "-grpc-server-ca-file", str(certs.ca), "-grpc-cert-file", str(certs.client[0]),
            "-grpc-key-file", str(certs.client[1]),
        ],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "overall_code:OK" in out.stdout
    assert d.terminate() == 0


def test_native_transport_is_live_by_default(daemon_env, start_daemon) -> None:
    """Without GRPC_TRANSPORT the daemon serves gRPC on the compiled HTTP/2 core."""
    import ratelimitd.transport._h2  # noqa: F401  (a normal install builds it)

    from ratelimitd.process.daemon import build
    from ratelimitd.transport.native import NativeGrpcTransport

    env = {k: v for k, v in daemon_env.items() if k != "GRPC_TRANSPORT"}
    assert isinstance(build(load_settings(env)).grpc, NativeGrpcTransport)
    write_config(env, "test.yaml", LIMITED)
    d = start_daemon(env)
    assert d.decide("test", [("user", "a")]).overall_code == OK
    assert "gRPC (native HTTP/2) listening on" in d.log()
    assert d.terminate() == 0


def test_without_the_native_extension_grpc_aio_serves(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A build without libnghttp2.so.14: grpc.aio with one warning; asking for the native
    transport explicitly then stops start-up."""
    from ratelimitd.process import daemon
    from ratelimitd.transport.grpc import GrpcConfigError, GrpcTransport

    monkeypatch.setattr(daemon, "NativeGrpcTransport", None)
    built = daemon.build(load_settings({"BACKEND_TYPE": "memory"}))
    assert isinstance(built.grpc, GrpcTransport)
    warnings = [r.getMessage() for r in caplog.records if "native gRPC transport" in r.getMessage()]
    assert warnings == [
        "the native gRPC transport was not built (no libnghttp2.so.14 at install): "
        "serving gRPC with grpc.aio"
    ]
    with pytest.raises(GrpcConfigError, match="GRPC_TRANSPORT=native"):
        daemon.build(load_settings({"BACKEND_TYPE": "memory", "GRPC_TRANSPORT": "native"}))
