"""A real headless browser: Debian's Chromium (`chromium`, installed by scripts/bootstrap.sh
--system), driven from its command line: a screenshot of a page, or the DOM after it loaded;
and, for benchmarks, over the DevTools protocol (`DevTools`: the browser's own timings).

A missing binary fails the test (FileNotFoundError), never skips it. Each call runs in a
fresh profile directory, so cookies a page sets live for that load only (redirects included).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import httpx

if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection

BINARY = "chromium"


def _run(url: str, *args: str, timeout: float = 90) -> str:
    binary = shutil.which(BINARY)
    if binary is None:
        raise FileNotFoundError(f"{BINARY} is not installed (scripts/bootstrap.sh --system)")
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        argv = [
            binary,
            "--headless",
            "--no-sandbox",  # the tests may run as root (CI containers)
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            *args,
            url,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def screenshot(url: str, path: Path, width: int = 1200, height: int = 1400) -> Path:
    """A PNG of the page at `url`, written to `path`."""
    _run(url, f"--screenshot={path}", f"--window-size={width},{height}",
         "--hide-scrollbars")  # fmt: skip
    if not path.is_file() or path.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        raise AssertionError(f"chromium wrote no PNG at {path}")
    return path


def dom(url: str) -> str:
    """The page's DOM (serialised HTML) once it has loaded."""
    return _run(url, "--dump-dom")


class DevTools:
    """A headless Chromium driven over the DevTools protocol (one page, one connection): for
    benchmarks that read the browser's own timings. `with DevTools() as page: ...`."""

    def __init__(self, timeout: float = 30.0) -> None:
        binary = shutil.which(BINARY)
        if binary is None:
            raise FileNotFoundError(f"{BINARY} is not installed (scripts/bootstrap.sh --system)")
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-cdp-")
        argv = [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--remote-debugging-port=0",  # Chromium picks a free port and says which
            f"--user-data-dir={self._profile.name}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self._next_id = 0
        try:
            self._ws = self._connect()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> ClientConnection:
        from websockets.sync.client import connect

        assert self.proc.stderr is not None
        # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        for line in self.proc.stderr:
            match = re.search(r"DevTools listening on ws://([^/]+)/", line)
            if match:
                break
        else:
            raise AssertionError(f"chromium exited ({self.proc.wait()}) without a DevTools port")
        # stderr goes on being written: drain it so Chromium never blocks on a full pipe.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        targets = httpx.get(f"http://{match.group(1)}/json/list", timeout=self.timeout).json()
        page = next(t for t in targets if t["type"] == "page")
        return connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=self.timeout)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events arriving meanwhile are dropped)."""
        self._next_id += 1
        ident = self._next_id
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=self.timeout))
            if message.get("id") == ident:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message["result"]  # type: ignore[no-any-return]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (not subject to the page's CSP)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def load(self, url: str) -> dict[str, Any]:
        """Navigate to `url` and wait for its load event to end; the navigation timing entry
        (`performance.getEntriesByType('navigation')[0]`, as JSON)."""
        # The document before still answers until the new one commits (the same URL too):
        # told apart by its time origin.
        before = self.evaluate("performance.timeOrigin")
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + self.timeout
        expression = (
            "(() => { const e = performance.getEntriesByType('navigation')[0];"
            f" return performance.timeOrigin !== {before!r} && e && e.loadEventEnd > 0"
            " ? e.toJSON() : null; })()"
        )
        while time.monotonic() < deadline:
            entry = self.evaluate(expression)
            if entry is not None:
                return entry  # type: ignore[no-any-return]
            time.sleep(0.005)
        raise AssertionError(f"{url} did not finish loading in {self.timeout} s")

    def close(self) -> None:
        """Close the connection, stop Chromium, remove its profile."""
        if getattr(self, "_ws", None) is not None:
            self._ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._profile.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
