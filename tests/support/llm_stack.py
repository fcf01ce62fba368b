"""The token budget stack, end to end: the real Envoy on an example config of
examples/llm-budget (ports rewritten to free ones), `ratelimitd serve`, the fake OpenAI
backend, and optionally a tap recording what the rate-limit service received.

`LlmStack.chat(...)` is one client request through Envoy (JSON or SSE, or cut off mid-
stream); `concurrent_streams(...)` is the concurrency workload: N streams in flight at once,
held at the backend until every one of them has been let through or refused. An example
that routes between two backends (quota-routing) gets a second fake one, `fallback`.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .daemon import DaemonProcess, daemon_environment, start_daemon
from .envoy_server import Envoy
from .openai_backend import FakeOpenAI
from .process import REPO, start_bound
from .ready import free_port, http_request, wait_for
from .rls_recorder import RlsRecorder

EXAMPLES = REPO / "examples" / "llm-budget"
DOMAIN = "llm-tokens"
ADMIN_TOKEN = "budget-test-token"
PATH = "/v1/chat/completions"


def envoy_config(
    example: str,
    *,
    listen_port: int,
    admin_port: int,
    backend_port: int,
    rls_port: int,
    fallback_port: int = 0,
) -> str:
    """The Envoy config of example `example` (reserve, check-then-report, quota-routing) on
    these ports."""
    doc = yaml.safe_load((EXAMPLES / example / "envoy.yaml").read_text())
    doc["admin"]["address"]["socket_address"]["port_value"] = admin_port
    resources = doc["static_resources"]
    resources["listeners"][0]["address"]["socket_address"]["port_value"] = listen_port
    ports = {
        "llm_backend": backend_port,
        "llm_fallback": fallback_port,
        "ratelimit": rls_port,
        "ai_gateway_ratelimit_cluster": rls_port,
    }
    for cluster in resources["clusters"]:
        endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        endpoint["address"]["socket_address"]["port_value"] = ports[cluster["name"]]
    return str(yaml.safe_dump(doc, sort_keys=False))


@dataclass
class Answer:
    """What the client got: status, headers (lower-cased), body, and whether the body
    arrived whole (an upstream dying mid-stream cuts it)."""

    status: int
    headers: dict[str, str]
    body: bytes
    complete: bool = True


@dataclass
class LlmStack:
    """Envoy in front of the fake backend, limited by one daemon (through the tap)."""

    envoy: Envoy
    daemon: DaemonProcess
    backend: FakeOpenAI
    recorder: RlsRecorder | None
    fallback: FakeOpenAI | None = None

    def chat(
        self,
        user: str | None = "alice",
        *,
        max_tokens: int | None = 100,
        stream: bool = False,
        headers: dict[str, str] | None = None,
        cut_after: int | None = None,
        timeout: float = 30,
        prompt: str = "hi",
        model: str = "fake",
        body: dict[str, Any] | None = None,
    ) -> Answer:
        """One chat completion through Envoy. `cut_after` N: the client reads N bytes of
        the streamed answer and hangs up (a client abort mid-stream). `body` adds to (or
        replaces fields of) the JSON body, e.g. a `max_tokens` no count can be made of."""
        sent_body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
        }
        if max_tokens is not None:
            sent_body["max_tokens"] = max_tokens
        if stream:
            sent_body["stream"] = True
        sent_body.update(body or {})
        sent = {"content-type": "application/json", **(headers or {})}
        if user is not None:
            sent["x-user"] = user
        conn = http.client.HTTPConnection("127.0.0.1", self.envoy.port, timeout=timeout)
        try:
            conn.request("POST", PATH, json.dumps(sent_body).encode(), sent)
            resp = conn.getresponse()
            got = {k.lower(): v for k, v in resp.getheaders()}
            if cut_after is not None:
                data = resp.read(cut_after)
                sock = conn.sock
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
                return Answer(resp.status, got, data, complete=False)
            try:
                return Answer(resp.status, got, resp.read())
            except http.client.IncompleteRead as exc:
                return Answer(resp.status, got, exc.partial, complete=False)
        finally:
            conn.close()

    def counter(self, user: str, key: str = "user") -> dict[str, Any]:
        """The admin `/counters` view of the budget descriptor `key`=`user` (first window:
        used and reserved are the store's whatever limit a request carried)."""
        return self.counter_of(DOMAIN, [(key, user)])

    def counter_of(self, domain: str, entries: list[tuple[str, str]]) -> dict[str, Any]:
        """The admin `/counters` view of a descriptor of `domain` (its first window)."""
        query = urllib.parse.urlencode(
            [("domain", domain), *(("entry", f"{k}={v}") for k, v in entries)]
        )
        url = f"http://127.0.0.1:{self.daemon.debug_port}/counters?{query}"
        status, raw = http_request(url, None, 10, {"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert status == 200, raw
        window: dict[str, Any] = json.loads(raw)["windows"][0]
        return window

    def body_bytes(self, index: int = -1) -> int:
        """The size of the body of a request the backend received (the prompt's bound the
        reserve example adds to max_tokens)."""
        return int(self.backend.requests[index].headers["content-length"])

    def close(self) -> None:
        """Stop everything started for the stack."""
        self.envoy.close()
        if self.recorder is not None:
            self.recorder.close()
        self.daemon.close()
        self.backend.close()
        if self.fallback is not None:
            self.fallback.close()


@contextmanager
def llm_stack(
    workdir: Path,
    envoy_example: str,
    daemon_config: str,
    *,
    record: bool = True,
    **env: str,
) -> Iterator[LlmStack]:
    """A ready LlmStack: the daemon (memory backend, admin endpoints on) serving
    `daemon_config`, Envoy on `envoy_example`, the fake backend; `env` more variables."""
    backend = FakeOpenAI()
    started: list[Any] = [backend]
    routes = "llm_fallback" in (EXAMPLES / envoy_example / "envoy.yaml").read_text()
    fallback = FakeOpenAI("fallback") if routes else None
    if fallback is not None:
        started.append(fallback)
    try:
        environ = daemon_environment(
            workdir / "runtime", BACKEND_TYPE="memory", LOG_LEVEL="warn", ADMIN_TOKEN=ADMIN_TOKEN
        )
        (workdir / "runtime" / "config" / "llm.yaml").write_text(daemon_config)
        daemon = start_daemon(environ | env, workdir)
        started.append(daemon)
        recorder = RlsRecorder(daemon.grpc_target) if record else None
        if recorder is not None:
            started.append(recorder)
        rls_port = recorder.port if recorder is not None else daemon.grpc_port

        def spawn() -> Envoy:
            port, admin = free_port(), free_port()
            text = envoy_config(
                envoy_example,
                listen_port=port,
                admin_port=admin,
                backend_port=backend.port,
                rls_port=rls_port,
                fallback_port=fallback.port if fallback is not None else 0,
            )
            return Envoy(text, workdir, port, admin)

        envoy = start_bound(spawn)
        started.append(envoy)
        stack = LlmStack(envoy, daemon, backend, recorder, fallback)
        started.clear()
        try:
            yield stack
        finally:
            stack.close()
    finally:
        for proc in reversed(started):
            proc.close()


def concurrent_streams(
    stack: LlmStack,
    n: int,
    *,
    max_tokens: int,
    usage: int,
    user: str = "crowd",
    gate: str = "wave",
    prompt_tokens: int = 0,
) -> list[Answer]:
    """N streaming requests at once, each asking `max_tokens` and using `usage`, plus
    `prompt_tokens` of prompt (a prompt of four bytes a token, as English text has).

    The backend holds every stream it receives at `gate` until each of the N requests has
    either reached it or been answered by Envoy (a 429): so every admitted stream is in
    flight together, the worst case a budget must hold against, and the run is the same
    every time. Then all complete.
    """
    answers: list[Answer | None] = [None] * n
    answered = threading.Semaphore(0)

    def one(i: int) -> None:
        try:
            answers[i] = stack.chat(
                user,
                max_tokens=max_tokens,
                stream=True,
                headers={
                    "x-fake-usage": str(usage),
                    "x-fake-gate": gate,
                    "x-fake-prompt": str(prompt_tokens),
                },
                prompt="tok " * prompt_tokens or "hi",
            )
        finally:
            answered.release()

    before = len(stack.backend.requests)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()

    def settled() -> bool:
        reached = len(stack.backend.requests) - before
        refused = sum(1 for a in answers if a is not None)
        return reached + refused >= n

    wait_for(settled, 60, "every stream admitted (at the backend) or refused")
    stack.backend.open(gate)
    for t in threads:
        t.join(60)
    return [a for a in answers if a is not None]


def wait_stream_ends(stack: LlmStack, count: int, predicate: Callable[[Any], bool]) -> None:
    """Wait until the tap has recorded `count` descriptors matching `predicate` (the
    stream-end calls Envoy makes after the client's answer)."""
    assert stack.recorder is not None
    recorder = stack.recorder

    def seen() -> bool:
        return sum(predicate(d) for c in recorder.snapshot() for d in c.descriptors) >= count

    wait_for(seen, 30, f"{count} stream-end descriptors at the rate-limit service")
