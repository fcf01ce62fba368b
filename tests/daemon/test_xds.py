"""CONFIG_TYPE=GRPC_XDS_SOTW: the daemon (a subprocess) against a real ADS management server.

The server (tests/support/ads_server.py) runs in this process on its own port and serves
RateLimitConfig snapshots the way go-control-plane's snapshot cache does; it records every
ACK and NACK. Covers the reference's provider tests (initial config, update, several
domains, deeper limits, merged domains) plus NACK keeping the last good config, the server
down at start (with and without FORCE_START_WITHOUT_INITIAL_CONFIG), a server restart,
node id/metadata and additional headers as the server sees them, and TLS / mTLS with the
test PKI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from support import free_port, wait_for
from support.ads_server import AdsServer, Unit, rl_config, rl_descriptor
from support.daemon import DaemonProcess
from support.pki import Pki

from ratelimitd.messages import OK, OVER_LIMIT
from ratelimitd.transport.client import RateLimitError

FOO_V1 = rl_config("foo", "foo", rl_descriptor("k1", "v1", unit=Unit.MINUTE, requests_per_unit=3))
FOO_V2 = rl_config("foo", "foo", rl_descriptor("k2", "v2", unit=Unit.MINUTE, requests_per_unit=5))
BAR = rl_config("bar", "bar", rl_descriptor("k1", "v1", unit=Unit.MINUTE, requests_per_unit=100))
DUMP_V1 = "foo.k1_v1: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false\n"
DUMP_V2 = "foo.k2_v2: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false\n"


@pytest.fixture
def ads() -> Iterator[AdsServer]:
    """A management server on a free port (not started: the test starts it)."""
    server = AdsServer(free_port(), node_id="test-node")
    yield server
    server.stop()


@pytest.fixture
def xds_env(daemon_env: dict[str, str], ads: AdsServer) -> dict[str, str]:
    """A daemon configured by `ads`, retrying fast."""
    daemon_env.update(
        CONFIG_TYPE="GRPC_XDS_SOTW",
        CONFIG_GRPC_XDS_SERVER_URL=f"127.0.0.1:{ads.port}",
        CONFIG_GRPC_XDS_NODE_ID="test-node",
        CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL="100ms",
        XDS_CLIENT_BACKOFF_INITIAL_INTERVAL="100ms",
        XDS_CLIENT_BACKOFF_MAX_INTERVAL="1s",
    )
    return daemon_env


def rlconfig(d: DaemonProcess) -> str:
    status, body = d.debug("/rlconfig")
    assert status == 200
    return body.decode()


def health(d: DaemonProcess) -> int | None:
    """The /healthcheck status, None while the port is closed."""
    try:
        return d.http("/healthcheck")[0]
    except OSError:
        return None


def dump_lines(d: DaemonProcess) -> list[str]:
    return sorted(rlconfig(d).splitlines())


def test_initial_config_update_nack_and_recovery(
    ads: AdsServer, xds_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    ads.set_snapshot("1", [FOO_V1])
    ads.start()
    xds_env.update(
        CONFIG_GRPC_XDS_NODE_METADATA="zone=z1,role=rl=x",
        CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS="X-Tenant:blue,authorization:Bearer t:1",
    )
    d = start_daemon(xds_env)

    # Initial config: in force before the first port opened, and ACKed.
    assert rlconfig(d) == DUMP_V1
    ack = ads.wait_ack("1").request
    assert (ack.version_info, ack.type_url) == ("1", ads.sent[0].type_url)
    subscribe = ads.received[0]
    assert (subscribe.request.version_info, subscribe.request.response_nonce) == ("", "")
    assert list(subscribe.request.resource_names) == []  # wildcard
    assert subscribe.request.node.id == "test-node"
    meta = subscribe.request.node.metadata.fields
    assert {k: v.string_value for k, v in meta.items()} == {"zone": "z1", "role": "rl=x"}
    # Additional headers arrive as gRPC metadata, keys lower-cased.
    assert subscribe.metadata["x-tenant"] == "blue"
    assert subscribe.metadata["authorization"] == "Bearer t:1"
    codes = [d.decide("foo", [("k1", "v1")]).overall_code for _ in range(4)]
    assert codes == [OK, OK, OK, OVER_LIMIT]

    # Update.
    ads.set_snapshot("2", [FOO_V2])
    assert ads.wait_ack("2").request.version_info == "2"
    wait_for(lambda: rlconfig(d) == DUMP_V2, what="config v2")

    # A bad config is NACKed with the file provider's message; the last good one serves on.
    bad = rl_config("broken", "foo", rl_descriptor("k3", unit=Unit.UNKNOWN, requests_per_unit=1))
    ads.set_snapshot("3", [bad])
    nack = ads.wait_nack("3").request
    assert nack.version_info == "2"  # the last ACKed version
    assert nack.error_detail.message == "broken: invalid rate limit unit 'UNKNOWN'"
    assert rlconfig(d) == DUMP_V2
    assert d.decide("foo", [("k2", "v2")]).overall_code == OK
    assert "Error loading new configuration: broken: invalid rate limit unit 'UNKNOWN'" in d.log()

    # The next good config is applied.
    ads.set_snapshot("4", [FOO_V1])
    ads.wait_ack("4")
    wait_for(lambda: rlconfig(d) == DUMP_V1, what="config v4")
    stats = d.stats()
    assert stats["ratelimit.service.config_load_success"] == 3
    assert stats["ratelimit.service.config_load_error"] == 1
    assert all(r.stream == 1 for r in ads.received)  # one stream throughout
    assert d.terminate() == 0


def test_several_resources_and_merged_domains(
    ads: AdsServer, xds_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    ads.set_snapshot("1", [FOO_V1, BAR])
    ads.start()
    d = start_daemon(xds_env)
    assert dump_lines(d) == sorted(
        [
            "foo.k1_v1: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false",
            "bar.k1_v1: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false",
        ]
    )
    assert d.decide("bar", [("k1", "v1")]).statuses[0].limit_remaining == 99

    # Two resources for one domain: refused without MERGE_DOMAIN_CONFIG...
    foo_2 = rl_config(
        "foo-2", "foo", rl_descriptor("k1", "v2", unit=Unit.HOUR, requests_per_unit=9)
    )
    ads.set_snapshot("2", [FOO_V1, foo_2])
    nack = ads.wait_nack("2").request
    assert nack.error_detail.message == "foo-2: duplicate domain 'foo' in config file"
    assert len(dump_lines(d)) == 2
    d.terminate()

    # ...merged with it (re-read at every load, like the reference; here from the start).
    xds_env["MERGE_DOMAIN_CONFIG"] = "true"
    d = start_daemon(xds_env)
    assert dump_lines(d) == sorted(
        [
            "foo.k1_v1: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false",
            "foo.k1_v2: unit=HOUR requests_per_unit=9, shadow_mode: false, quota_mode: false",
        ]
    )
    assert d.decide("foo", [("k1", "v2")]).statuses[0].limit_remaining == 8


def test_server_down_at_start_holds_the_ports_closed_until_the_first_config(
    ads: AdsServer, xds_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    d = start_daemon(xds_env, wait=False)
    wait_for(lambda: "cannot subscribe to the xDS management server" in d.log(), what="a retry")
    assert not d.ready()  # no port is open before the first config
    ads.set_snapshot("1", [FOO_V1])
    ads.start()
    d.wait_ready()
    assert rlconfig(d) == DUMP_V1


def test_force_start_serves_without_config_until_the_server_comes(
    ads: AdsServer, xds_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    xds_env.update(FORCE_START_WITHOUT_INITIAL_CONFIG="true")
    d = start_daemon(xds_env)
    assert rlconfig(d) == ""
    with pytest.raises(RateLimitError) as err:
        d.decide("foo", [("k1", "v1")])
    assert err.value.details == "no rate limit configuration loaded"
    ads.set_snapshot("1", [FOO_V1])
    ads.start()
    ads.wait_ack("1")
    wait_for(lambda: rlconfig(d) == DUMP_V1, what="the first config")
    assert d.decide("foo", [("k1", "v1")]).overall_code == OK


def test_healthy_with_at_least_one_config_loaded(
    ads: AdsServer, xds_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    xds_env.update(
        FORCE_START_WITHOUT_INITIAL_CONFIG="true", HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED="true"
    )
    ads.set_snapshot("1", [])  # a config with no domains
    ads.start()
    d = start_daemon(xds_env, wait=False)
    ads.wait_ack("1")
    wait_for(lambda: health(d) == 500, what="unhealthy while no domain is loaded")
    ads.set_snapshot("2", [FOO_V1])
    ads.wait_ack("2")
    wait_for(lambda: health(d) == 200, what="healthy with a domain")


def test_server_restart_resubscribes_with_the_last_acked_version(
    ads: AdsServer, xds_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    ads.set_snapshot("1", [FOO_V1])
    ads.start()
    d = start_daemon(xds_env)
    ads.wait_ack("1")
    ads.stop()
    wait_for(lambda: "xDS stream to" in d.log(), what="the broken stream noticed")
    assert d.decide("foo", [("k1", "v1")]).overall_code == OK  # the last config serves on
    mark = len(ads.received)

    ads.start()  # same snapshot: the re-subscription says it has version 1, nothing is resent
    again = ads.wait_for(lambda r: r.stream != 1, after=mark).request
    assert (again.version_info, again.response_nonce) == ("1", "")
    sent = len(ads.sent)
    ads.set_snapshot("2", [FOO_V2])
    ads.wait_ack("2")
    assert len(ads.sent) == sent + 1
    wait_for(lambda: rlconfig(d) == DUMP_V2, what="config v2 after the restart")
    assert d.stats()["ratelimit.service.config_load_success"] == 2


def test_tls_and_client_certificate(
    certs: Pki, xds_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    # The server requires a client certificate from the test CA.
    server_cert, server_key = certs.server
    credentials = grpc.ssl_server_credentials(
        [(server_key.read_bytes(), server_cert.read_bytes())],
        root_certificates=certs.ca.read_bytes(),
        require_client_auth=True,
    )
    port = free_port()
    ads = AdsServer(port, credentials=credentials).start()
    try:
        ads.set_snapshot("1", [FOO_V1])
        client_cert, client_key = certs.client
        xds_env.update(
            CONFIG_GRPC_XDS_SERVER_URL=f"127.0.0.1:{port}",
            CONFIG_GRPC_XDS_SERVER_USE_TLS="true",
            CONFIG_GRPC_XDS_SERVER_TLS_CACERT=str(certs.ca),
            CONFIG_GRPC_XDS_CLIENT_TLS_CERT=str(client_cert),
            CONFIG_GRPC_XDS_CLIENT_TLS_KEY=str(client_key),
            CONFIG_GRPC_XDS_SERVER_TLS_SAN="localhost",
        )
        d = start_daemon(xds_env)
        assert rlconfig(d) == DUMP_V1
        d.terminate()

        # A server name the certificate does not carry: no subscription, no config.
        xds_env.update(
            CONFIG_GRPC_XDS_SERVER_TLS_SAN="elsewhere.example.com",
            FORCE_START_WITHOUT_INITIAL_CONFIG="true",
        )
        received = len(ads.received)
        d = start_daemon(xds_env)
        wait_for(lambda: d.log().count("cannot subscribe") >= 2, what="refused handshakes")
        assert rlconfig(d) == ""
        d.terminate()

        # Without a client certificate the server refuses the handshake.
        del xds_env["CONFIG_GRPC_XDS_CLIENT_TLS_CERT"], xds_env["CONFIG_GRPC_XDS_CLIENT_TLS_KEY"]
        xds_env["CONFIG_GRPC_XDS_SERVER_TLS_SAN"] = "localhost"
        d = start_daemon(xds_env)
        wait_for(lambda: d.log().count("cannot subscribe") >= 2, what="refused handshakes")
        assert rlconfig(d) == ""
        assert len(ads.received) == received
    finally:
        ads.stop()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/x.pem"},
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY must be set "
            "together",
        ),
        (
            {"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/nonexistent/ca.pem"},
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT: cannot read /nonexistent/ca.pem",
        ),
        (
            {"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "grpc-timeout:1"},
            "'grpc-timeout' is not a usable gRPC metadata key",
        ),
    ],
)
def test_unusable_xds_settings_stop_the_start_with_one_line(
    tmp_path: Path, xds_env: dict[str, str], extra: dict[str, str], message: str
) -> None:
    xds_env.update(CONFIG_GRPC_XDS_SERVER_USE_TLS="true", **extra)
    d = DaemonProcess(xds_env, tmp_path / "refused.log")
    try:
        assert d.proc.wait(30) == 1
        assert message in d.log()
        assert "Traceback" not in d.log()
    finally:
        d.close()


def test_max_msg_size_refuses_a_larger_response(
    ads: AdsServer, xds_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    many = [rl_descriptor(f"key{i}", unit=Unit.MINUTE, requests_per_unit=i) for i in range(100)]
    ads.set_snapshot("1", [rl_config("big", "big", *many)])
    ads.start()
    xds_env.update(
        XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES="1000", FORCE_START_WITHOUT_INITIAL_CONFIG="true"
    )
    d = start_daemon(xds_env)
    wait_for(lambda: "RESOURCE_EXHAUSTED" in d.log(), what="the oversized response refused")
    assert rlconfig(d) == ""
    d.terminate()

    xds_env["XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"] = "100000"
    d = start_daemon(xds_env)
    wait_for(lambda: len(dump_lines(d)) == 100, what="the config under a larger limit")


def test_a_domain_default_algorithm_applies_to_xds_resources(
    ads: AdsServer, xds_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    # An xDS resource has no field for the algorithm: DOMAIN_DEFAULT_ALGORITHMS gives one
    # per domain (`*`: every other), and a bad name is NACKed with the setting named.
    ads.set_snapshot("1", [FOO_V1, BAR])
    ads.start()
    xds_env["DOMAIN_DEFAULT_ALGORITHMS"] = "foo=sliding_window, *=token_bucket"
    d = start_daemon(xds_env)
    assert dump_lines(d) == [
        "bar.k1_v1: unit=MINUTE requests_per_unit=100 algorithm=token_bucket, "
        "shadow_mode: false, quota_mode: false",
        "foo.k1_v1: unit=MINUTE requests_per_unit=3 algorithm=sliding_window, "
        "shadow_mode: false, quota_mode: false",
    ]
    assert d.terminate() == 0
    xds_env["DOMAIN_DEFAULT_ALGORITHMS"] = "foo=sliding"
    d = start_daemon(xds_env | {"FORCE_START_WITHOUT_INITIAL_CONFIG": "true"})
    nack = ads.wait_nack("1").request
    assert nack.error_detail.message == (
        "DOMAIN_DEFAULT_ALGORITHMS: invalid rate limit algorithm 'sliding' for domain 'foo' "
        "(expected fixed_window, sliding_window or token_bucket)"
    )
    assert d.terminate() == 0
