"""Command-line entry points: `serve` (default), `check-config`, `client`, and the admin
endpoints' `counters get|reset` and `explain` (they call the debug listener; see
`ratelimitd.admin`).

`ratelimitd client` is the reference's `src/client_cmd`, a
synchronous use of the public async client (`ratelimitd.transport.client`): Go `flag` syntax
(`-flag value`, `-flag=value`, and the same with two dashes), every flag echoed as
`Flag: --<name>="<value>"` in name order, then `response: <text>` where the text is the
RateLimitResponse in protobuf text format, shaped like Go's `String()` (`name:value`,
submessages in `{}`, fields in declaration order). `-hits_addend N` is our extension (the
reference always sends 1). Exit status: 0 answered, 1 on any failure, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import sys
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from .logs import go_quote

if TYPE_CHECKING:
    from ..transport.client import ClientTLS

# A CLI call should never hang on an unreachable or stuck server.
DEADLINE_SECONDS = 5.0


def check_config(argv: Sequence[str]) -> int:
    """`ratelimitd check-config [--merge-domain-config] PATH...`: validate config files."""
    from ..backends import BACKENDS
    from ..backends import backend_type as backend_type_from_env
    from ..config import ConfigError, load_files, load_ruleset
    from ..settings import SettingsError, reload_options_from_env

    parser = argparse.ArgumentParser(
        prog="ratelimitd check-config",
        description="Validate rate limit config files (files or directories) as the server would.",
    )
    parser.add_argument(
        "--merge-domain-config",
        "-merge_domain_configs",
        "--merge_domain_configs",
        dest="merge",
        action="store_true",
        help="allow several files to declare the same domain (MERGE_DOMAIN_CONFIG)",
    )
    parser.add_argument(
        "--backend-type",
        choices=sorted(BACKENDS),
        default=None,
        help="check that this backend can count every limit (default: BACKEND_TYPE, or "
        "no backend check when it is unset)",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH")
    args = parser.parse_args(list(argv))
    backend_type = args.backend_type or backend_type_from_env()
    backend = None
    if backend_type:
        caps = BACKENDS[backend_type].capabilities
        backend = (backend_type, caps.algorithms, caps.budgets)
    try:  # as the daemon loads them: with its DOMAIN_DEFAULT_ALGORITHMS
        algorithms = reload_options_from_env().domain_algorithms
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return 1
    print("checking rate limit configs...")
    try:
        files = load_files(args.paths)
        for f in files:
            print(f"opening config file: {f.name}")
        ruleset = load_ruleset(
            files, merge_domains=args.merge, backend=backend, algorithms=algorithms
        )
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    rules = sum(1 for _ in ruleset.rules())
    print(f"all rate limit configs ok: {len(files)} files, {len(ruleset)} domains, {rules} rules")
    return 0


def serve(argv: Sequence[str]) -> int:
    """`ratelimitd [serve]`: run the daemon configured by the environment."""
    from ..backends import load_settings
    from ..settings import SettingsError
    from .logs import configure_logging

    if argv and argv[0] in ("-h", "--help"):
        print("usage: ratelimitd [serve]\n\nConfigured by environment variables (see README).")
        return 0
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"ratelimitd: {exc}", file=sys.stderr)
        return 1
    configure_logging(settings)
    workers = settings.workers
    if workers.count > 1:
        from ..backends import capabilities
        from .workers import supervise

        if not capabilities(settings.cache.backend).shared:
            logging.getLogger("ratelimitd.process.workers").warning(
                "BACKEND_TYPE=%s with RATELIMITD_WORKERS=%d: each worker counts in its "
                "own memory, so a limit admits up to %dx its requests_per_unit (use Redis "
                "or memcached to share the counters)",
                settings.cache.backend,
                workers.count,
                workers.count,
            )
        prometheus = settings.stats.sink == "prometheus"
        return supervise(workers.count, share_stats=prometheus)
    if workers.supervisor_pid is not None:
        from .workers import die_with_supervisor

        if not die_with_supervisor(workers.supervisor_pid):
            logging.getLogger("ratelimitd.process.workers").warning(
                "worker %s: its supervisor (pid %d) is gone; exiting",
                workers.index,
                workers.supervisor_pid,
            )
            return 0
    from .daemon import serve as run_daemon

    return run_daemon(settings)


# -- `ratelimitd client` ---------------------------------------------------------------------------


class UsageError(Exception):
    """A command line the flag parser rejects (exit status 2, as Go's flag package)."""


class _Flags:
    """The parsed flags with their Go `flag.Value.String()` renderings."""

    def __init__(self) -> None:
        self.dial_string = "localhost:8081"
        self.domain = ""
        self.descriptors: list[list[tuple[str, str]]] = []
        self.hits_addend = 1
        self.oltp_protocol = ""
        self.grpc_use_tls = False
        self.grpc_server_ca_file = ""
        self.grpc_cert_file = ""
        self.grpc_key_file = ""

    def add_descriptor(self, arg: str) -> None:
        entries = []
        for pair in arg.split(","):
            parts = pair.split("=")
            if len(parts) != 2:
                raise ValueError("invalid descriptor list")
            entries.append((parts[0], parts[1]))
        self.descriptors.append(entries)

    def set_hits(self, arg: str) -> None:
        value = _go_uint(arg)
        if value > 0xFFFFFFFF:
            raise ValueError("value out of range")
        self.hits_addend = value

    def descriptors_string(self) -> str:
        out = ""
        for entries in self.descriptors:
            tmp = "".join(f" <key={k}, value={v}> " for k, v in entries)
            out += f"[{tmp}] "
        return out

    def rendered(self) -> list[tuple[str, str]]:
        """(name, String()) for every flag, sorted by name as flag.VisitAll visits them."""
        values = {
            "descriptors": self.descriptors_string(),
            "dial_string": self.dial_string,
            "domain": self.domain,
            "grpc-cert-file": self.grpc_cert_file,
            "grpc-key-file": self.grpc_key_file,
            "grpc-server-ca-file": self.grpc_server_ca_file,
            "grpc-use-tls": "true" if self.grpc_use_tls else "false",
            "hits_addend": str(self.hits_addend),
            "oltp-protocol": self.oltp_protocol,
        }
        return sorted(values.items())


def _go_uint(text: str) -> int:
    """strconv.ParseUint(text, 0, 64): decimal, 0x hex, 0o/0 octal, 0b binary, `_` separators."""
    t = text.replace("_", "") if "_" in text and text[:1] == "0" else text
    if not t or not t[0].isdigit():
        raise ValueError("invalid syntax")
    if len(t) > 1 and t[0] == "0" and t[1].isdigit():
        t = "0o" + t[1:]
    try:
        return int(t, 0)
    except ValueError:
        raise ValueError("invalid syntax") from None


_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _parse_bool(text: str) -> bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("parse error")


def parse_flags(argv: Sequence[str]) -> _Flags:
    """Parse argv with Go `flag` rules. Raises UsageError (text as Go prints it)."""
    flags = _Flags()

    def setter(attr: str) -> Callable[[str], None]:
        return lambda v: setattr(flags, attr, v)

    def set_tls(v: str) -> None:
        flags.grpc_use_tls = _parse_bool(v)

    setters: dict[str, Callable[[str], None]] = {
        "dial_string": setter("dial_string"),
        "domain": setter("domain"),
        "descriptors": flags.add_descriptor,
        "hits_addend": flags.set_hits,
        "oltp-protocol": setter("oltp_protocol"),
        "grpc-server-ca-file": setter("grpc_server_ca_file"),
        "grpc-cert-file": setter("grpc_cert_file"),
        "grpc-key-file": setter("grpc_key_file"),
        "grpc-use-tls": set_tls,
    }
    booleans = {"grpc-use-tls"}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if len(arg) < 2 or arg[0] != "-":
            break  # Go stops at the first non-flag argument.
        if arg == "--":
            break
        name = arg[2:] if arg.startswith("--") else arg[1:]
        if not name or name[0] in "-=":
            raise UsageError(f"bad flag syntax: {arg}")
        value: str | None = None
        if "=" in name:
            name, value = name.split("=", 1)
        if name in ("h", "help"):
            raise UsageError("")
        if name not in setters:
            raise UsageError(f"flag provided but not defined: -{name}")
        if value is None:
            if name in booleans:
                value = "true"
            else:
                if i + 1 >= len(args):
                    raise UsageError(f"flag needs an argument: -{name}")
                i += 1
                value = args[i]
        try:
            setters[name](value)
        except ValueError as err:
            raise UsageError(f'invalid value "{value}" for flag -{name}: {err}') from None
        i += 1
    if flags.oltp_protocol not in ("", "http", "grpc"):
        raise UsageError(f"Invalid otlptrace client protocol: {flags.oltp_protocol}")
    return flags


def _go_float(x: float) -> str:
    """strconv.FormatFloat(x, 'g', -1, 64), which Go's text format uses for doubles."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    d = Decimal(repr(x)).normalize()
    sign, digits, exponent = d.as_tuple()
    exp10 = int(exponent) + len(digits) - 1
    prefix = "-" if sign else ""
    if exp10 < -4 or exp10 >= 6:
        mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    return f"{prefix}{abs(d):f}"


def _scalar_text(field: FieldDescriptor, value: Any) -> str:
    if field.type == FieldDescriptor.TYPE_ENUM:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    if field.type == FieldDescriptor.TYPE_STRING:
        return go_quote(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return go_quote(value.decode("utf-8", "backslashreplace"))
    if field.type == FieldDescriptor.TYPE_BOOL:
        return "true" if value else "false"
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return _go_float(value)
    return str(value)


def proto_text(msg: Message) -> str:
    """A message in Go's compact text format: `a:1 b:{c:"x"}`, declaration order, maps sorted."""
    parts: list[str] = []
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.is_repeated:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                for key in sorted(value):
                    inner = value[key]
                    rendered = (
                        "{" + proto_text(inner) + "}"
                        if value_field.message_type is not None
                        else _scalar_text(value_field, inner)
                    )
                    parts.append(f"{field.name}:{{key:{go_quote(str(key))} value:{rendered}}}")
            elif field.message_type is not None:
                parts.extend(f"{field.name}:{{{proto_text(v)}}}" for v in value)
            else:
                parts.extend(f"{field.name}:{_scalar_text(field, v)}" for v in value)
        elif field.message_type is not None:
            if msg.HasField(field.name):
                parts.append(f"{field.name}:{{{proto_text(value)}}}")
        elif field.has_presence:
            if msg.HasField(field.name):
                parts.append(f"{field.name}:{_scalar_text(field, value)}")
        elif value:
            parts.append(f"{field.name}:{_scalar_text(field, value)}")
    return " ".join(parts)


def _go_code_name(code: grpc.StatusCode) -> str:
    if code == grpc.StatusCode.CANCELLED:
        return "Canceled"
    if code == grpc.StatusCode.OK:
        return "OK"
    return "".join(word.capitalize() for word in code.name.split("_"))


def client_main(argv: Sequence[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    """`ratelimitd client -dial_string HOST:PORT -domain D -descriptors k=v,...`: one call
    with `argv` (the arguments after `client`); the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        flags = parse_flags(argv)
    except UsageError as exc:
        if not str(exc):  # -h / -help
            print(_USAGE, file=err, end="")
            return 0
        print(exc, file=err)
        print(_USAGE, file=err, end="")
        # A malformed descriptor is the documented "clear error and exit status 1".
        return 1 if "invalid descriptor list" in str(exc) else 2
    for name, value in flags.rendered():
        print(f"Flag: --{name}={go_quote(value)}", file=out)
    if flags.oltp_protocol:
        print("note: -oltp-protocol is accepted but this client exports no traces", file=err)
    from ..transport.client import ClientTLS, RateLimitError
    from ..transport.protocodec import encode_request, response_from_bytes

    tls = None
    if flags.grpc_use_tls:
        tls = ClientTLS(flags.grpc_server_ca_file, flags.grpc_cert_file, flags.grpc_key_file)
    request = encode_request(flags.domain, flags.descriptors, flags.hits_addend)
    try:
        data = asyncio.run(_ask(flags.dial_string, tls, request))
    except (OSError, ValueError) as exc:
        print(f"error connecting: {exc}", file=out)
        return 1
    except RateLimitError as exc:
        print(
            f"request error: rpc error: code = {_go_code_name(exc.code)} desc = {exc.details}",
            file=out,
        )
        return 1
    print(f"response: {proto_text(response_from_bytes(data))}", file=out)
    return 0


async def _ask(target: str, tls: ClientTLS | None, request: bytes) -> bytes:
    """One call with the public async client (a CLI call never hangs: DEADLINE_SECONDS)."""
    from ..transport.client import RateLimitClient

    client = RateLimitClient(target, timeout=DEADLINE_SECONDS, tls=tls)
    try:
        await client.open()  # reads the TLS files: "error connecting" when it cannot
        return await client.should_rate_limit_bytes(request)
    finally:
        await client.close()


_USAGE = """Usage of ratelimitd client:
  -descriptors value
    \tdescriptor list to query in <key>=<value>,<key>=<value>,... form
  -dial_string string
    \turl of ratelimit server in <host>:<port> form (default "localhost:8081")
  -domain string
    \trate limit configuration domain to query
  -grpc-cert-file string
    \tpath to the client cert file for TLS connection
  -grpc-key-file string
    \tpath to the client key for TLS connection
  -grpc-server-ca-file string
    \tpath to the server CA file for TLS connection
  -grpc-use-tls
    \tUse TLS for connection to server
  -hits_addend uint
    \thits each descriptor adds (an extension; the reference always sends 1) (default 1)
  -oltp-protocol string
    \tprotocol to use when exporting tracing span, accept http, grpc or empty (disable tracing)
"""


def _admin_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--admin-url",
        help="the debug listener (default: http://DEBUG_HOST:DEBUG_PORT from the environment, "
        "0.0.0.0 read as 127.0.0.1); the token is ADMIN_TOKEN from the environment",
    )
    parser.add_argument(
        "--token-file", help="read the admin token from this file instead of ADMIN_TOKEN"
    )
    return parser


def _entries(parser: argparse.ArgumentParser, items: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        for part in item.split(","):
            key, sep, value = part.partition("=")
            if not sep or not key:
                parser.error(f"descriptor entry {part!r}: expected KEY=VALUE")
            out.append((key, value))
    return out


def _admin_call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> int:
    """One admin request; its JSON on stdout (0), or its error on stderr (1)."""
    import json
    import urllib.error
    import urllib.request

    from ..backends import load_settings
    from ..settings import SettingsError

    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"ratelimitd: {exc}", file=sys.stderr)
        return 2
    token = settings.debug.admin_token
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read().strip()
    if not token:
        print(
            "ratelimitd: no admin token: set ADMIN_TOKEN (as the server has it) or --token-file",
            file=sys.stderr,
        )
        return 2
    url = args.admin_url
    if not url:
        listeners = settings.listeners
        host = "127.0.0.1" if listeners.debug_host in ("", "0.0.0.0") else listeners.debug_host
        url = f"http://{host}:{listeners.debug_port}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url.rstrip("/") + path, data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=DEADLINE_SECONDS) as resp:
            print(json.dumps(json.loads(resp.read()), indent=2))
            return 0
    except urllib.error.HTTPError as err:
        text = err.read().decode("utf-8", "replace").strip()
        with contextlib.suppress(ValueError, KeyError, TypeError):
            text = json.loads(text)["error"]
        print(f"ratelimitd: {err.code}: {text}", file=sys.stderr)
    except OSError as exc:
        print(f"ratelimitd: cannot reach {url}: {exc}", file=sys.stderr)
    return 1


def counters_main(argv: Sequence[str]) -> int:
    """`ratelimitd counters get|reset DOMAIN KEY=VALUE[,KEY=VALUE...]`."""
    from urllib.parse import urlencode

    parser = _admin_parser(
        "ratelimitd counters",
        "Show (get) or reset one descriptor's counters on a running ratelimitd.",
    )
    parser.add_argument("action", choices=("get", "reset"))
    parser.add_argument("domain")
    parser.add_argument("entries", nargs="+", metavar="KEY=VALUE", help="the descriptor's entries")
    args = parser.parse_args(argv)
    entries = _entries(parser, args.entries)
    query = urlencode([("domain", args.domain), *(("entry", f"{k}={v}") for k, v in entries)])
    method = "GET" if args.action == "get" else "DELETE"
    return _admin_call(args, method, f"/counters?{query}")


def explain_main(argv: Sequence[str]) -> int:
    """`ratelimitd explain DOMAIN DESCRIPTOR...` or `--file request.json`: the dry run."""
    import json

    parser = _admin_parser(
        "ratelimitd explain",
        "Explain the decision a request would get (which rule matched and why, stats and "
        "cache keys, current counters) without counting it.",
    )
    parser.add_argument("domain", nargs="?")
    parser.add_argument(
        "descriptors",
        nargs="*",
        metavar="KEY=VALUE[,KEY=VALUE...]",
        help="one argument per descriptor",
    )
    parser.add_argument("--hits", type=int, default=0, help="hits_addend (default 1)")
    parser.add_argument(
        "--file", help="a RateLimitRequest as JSON (- for standard input) instead of arguments"
    )
    args = parser.parse_args(argv)
    if args.file:
        if args.domain:
            parser.error("give --file or DOMAIN DESCRIPTOR..., not both")
        try:
            if args.file == "-":
                text = sys.stdin.read()
            else:
                with open(args.file, encoding="utf-8") as f:
                    text = f.read()
        except OSError as exc:
            parser.error(f"{args.file}: {exc.strerror}")
        try:
            body = json.loads(text)
        except ValueError as exc:
            parser.error(f"{args.file}: not JSON: {exc}")
    else:
        if not args.domain or not args.descriptors:
            parser.error("give DOMAIN and at least one descriptor, or --file")
        body = {
            "domain": args.domain,
            "descriptors": [
                {"entries": [{"key": k, "value": v} for k, v in _entries(parser, [d])]}
                for d in args.descriptors
            ],
        }
        if args.hits:
            body["hitsAddend"] = args.hits
    return _admin_call(args, "POST", "/explain", body)


class Command(NamedTuple):
    """A subcommand: what runs it and the line `ratelimitd --help` lists it with."""

    run: Callable[[Sequence[str]], int]
    summary: str


COMMANDS = {
    "serve": Command(serve, "run the daemon configured by the environment (the default)"),
    "check-config": Command(check_config, "validate config files as the server would load them"),
    "client": Command(client_main, "one ShouldRateLimit call, as the reference's client_cmd"),
    "counters": Command(counters_main, "read or reset the counters of a descriptor (admin)"),
    "explain": Command(explain_main, "what the service would answer, counting nothing (admin)"),
}


def usage() -> str:
    """`ratelimitd --help`: every command, each with its line."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    return (
        "usage: ratelimitd [COMMAND] [ARGS...]\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n`ratelimitd COMMAND --help` for a command's own arguments; the daemon is "
        "configured by environment variables (see README)."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch `ratelimitd <command> ...`; no command means `serve`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    command = args[0] if args and not args[0].startswith("-") else "serve"
    if args and command == args[0]:
        args = args[1:]
    handler = COMMANDS.get(command)
    if handler is None:
        known = ", ".join(COMMANDS)
        print(f"ratelimitd: unknown command '{command}' (known: {known})", file=sys.stderr)
        return 2
    return handler.run(args)
