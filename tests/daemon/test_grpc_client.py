"""`ratelimitd client` (the reference's client CLI) run as a subprocess against a served
gRPC transport: flags, output, errors and mTLS; its flag parsing and Go-style formatting.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.grpc_rls import CONFIG, RESET, Served
from support.pki import Pki

from ratelimitd._proto import rls_pb2
from ratelimitd.process.cli import _go_float, go_quote, parse_flags, proto_text

REPO = Path(__file__).resolve().parents[2]


# -- the client CLI ----------------------------------------------------------------------


CLIENT = (
    "import sys; from ratelimitd.process.cli import client_main;"
    " sys.exit(client_main(sys.argv[1:]))"
)


async def run_client(*args: str) -> tuple[int, str, str]:
    """`ratelimitd client ARGS` as a subprocess (the event loop keeps serving meanwhile)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_client_cli_ok_then_over_limit(harness: Callable[..., Any], serve: Any) -> None:
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    code, out, _ = await run_client(
        "-dial_string", served.target, "-domain", "test", "-descriptors", "k=v"
    )
    assert code == 0
    assert out.splitlines() == [
        'Flag: --descriptors="[ <key=k, value=v> ] "',
        f'Flag: --dial_string="{served.target}"',
        'Flag: --domain="test"',
        'Flag: --grpc-cert-file=""',
        'Flag: --grpc-key-file=""',
        'Flag: --grpc-server-ca-file=""',
        'Flag: --grpc-use-tls="false"',
        'Flag: --hits_addend="1"',
        'Flag: --oltp-protocol=""',
        'response: overall_code:OK statuses:{code:OK current_limit:{name:"kv_limit" '
        "requests_per_unit:2 unit:MINUTE} limit_remaining:1 "
        f"duration_until_reset:{{seconds:{RESET}}}}}",
    ]
    code, out, _ = await run_client(
        f"--dial_string={served.target}", "--domain", "test", "--descriptors=k=v", "-hits_addend=2"
    )
    assert code == 0
    assert 'Flag: --hits_addend="2"' in out
    assert out.splitlines()[-1].startswith(
        "response: overall_code:OVER_LIMIT statuses:{code:OVER_LIMIT"
    )
    code, out, _ = await run_client(
        "--dial_string", served.target, "--domain", "test",
        "--descriptors", "k=v,x=y", "--descriptors", "unlimited=1",
    )  # fmt: skip
    assert code == 0
    assert (
        'Flag: --descriptors="[ <key=k, value=v>  <key=x, value=y> ] [ <key=unlimited, value=1> ] "'
        in out
    )
    assert out.splitlines()[-1] == (
        "response: overall_code:OK statuses:{code:OK} statuses:{code:OK limit_remaining:4294967295}"
    )


@pytest.mark.parametrize("pairs", ["k", "k=v=w", "k=v,", ""])
async def test_client_cli_malformed_pair(pairs: str) -> None:
    code, out, err = await run_client("-domain", "test", "-descriptors", pairs)
    assert code == 1
    assert "invalid descriptor list" in err
    assert out == ""


async def test_client_cli_errors(harness: Callable[..., Any], serve: Any) -> None:
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    code, out, _ = await run_client("-dial_string", served.target, "-domain", "test")
    assert code == 1
    assert out.splitlines()[-1] == (
        "request error: rpc error: code = Unknown "
        "desc = rate limit descriptor list must not be empty"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    code, out, _ = await run_client(
        "-dial_string", f"127.0.0.1:{closed}", "-domain", "test", "-descriptors", "k=v"
    )
    assert code == 1
    assert out.splitlines()[-1].startswith("request error: rpc error: code = Unavailable")
    code, out, _ = await run_client(
        "-grpc-use-tls", "-grpc-server-ca-file", "/nonexistent/ca.pem", "-descriptors", "k=v"
    )
    assert code == 1
    assert out.splitlines()[-1].startswith("error connecting: ")
    code, _, err = await run_client("-no-such-flag")
    assert code == 2 and "flag provided but not defined: -no-such-flag" in err


async def test_client_cli_mtls(serve_tls: Callable[..., Awaitable[Served]], certs: Pki) -> None:
    served = await serve_tls(client_tls_cacert=str(certs.ca))
    code, out, _ = await run_client(
        "--dial_string", served.target, "--domain", "test", "--descriptors", "k=v",
        "--grpc-use-tls", "--grpc-server-ca-file", str(certs.ca),
        "--grpc-cert-file", str(certs.client[0]), "--grpc-key-file", str(certs.client[1]),
    )  # fmt: skip
    assert code == 0, out
    assert 'Flag: --grpc-use-tls="true"' in out
    assert out.splitlines()[-1].startswith("response: overall_code:OK")


def test_client_flag_parsing_and_formatting() -> None:
    flags = parse_flags(["--domain=d", "-descriptors", "a=b", "--grpc-use-tls=false", "rest"])
    assert (flags.domain, flags.descriptors, flags.grpc_use_tls) == ("d", [[("a", "b")]], False)
    assert parse_flags(["-hits_addend", "0x10"]).hits_addend == 16
    assert go_quote('a"b\\c\n\x01é\u00a0') == '"a\\"b\\\\c\\n\\x01é\\u00a0"'
    assert [_go_float(x) for x in (1.0, 1.5, 1e6, 123456.0, 1e-5, 0.0001, -2.5e21)] == [
        "1",
        "1.5",
        "1e+06",
        "123456",
        "1e-05",
        "0.0001",
        "-2.5e+21",
    ]
    msg = rls_pb2.RateLimitResponse(overall_code=1)
    msg.dynamic_metadata.update({"b": 1.0, "a": "x"})
    assert proto_text(msg) == (
        'overall_code:OK dynamic_metadata:{fields:{key:"a" value:{string_value:"x"}} '
        'fields:{key:"b" value:{number_value:1}}}'
    )
