"""The images from deploy/Containerfile, run as Envoy Gateway runs the Go service's image.

The daemon container gets exactly EG's environment (tests/support/envoy_gateway.py) with
the host's services under the names EG's would have: its xDS server (our AdsServer, over
mTLS) as envoy-gateway, Redis, an OTLP collector. Certificates made by the test are mounted
at /certs; the statsd mapping's optional ConfigMap does not exist (an empty mount).
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpack import Decoder, Encoder
from hyperframe.frame import DataFrame, HeadersFrame, PingFrame, SettingsFrame
from support import free_port, http_get, wait_for
from support.envoy_gateway import (
    CONFIG,
    DOMAIN,
    KEY,
    KEY1,
    NODE_ID,
    SECURITY,
    decide_over_mtls,
    environment,
    management_server,
    total_hits,
    write_certs,
)
from support.otlp import otlp_http_receiver
from support.pki import Pki
from support.podman import HOST_LOOPBACK, NETWORK, Container, Podman
from support.redis_server import RedisServers

from ratelimitd.messages import CODE_NAMES
from ratelimitd.transport.protocodec import METHOD_PATH, decode_response, encode_request

from .conftest import Images

SOURCE = "org.opencontainers.image.source"
DATA_TYPE, HEADERS_TYPE, SETTINGS_TYPE, PING_TYPE, GOAWAY_TYPE = 0, 1, 4, 6, 7
REDIS_HOST = "redis.redis-system.svc.cluster.local"
OTLP_HOST = "otel-collector.monitoring.svc.cluster.local"


# What the images may hold besides Python and the venv: no way to run anything else.
INSPECT = """
import json, os, shutil, sys
found = {"tools": [t for t in ("sh", "bash", "dash", "busybox", "apt", "apt-get", "dpkg",
                               "perl", "pip", "pip3", "gcc", "cc") if shutil.which(t)],
         "sources": [], "headers": os.path.exists("/usr/include"),
         "link": os.readlink("/bin/ratelimit") if os.path.lexists("/bin/ratelimit") else None,
         "packages": sorted(os.listdir("/var/lib/dpkg/status.d")),
         "licence": sorted(os.listdir("/usr/share/doc/ratelimitd"))}
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    found["sources"] += [f for f in files if f.endswith((".pyx", ".pxd", ".pxi", ".c"))]
import ratelimitd.transport._h2 as h2
found["h2"] = h2.__file__
print(json.dumps(found))
"""
MAX_DAEMON_IMAGE_MB = 150


def inspect(podman: Podman, image: str) -> dict[str, Any]:
    """What INSPECT finds in `image`, run as the images run (read-only, unprivileged)."""
    out = podman("run", "--rm", "--network", "none", *SECURITY, "--entrypoint", "python",
                 image, "-c", INSPECT)  # fmt: skip
    return json.loads(out)


def test_the_image_is_what_envoy_gateway_expects(podman: Podman, images: Images) -> None:
    [info] = json.loads(podman("image", "inspect", images.ratelimit))
    assert info["Config"]["Entrypoint"] == ["/bin/ratelimit"]
    # Both images carry the build's labels (set after their files, so that a cached
    # layer never carries an earlier build's revision), the user, and their own title.
    for image, title in (
        (images.ratelimit, "ratelimitd"),
        (images.sidecars, "ratelimitd-sidecars"),
    ):
        [info] = json.loads(podman("image", "inspect", image))
        config = info["Config"]
        assert config["User"] == "65534:65534"
        labels = config["Labels"]
        assert labels["org.opencontainers.image.title"] == title
        assert labels["org.opencontainers.image.revision"] == images.revision
        assert labels["org.opencontainers.image.version"] == images.version
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        assert labels[SOURCE].startswith("https://")
        assert "PYTHONDONTWRITEBYTECODE=1" in config["Env"]


def test_images_are_lean_and_hold_nothing_but_python(podman: Podman, images: Images) -> None:
    sizes = {image: podman.image_size(image) / 1e6 for image in (images.ratelimit, images.sidecars)}
    print(f"\nimage sizes (MB): {sizes}")
    assert sizes[images.ratelimit] <= MAX_DAEMON_IMAGE_MB
    for image in (images.ratelimit, images.sidecars):
        [info] = json.loads(podman("image", "inspect", image))
        # One layer on an empty base: the runtime's files, nothing pulled under them.
        assert len(info["RootFS"]["Layers"]) == 1, info["RootFS"]
        found = inspect(podman, image)
        assert found["tools"] == [] and not found["headers"], found
        assert found["sources"] == [], found["sources"][:20]
        # The compiled HTTP/2 core loads from libnghttp2.so.14, the only nghttp2 there is.
        assert found["h2"].startswith("/opt/ratelimitd/lib/python3.11/site-packages/ratelimitd/")
        assert [p for p in found["packages"] if "nghttp2" in p] == ["libnghttp2-14"]
        assert found["licence"] == ["LICENSE", "NOTICE"]
    assert inspect(podman, images.ratelimit)["link"] == "../../opt/ratelimitd/bin/ratelimitd"


def test_the_offline_base_is_slim(podman: Podman, images: Images) -> None:
    """The locally made base (docs/deploy.md's offline recipe): /usr merged as Debian's
    images have it, without the usrmerge package and the perl it pulls in."""
    listed = podman("run", "--rm", "--network", "none", podman.base_image(),
                    "dpkg-query", "-W", "-f", "${Package}\\n")  # fmt: skip
    packages = set(listed.split())
    assert "usr-is-merged" in packages and not {"usrmerge", "perl"} & packages, packages


def test_two_builds_of_one_commit_are_the_same_image(podman: Podman, images: Images) -> None:
    """The session's build again, from nothing (no cached layer), at the same commit time:
    the same image, digest for digest."""
    again = images.ratelimit + "-again"
    args = {"REVISION": images.revision, "VERSION": images.version}
    try:
        podman.build(again, "ratelimit", args, images.timestamp, cache=False)
        ids = [podman("image", "inspect", "--format", "{{.Id}}", i).strip()
               for i in (images.ratelimit, again)]  # fmt: skip
        assert ids[0] == ids[1], ids
    finally:
        podman("rmi", again, check=False)


class InFlightCall:
    """A ShouldRateLimit whose request body is held back: a call in flight as long as the
    test wants, on its own HTTP/2 connection (TLS, ALPN h2, the pod's client certificate).

    Raw frames (hyperframe, hpack): the h2 library stops a connection dead at GOAWAY, where
    HTTP/2 lets the streams the server already took finish.
    """

    def __init__(self, port: int, certs: Path) -> None:
        ctx = ssl.create_default_context(cafile=certs / "ca.crt")
        ctx.load_cert_chain(certs / "tls.crt", certs / "tls.key")
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        head = [
            (":method", "POST"), (":scheme", "https"), (":path", METHOD_PATH),
            (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers"),
        ]  # fmt: skip
        message = encode_request(DOMAIN, [[(KEY, KEY)]], 0)
        self.body = struct.pack(">BI", 0, len(message)) + message
        self.sock.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + SettingsFrame(0).serialize()
            + HeadersFrame(1, Encoder().encode(head), flags=["END_HEADERS"]).serialize()
            + DataFrame(1, self.body[:3]).serialize()
        )
        self.decoder = Decoder()
        self.goaway = False
        self.ended = False
        self.data = b""
        self.trailers: list[tuple[str, str]] = []

    def _read_frame(self) -> None:
        head = self._exactly(9)
        length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        payload = self._exactly(length)
        if kind == SETTINGS_TYPE and not flags & 1:
            self.sock.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
        elif kind == PING_TYPE and not flags & 1:  # the graceful GOAWAY's round trip
            self.sock.sendall(PingFrame(0, opaque_data=payload, flags=["ACK"]).serialize())
        elif kind == GOAWAY_TYPE:
            self.goaway = True
        elif stream == 1 and kind == DATA_TYPE:
            self.data += payload
        elif stream == 1 and kind == HEADERS_TYPE:  # every block, for HPACK's table
            block = [(str(k), str(v)) for k, v in self.decoder.decode(payload)]
            self.trailers += block if flags & 1 else []
        self.ended = self.ended or (stream == 1 and bool(flags & 1) and kind <= HEADERS_TYPE)

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed; got {self.data!r} {self.trailers}")
            out += chunk
        return out

    def wait_goaway(self) -> None:
        """Read until the server says it is going away."""
        while not self.goaway:
            self._read_frame()

    def finish(self) -> str:
        """Send the rest of the request; the decision's code name once the call ends."""
        self.sock.sendall(DataFrame(1, self.body[3:], flags=["END_STREAM"]).serialize())
        while not self.ended:
            self._read_frame()
        self.sock.close()
        assert ("grpc-status", "0") in self.trailers, self.trailers
        return CODE_NAMES[decode_response(self.data[5:]).overall_code]


def test_runs_as_envoy_gateway_runs_it(
    podman: Podman, images: Images, certs: Pki, redis_servers: RedisServers, tmp_path: Path
) -> None:
    pod_certs = write_certs(certs, tmp_path / "certs")
    mapper_dir = tmp_path / "statsd-exporter"  # the optional ConfigMap's empty mount
    mapper_dir.mkdir()
    redis = redis_servers()
    ads = management_server(certs)
    http, grpc, metrics = free_port(), free_port(), free_port()
    with otlp_http_receiver() as otlp:
        otlp_port = otlp.url.split(":")[2].split("/")[0]
        env = environment(
            redis_url=f"{REDIS_HOST}:{redis.port}",
            otlp_endpoint=f"http://{OTLP_HOST}:{otlp_port}",
            xds_url=f"envoy-gateway:{ads.port}",
        )
        args = [
            *SECURITY, "--network", NETWORK,
            *(f"--add-host={n}:{HOST_LOOPBACK}" for n in ("envoy-gateway", REDIS_HOST, OTLP_HOST)),
            "-p", f"127.0.0.1:{http}:8080", "-p", f"127.0.0.1:{grpc}:8081",
            "-p", f"127.0.0.1:{metrics}:19001",
            "-v", f"{pod_certs}:/certs:ro", "-v", f"{mapper_dir}:/etc/statsd-exporter:ro",
            *(f"--env={k}={v}" for k, v in env.items()),
            "--entrypoint", "/bin/ratelimit",  # EG's `command`
            images.ratelimit,
        ]  # fmt: skip
        started = time.monotonic()
        c = Container(podman, f"ratelimitd-eg-{http}", args)
        try:
            # Healthy before any config: EG's probes pass, the xDS server has nothing yet.
            wait_for(lambda: _status(f"http://127.0.0.1:{http}/healthcheck") == 200, 60,
                     what="/healthcheck 200")  # fmt: skip
            print(f"\npodman run to /healthcheck 200: {time.monotonic() - started:.2f} s")
            status, body = http_get(f"http://127.0.0.1:{metrics}/metrics")
            assert status == 200

            ads.set_snapshot("1", [CONFIG])
            assert ads.wait_ack("1").request.node.id == NODE_ID
            codes = decide_over_mtls(f"127.0.0.1:{grpc}", pod_certs, 3)
            assert codes == ["OK", "OK", "OVER_LIMIT"]
            _, body = http_get(f"http://127.0.0.1:{metrics}/metrics")
            assert total_hits(body.decode())[(DOMAIN, KEY1)] == 3
            assert len(redis.client().keys(f"{DOMAIN}_*")) == 1

            # SIGTERM with a call in flight: it is answered, then the daemon exits 0 well
            # inside the grace period (past it podman would SIGKILL: 137).
            call = InFlightCall(grpc, pod_certs)
            stopping = threading.Thread(target=lambda: codes.append(str(c.stop(grace=10))))
            stopping.start()
            call.wait_goaway()
            assert call.finish() == "OVER_LIMIT"
            stopping.join(60)
            assert codes[-1] == "0"
            log = c.logs()
            assert "gRPC (native HTTP/2) listening on 8081" in log
            assert "shutting down: draining in-flight requests" in log
            assert "level=error" not in log and "Traceback" not in log, log
            # Nothing was written outside the mounts (the root is read-only anyway).
            assert written(podman, c, "/certs", "/etc/statsd-exporter") == []
        finally:
            c.remove()
            ads.stop()
        wait_for(lambda: otlp.spans(), what="spans at the collector")
    resource = {a.key: a.value.string_value for a in otlp.spans()[0][0].attributes}
    assert resource["service.name"] == NODE_ID


def written(podman: Podman, c: Container, *mounts: str) -> list[str]:
    """What `podman diff` shows changed in the container, but the mount points (ours and
    podman's own /etc files, and the directories made for them)."""
    own = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run/.containerenv")
    made = {str(p) for m in (*mounts, *own) for p in (Path(m), *Path(m).parents)}
    return [line for line in podman("diff", c.name).splitlines() if line.split()[1] not in made]


@contextlib.contextmanager
def logs_on_failure(c: Container) -> Iterator[None]:
    """An AssertionError in the block carries the container's last log lines."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- {c.name}:\n{c.logs()[-4000:]}") from None


def _status(url: str) -> int | None:
    try:
        return http_get(url, timeout=2)[0]
    except OSError:
        return None


def test_sidecars_image_runs_both_apis(
    podman: Podman, images: Images, redis_servers: RedisServers
) -> None:
    redis = redis_servers()
    transit_port, usage_port = free_port(), free_port()
    net = ["--network", NETWORK, f"--add-host=redis:{HOST_LOOPBACK}"]
    volume = f"ratelimitd-test-usage-{usage_port}"
    transit = Container(podman, f"transit-{transit_port}", [
        *SECURITY, *net, "-p", f"127.0.0.1:{transit_port}:8080",
        "--env=TRANSIT_DEMO=true", "--env=TRANSIT_NOW=2014-06-10T08:00:00+10:00",
        images.sidecars,
    ])  # fmt: skip
    usage = Container(podman, f"usage-{usage_port}", [
        *SECURITY, *net, "-p", f"127.0.0.1:{usage_port}:8090",
        # The accounts database: the one writable place, a new volume (which starts as the
        # image's /var/lib/usage, owned by the API's user).
        "-v", f"{volume}:/var/lib/usage",
        f"--env=USAGE_REDIS_URL=redis:{redis.port}",
        "--env=USAGE_RATELIMIT_ADDRESS=",  # no ratelimitd here: the compose test has one
        images.sidecars, "python", "-m", "sidecars.usage", "serve",
    ])  # fmt: skip
    try:
        # Each gunicorn worker loads the feed: both answer once three calls in a row do.
        lines = f"http://127.0.0.1:{transit_port}/v2/lines"
        with logs_on_failure(transit):
            wait_for(lambda: all(_status(lines) == 200 for _ in range(3)), 180,
                     what="transit /v2/lines")  # fmt: skip
            assert json.loads(http_get(lines)[1])
        with logs_on_failure(usage):
            wait_for(lambda: _status(f"http://127.0.0.1:{usage_port}/health") == 200, 180,
                     what="usage /health")  # fmt: skip
        cli = ["exec", usage.name, "python", "-m", "sidecars.usage"]
        podman(*cli, "accounts", "create", "acme", "--plan", "startup")
        token = json.loads(podman(*cli, "tokens", "issue", "acme"))["token"]
        url = f"http://127.0.0.1:{usage_port}/api/v2/user/usage?format=json"
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as reply:
            assert reply.status == 200
            assert json.loads(reply.read())
        for c in (transit, usage):
            assert c.stop(grace=10) == 0, c.logs()
            assert written(podman, c, "/var/lib/usage") == [], c.logs()
    finally:
        transit.remove()
        usage.remove()
        podman("volume", "rm", "-f", volume, check=False)
