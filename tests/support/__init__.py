"""Test and bench helpers, written once: free ports and readiness polling, a controllable
clock, real server processes, the uvloop hook, the test PKI, and what a benchmark ran on.

A package of its own (tests/pyproject.toml), installed editable by scripts/bootstrap.sh, so
the tests and the bench/ scripts import it as `support` with no sys.path insertion. It lives
under tests/ because tests are its main user and nothing in it ships: the wheel packages
only ratelimitd and sidecars.

  ready          free_port, port_open, http_get, wait_for, wait_until
  clock          Clock
  loops          the pytest-asyncio hook: async tests on uvloop
  process        Proc (a server subprocess), start_bound, scratch, process_tree, cpu_seconds
  redis_server   RedisServer (single, sentinel, cluster node, TLS), RedisServers
  postgres_server PostgresServer (initdb + postgres from the Debian package), pg_binary
  memcached      Memcached
  daemon         daemon_environment, DaemonProcess (workers mode too), start_daemon
  envoy_server   envoy_config, Envoy, start_envoy
  pki            Pki: two CAs, server and client certificates
  ads_server     AdsServer: an xDS (ADS, State of the World) management server, in-process
  machine        machine_info, load_average, implementations (compiled or pure, per module)
  core           Decider, memory_decider, rule_counts, suite_config (tests/configs/suites)
  decisions      random configs and requests; /explain predicts the decision (property)
  sidecar        a usage or transit sidecar under real gunicorn; usage_database
  webhook_receiver  a signature-checking webhook receiver (the usage API's threshold events)
  browser        headless Chromium: a screenshot of a page, its DOM after loading
  wrk            wrk runs summarised as JSON (the HTTP load benchmarks)
  fuzz           schemathesis cases of one operation of an app's OpenAPI document, checked
  grpc_rls       the gRPC transport tests' client side (requests, calls, TLS settings)
  http_transport the HTTP transport tests' client side (a raw HTTP/1.1 client, servers)
  settings_env   backends.load_settings as the settings tests call it (load, error)
  budget         budget stores on a real redis-server (single or cluster)
  openai_backend FakeOpenAI: an OpenAI-style backend (JSON and SSE, usage, errors, aborts)
  rls_recorder   RlsRecorder: a tap recording what Envoy sends the rate-limit service
  llm_stack      Envoy on examples/llm-budget + daemon + fake backend; the stream workload
  otlp           OtlpReceiver: an OTLP/HTTP trace receiver
  envoy_gateway  Envoy Gateway's environment, certificates and xDS server for ratelimitd
  kubelet        a rendered pod's container run with podman as the kubelet runs it; its probes
"""

from .clock import Clock
from .process import REPO
from .ready import free_port, http_get, port_open, wait_for, wait_until

__all__ = ["REPO", "Clock", "free_port", "http_get", "port_open", "wait_for", "wait_until"]
