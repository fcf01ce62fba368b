"""A fake OpenAI-style chat completions backend, in process, for the token budget tests.

`POST /v1/chat/completions` with a JSON body (`max_tokens`, `stream`): a JSON completion,
or with `"stream": true` a Server-Sent Events stream of chunks ending with a usage chunk
(as OpenAI sends with `stream_options.include_usage`) and `data: [DONE]`. What it does is
steered per request by headers, so one backend serves every case of a test:

  x-fake-usage: N        completion tokens reported (default: max_tokens // 2)
  x-fake-prompt: N       prompt tokens reported (default 0): usage.total_tokens is both
  x-fake-status: 500     answer that status with an error body and no usage
  x-fake-chunks: N       content chunks before the usage one (default 3)
  x-fake-delay-ms: N     pause before each chunk (default 0)
  x-fake-gate: NAME      hold the response until `open(NAME)` (in-flight streams line up)
  x-fake-abort-after: N  close the connection after N chunks (an upstream dying mid-stream)
  x-fake-no-usage: 1     stream without the usage chunk

Every request is recorded (`requests`): its headers and JSON body, and how it ended
(`completed`, `aborted`, `client_gone`). Every response says which backend served it
(`x-served-by: <name>`: a stack may route between two). HTTP/1.1 as Envoy speaks it to an upstream:
keep-alive, Content-Length requests, chunked streamed responses.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from .ready import free_port

__all__ = ["FakeOpenAI", "Recorded"]


@dataclass
class Recorded:
    """One request the backend received, and how its response ended."""

    headers: dict[str, str]
    body: dict[str, Any]
    status: int = 0
    usage: int | None = None  # usage.total_tokens sent, None when none was
    ended: str = ""  # completed, aborted (by us), client_gone
    done: threading.Event = field(default_factory=threading.Event)


class FakeOpenAI:
    """The backend on a free port of 127.0.0.1, served by its own thread and event loop."""

    def __init__(self, name: str = "primary") -> None:
        self.name = name
        self.port = free_port()
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._gates: dict[str, asyncio.Event] = {}
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        started.wait(10)

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", self.port)
        )
        started.set()
        self._loop.run_forever()

    def open(self, gate: str) -> None:
        """Release every response held at `gate` (and any that arrive later)."""
        self._loop.call_soon_threadsafe(self._gate(gate).set)

    def waiting(self) -> int:
        """Requests received whose response has not ended yet."""
        with self._lock:
            return sum(1 for r in self.requests if not r.ended)

    def close(self) -> None:
        """Stop serving; connections are dropped."""

        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _gate(self, name: str) -> asyncio.Event:
        gate = self._gates.get(name)
        if gate is None:
            gate = self._gates[name] = asyncio.Event()
        return gate

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {}
                rec = Recorded(headers, body if isinstance(body, dict) else {})
                with self._lock:
                    self.requests.append(rec)
                try:
                    keep = await self._respond(rec, writer)
                finally:
                    if not rec.ended:
                        rec.ended = "client_gone"
                    rec.done.set()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _respond(self, rec: Recorded, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must close."""
        h = rec.headers
        max_tokens = rec.body.get("max_tokens")
        if "x-fake-usage" in h:
            usage = int(h["x-fake-usage"])
        else:  # a max_tokens no provider would take is answered as one without it
            usage = (max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 4096) // 2
        gate = h.get("x-fake-gate")
        if gate:
            await self._gate(gate).wait()
        status = int(h.get("x-fake-status", "200"))
        if status != 200:
            error = json.dumps({"error": {"message": "fake failure", "type": "server_error"}})
            self._write(writer, status, "application/json", error.encode())
            rec.status, rec.ended = status, "completed"
            await writer.drain()
            return True
        rec.status = 200
        prompt = int(h.get("x-fake-prompt", "0"))
        usage_doc = {
            "prompt_tokens": prompt,
            "completion_tokens": usage,
            "total_tokens": prompt + usage,
        }
        if not rec.body.get("stream"):
            reply = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                "usage": usage_doc,
            }
            self._write(writer, 200, "application/json", json.dumps(reply).encode())
            rec.usage, rec.ended = prompt + usage, "completed"
            await writer.drain()
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-served-by: %b\r\n"
            b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n" % self.name.encode()
        )
        chunks = int(h.get("x-fake-chunks", "3"))
        delay = int(h.get("x-fake-delay-ms", "0")) / 1000
        abort_after = int(h.get("x-fake-abort-after", "-1"))
        for i in range(chunks):
            if i == abort_after:
                rec.ended = "aborted"
                writer.transport.abort()
                return False
            if delay:
                await asyncio.sleep(delay)
            delta = {"choices": [{"index": 0, "delta": {"content": f"tok{i} "}}]}
            self._event(writer, json.dumps(delta))
            await writer.drain()
        if not h.get("x-fake-no-usage"):
            self._event(writer, json.dumps({"choices": [], "usage": usage_doc}))
            rec.usage = prompt + usage
        self._event(writer, "[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        rec.ended = "completed"
        return True

    @staticmethod
    def _event(writer: asyncio.StreamWriter, data: str) -> None:
        payload = f"data: {data}\n\n".encode()
        writer.write(b"%x\r\n%b\r\n" % (len(payload), payload))

    def _write(self, writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes) -> None:
        reason = {200: "OK", 500: "Internal Server Error"}.get(status, "Error")
        writer.write(
            b"HTTP/1.1 %d %b\r\ncontent-type: %b\r\nx-served-by: %b\r\ncontent-length: %d"
            b"\r\n\r\n%b"
            % (status, reason.encode(), ctype.encode(), self.name.encode(), len(body), body)
        )
