"""Every file-valued setting that Envoy Gateway or the Go service's deployment examples set,
when its file is absent, unreadable or not what it should be: as the Go service does.

The Go service reads its TLS files once at start-up (settings.NewSettings ->
utils.TlsConfigFromFiles, which panics on a file it cannot read or parse) and refuses to
start; so does ratelimitd, with one line naming the variable and the file. The statsd
mapping (PROMETHEUS_MAPPER_YAML) is the exception: Go ignores any error reading it and
serves; so does ratelimitd, with the default mapping and one warning. Config directories:
tests/daemon/test_faults.py and docs/compatibility.md ("Where ratelimitd deliberately differs").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import free_port, http_get, port_open, wait_for
from support.daemon import DaemonProcess
from support.pki import Pki

from ratelimitd.backends import load_settings
from ratelimitd.stats.mapper import MetricMapper

MISSING = "No such file or directory"
# Variables that turn each reader of TLS files on, with somewhere unreachable to connect
# to: the files are refused before any connection is tried.
GRPC = {"GRPC_SERVER_USE_TLS": "true"}
CERT, KEY = "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY"
XCERT, XKEY = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"
RCERT, RKEY = "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY"
XDS = {
    "CONFIG_TYPE": "GRPC_XDS_SOTW",
    "CONFIG_GRPC_XDS_SERVER_URL": "127.0.0.1:1",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
}
REDIS = {
    "BACKEND_TYPE": "redis",
    "REDIS_SOCKET_TYPE": "tcp",
    "REDIS_URL": "127.0.0.1:1",
    "REDIS_TLS": "true",
}
MEMCACHE = {"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "127.0.0.1:1", "MEMCACHE_TLS": "true"}

# (id, the variables, the start-up line). `{cert}`, `{key}`, `{ca}`: usable files;
# `{missing}`: an absent one; `{garbage}`: a readable file that is not PEM; `{dir}`: a
# directory (unreadable as a file).
REFUSED = [
    ("grpc-cert-missing", GRPC | {CERT: "{missing}", KEY: "{key}"},
     "GRPC_SERVER_TLS_CERT: cannot read {missing}: " + MISSING),
    ("grpc-key-missing", GRPC | {CERT: "{cert}", KEY: "{missing}"},
     "GRPC_SERVER_TLS_KEY: cannot read {missing}: " + MISSING),
    ("grpc-cert-a-directory", GRPC | {CERT: "{dir}", KEY: "{key}"},
     "GRPC_SERVER_TLS_CERT: cannot read {dir}: Is a directory"),
    ("grpc-key-unset", GRPC | {"GRPC_SERVER_TLS_CERT": "{cert}"},
     "GRPC_SERVER_USE_TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"),
    ("grpc-cert-not-pem", GRPC | {CERT: "{garbage}", KEY: "{key}"},
     "GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY: cannot load the key pair ({garbage}, {key})"),
    ("grpc-client-ca-missing",
     GRPC | {"GRPC_SERVER_TLS_CERT": "{cert}", "GRPC_SERVER_TLS_KEY": "{key}",
             "GRPC_CLIENT_TLS_CACERT": "{missing}"},
     "GRPC_CLIENT_TLS_CACERT: cannot read {missing}: " + MISSING),
    ("grpc-client-ca-not-pem",
     GRPC | {"GRPC_SERVER_TLS_CERT": "{cert}", "GRPC_SERVER_TLS_KEY": "{key}",
             "GRPC_CLIENT_TLS_CACERT": "{garbage}"},
     "GRPC_CLIENT_TLS_CACERT: no CA certificate in {garbage}"),
    # xDS: CONFIG_GRPC_XDS_SERVER_TLS_CACERT missing and a certificate without its key are
    # in test_xds.py.
    ("xds-ca-not-pem", XDS | {"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "{garbage}"},
     "CONFIG_GRPC_XDS_SERVER_TLS_CACERT ({garbage}): not usable PEM"),
    ("xds-cert-missing",
     XDS | {XCERT: "{missing}", XKEY: "{key}"},
     "CONFIG_GRPC_XDS_CLIENT_TLS_CERT: cannot read {missing}: " + MISSING),
    ("xds-key-missing",
     XDS | {XCERT: "{cert}", XKEY: "{missing}"},
     "CONFIG_GRPC_XDS_CLIENT_TLS_KEY: cannot read {missing}: " + MISSING),
    ("xds-cert-not-pem",
     XDS | {XCERT: "{garbage}", XKEY: "{key}"},
     "CONFIG_GRPC_XDS_CLIENT_TLS_CERT, CONFIG_GRPC_XDS_CLIENT_TLS_KEY ({garbage}, {key}): "
     "not usable PEM"),
    ("redis-ca-missing", REDIS | {"REDIS_TLS_CACERT": "{missing}"},
     "REDIS_TLS_CACERT: cannot read {missing}: " + MISSING),
    ("redis-ca-not-pem", REDIS | {"REDIS_TLS_CACERT": "{garbage}"},
     "REDIS_TLS_CACERT: no CA certificate in {garbage}"),
    ("redis-cert-missing", REDIS | {RCERT: "{missing}", RKEY: "{key}"},
     "REDIS_TLS_CLIENT_CERT: cannot read {missing}: " + MISSING),
    ("redis-key-missing", REDIS | {RCERT: "{cert}", RKEY: "{missing}"},
     "REDIS_TLS_CLIENT_KEY: cannot read {missing}: " + MISSING),
    ("redis-cert-not-pem",
     REDIS | {RCERT: "{garbage}", RKEY: "{key}"},
     "REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY: cannot load the key pair ({garbage}, {key})"),
    # The Go service connects without a client certificate then: a setting that does nothing.
    ("redis-key-unset", REDIS | {"REDIS_TLS_CLIENT_CERT": "{cert}"},
     "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY must be set together"),
    # REDIS_PERSECOND_TLS alone reads the REDIS_TLS_* files (Go: RedisTls || RedisPerSecondTls).
    ("redis-persecond-ca-missing",
     REDIS | {"REDIS_TLS": "false", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
              "REDIS_PERSECOND_URL": "127.0.0.1:1", "REDIS_PERSECOND_TLS": "true",
              "REDIS_TLS_CACERT": "{missing}"},
     "REDIS_TLS_CACERT: cannot read {missing}: " + MISSING),
    ("memcache-ca-missing", MEMCACHE | {"MEMCACHE_TLS_CACERT": "{missing}"},
     "MEMCACHE_TLS_CACERT: cannot read {missing}: " + MISSING),
    ("memcache-cert-missing",
     MEMCACHE | {"MEMCACHE_TLS_CLIENT_CERT": "{missing}", "MEMCACHE_TLS_CLIENT_KEY": "{key}"},
     "MEMCACHE_TLS_CLIENT_CERT: cannot read {missing}: " + MISSING),
    ("memcache-key-missing",
     MEMCACHE | {"MEMCACHE_TLS_CLIENT_CERT": "{cert}", "MEMCACHE_TLS_CLIENT_KEY": "{missing}"},
     "MEMCACHE_TLS_CLIENT_KEY: cannot read {missing}: " + MISSING),
    ("memcache-key-unset", MEMCACHE | {"MEMCACHE_TLS_CLIENT_CERT": "{cert}"},
     "MEMCACHE_TLS_CLIENT_CERT and MEMCACHE_TLS_CLIENT_KEY must be set together"),
]  # fmt: skip


@pytest.fixture
def files(tmp_path: Path, certs: Pki) -> dict[str, str]:
    """The placeholders of REFUSED, as paths."""
    garbage = tmp_path / "not-pem.txt"
    garbage.write_text("not a certificate\n")
    (tmp_path / "a-directory").mkdir()
    return {
        "cert": str(certs.ratelimit[0]),
        "key": str(certs.ratelimit[1]),
        "ca": str(certs.ca),
        "missing": str(tmp_path / "absent.pem"),
        "garbage": str(garbage),
        "dir": str(tmp_path / "a-directory"),
    }


@pytest.mark.parametrize(
    ("variables", "line"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_an_unusable_tls_file_stops_the_start_with_one_line(
    daemon_env: dict[str, str],
    serve_until_exit: Callable[[dict[str, str], float], Any],
    files: dict[str, str],
    variables: dict[str, str],
    line: str,
) -> None:
    env = daemon_env | {k: v.format(**files) for k, v in variables.items()}
    done = serve_until_exit(env, 60)
    assert done.returncode == 1, done.stderr
    fatal = [x for x in done.stderr.splitlines() if "level=fatal" in x]
    assert len(fatal) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"ratelimitd cannot start: {line.format(**files)}" in fatal[0]


# -- PROMETHEUS_MAPPER_YAML: never fatal ----------------------------------------------------

RULE = "ratelimit.service.rate_limit"
DEFAULT_NAME = "ratelimit_service_rate_limit_total_hits"


def mapper_for(path: Path) -> MetricMapper:
    settings = load_settings(
        {"USE_STATSD": "false", "USE_PROMETHEUS": "true", "PROMETHEUS_MAPPER_YAML": str(path)}
    )
    return MetricMapper.from_settings(settings.stats)


def mapped_name(mapper: MetricMapper) -> tuple[str, tuple[tuple[str, str], ...]]:
    mapped = mapper.map(f"{RULE}.d.k.total_hits", "counter")
    assert mapped is not None
    return mapped.name, mapped.labels


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read {path}: No such file or directory"),
        ("DIRECTORY", "cannot read {path}: Is a directory"),
        ("mappings: [unclosed\n", "{path} is not a valid mapping: while parsing a flow sequence"),
        ("mappings:\n  - match: a.*\n    name: x\n    lables: {k: $1}\n",
         "{path} is not a valid mapping: prometheus mapper: unknown field 'lables' in mapping "
         "'a.*'"),
        ("mappings:\n  - match: a.*\n    name: x\n    labels: {k: $1}\n",
         "{path} is not a valid mapping: prometheus mapper: invalid label key: k"),
        ("mappings:\n  - match: a.*\n    name: 'bad-name'\n",
         "{path} is not a valid mapping: prometheus mapper: bad metric name 'bad-name'"),
        (b"\xff\xfe", "{path} is not a valid mapping: 'utf-8' codec can't decode"),
    ],
    ids=["missing", "directory", "bad-yaml", "unknown-field", "bad-label", "bad-name", "not-utf8"],
)  # fmt: skip
def test_an_unusable_mapper_file_serves_the_default_mapping_with_one_warning(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    content: str | bytes | None,
    problem: str,
) -> None:
    # statsd_exporter rejects each of these (yaml.UnmarshalStrict, its name and label
    # checks); the Go service ignores the error and serves.
    path = tmp_path / "conf.yaml"
    if content == "DIRECTORY":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="ratelimitd.stats"):
        mapper = mapper_for(path)
    assert mapped_name(mapper) == (DEFAULT_NAME, (("domain", "d"), ("key1", "k")))
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(f"PROMETHEUS_MAPPER_YAML: {problem.format(path=path)}")
    assert record.getMessage().endswith(
        "serving the default mapping (the file is read only at start-up)"
    )


def test_a_mapper_file_is_read_once_at_start_up(tmp_path: Path) -> None:
    # As the reference: a file that appears (an optional ConfigMap created later) or changes
    # after start-up is used from the next start.
    path = tmp_path / "conf.yaml"
    mapper = mapper_for(path)
    path.write_text(
        "mappings:\n  - match: ratelimit.service.rate_limit.*.*.total_hits\n    name: hits\n"
    )
    assert mapped_name(mapper)[0] == DEFAULT_NAME
    assert mapped_name(mapper_for(path)) == ("hits", ())


def test_a_valid_mapper_file_is_used(tmp_path: Path) -> None:
    path = tmp_path / "conf.yaml"
    path.write_text(
        "mappings:\n"
        "  - match: ratelimit.service.rate_limit.*.*.total_hits\n"
        "    name: ${1}_hits\n"
        "    labels: {rule: $2}\n"
    )
    assert mapped_name(mapper_for(path)) == ("d_hits", (("rule", "k"),))


def test_a_daemon_without_its_mapper_file_serves_metrics(
    daemon_env: dict[str, str], start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    port = free_port()
    env = daemon_env | {
        "USE_PROMETHEUS": "true",
        "PROMETHEUS_ADDR": f"127.0.0.1:{port}",
        "PROMETHEUS_MAPPER_YAML": str(tmp_path / "absent" / "conf.yaml"),
    }
    d = start_daemon(env)
    # Ready means the health listener; the metrics listener may bind a moment later.
    wait_for(lambda: port_open(port), what=f"the metrics listener on {port}")
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and b"ratelimit_service_config_load_success" in body
    assert d.terminate() == 0
