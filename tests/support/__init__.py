"""Test and bench helpers, written once: free ports and readiness polling, a controllable
clock, real server processes, the uvloop hook, the test PKI, and what a benchmark ran on.

On sys.path through pytest's `pythonpath = ["tests"]`; bench scripts add tests/ themselves.
It lives under tests/ because tests are its main user and nothing in it ships: the wheel
packages only ratelimitd and sidecars.

  ready          free_port, port_open, http_get, wait_for, wait_until
  clock          Clock
  loops          the pytest-asyncio hook: async tests on uvloop
  process        Proc (a server subprocess), start_bound, process_tree, cpu_seconds
  redis_server   RedisServer (single, sentinel, cluster node, TLS), RedisServers
  postgres_server PostgresServer (initdb + postgres from the Debian package), pg_binary
  memcached      Memcached
  daemon         daemon_environment, DaemonProcess (workers mode too), start_daemon
  envoy_server   envoy_config, Envoy, start_envoy
  pki            Pki: two CAs, server and client certificates
  ads_server     AdsServer: an xDS (ADS, State of the World) management server, in-process
  machine        machine_info, implementations (compiled or pure, per compiled module)
"""

from .clock import Clock
from .process import REPO
from .ready import free_port, http_get, port_open, wait_for, wait_until

__all__ = ["REPO", "Clock", "free_port", "http_get", "port_open", "wait_for", "wait_until"]
