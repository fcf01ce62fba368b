"""A server subprocess: own session, output in a log file, readiness polled, stopped by pid.

Subclasses (redis-server, memcached, the daemon, Envoy, gunicorn) add their command line and a
`ready()` probe; `start_bound` retries a start that lost the race for a free port.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self, TypeVar

from .ready import wait_for

REPO = Path(__file__).resolve().parents[2]
_TICK = os.sysconf("SC_CLK_TCK")


class Proc:
    """A started subprocess in its own session, its stdout and stderr in `log_path`."""

    name = "process"

    def __init__(
        self,
        argv: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.argv, self.env, self.cwd = argv, env, cwd
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed by close()
        self._spawn()

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid

    def start(self, timeout: float = 20.0) -> Self:
        """Start the process again if it was stopped (same command, same ports); wait_ready."""
        if self.proc.poll() is not None:
            if self._log.closed:
                self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by close()
            self._spawn()
        return self.wait_ready(timeout)

    def log(self) -> str:
        """Everything the process printed so far."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        """True while running; AssertionError with the log's tail once it exited."""
        if self.proc.poll() is not None:
            tail = self.log()[-3000:]
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")
        return True

    def ready(self) -> bool:
        """True once the process serves (subclasses probe their listener)."""
        return True

    def wait_ready(self, timeout: float = 20.0) -> Self:
        """Block until `ready()`; a process that dies or never gets there is stopped."""
        try:
            wait_for(lambda: self.alive() and self.ready(), timeout, f"{self.name} readiness")
        except AssertionError as exc:
            self.close()
            if "exited with" in str(exc):
                raise
            raise AssertionError(f"{exc}:\n{self.log()[-3000:]}") from None
        return self

    def children(self) -> list[int]:
        """Pids of the direct children alive now (a supervisor's workers)."""
        return _children().get(self.pid, [])

    def cpu(self) -> float:
        """CPU seconds used by this process and its descendants alive now."""
        return cpu_seconds(process_tree(self.pid))

    def rss_kib(self) -> int:
        """This process's resident set, KiB."""
        return rss_kib(self.pid)

    def open_fds(self) -> int:
        """How many descriptors this process has open."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def pause(self) -> None:
        """SIGSTOP: the server hangs with its sockets open."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        os.kill(self.pid, signal.SIGCONT)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait (SIGKILL to the session if it lingers); the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._release()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the session now (a paused process too)."""
        if self.proc.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        """Kill whatever is left and release what the helper holds; safe to call twice."""
        self.kill()
        self._release()

    def _release(self) -> None:
        # What the helper holds besides the process (subclasses add their clients).
        self._log.close()


P = TypeVar("P", bound=Proc)


def start_bound(factory: Callable[[], P], attempts: int = 3, timeout: float = 20.0) -> P:
    """`factory()` (a process on fresh free ports) until it is ready.

    A port found free may be taken by another process before the server binds it; only that
    failure is retried, with new ports.
    """
    for attempt in range(attempts):
        proc = factory()
        try:
            proc.wait_ready(timeout)
            return proc
        except AssertionError as exc:
            lost_race = "address already in use" in str(exc).lower()
            if not lost_race or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@contextmanager
def scratch(prefix: str) -> Iterator[tuple[Path, list[Proc]]]:
    """A temporary directory and a list to put started servers in; on the way out the
    servers are stopped, last started first, and the directory removed (a benchmark's run)."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    procs: list[Proc] = []
    try:
        yield directory, procs
    finally:
        for proc in reversed(procs):
            proc.terminate()
        shutil.rmtree(directory, ignore_errors=True)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants alive now."""
    tree = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, ()))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes (all threads) have used, from /proc/<pid>/stat."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / _TICK


def rss_kib(pid: int) -> int:
    """VmRSS of `pid`, KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(
    *argv: str, cwd: Path = REPO, timeout: float = 120, **options: Any
) -> subprocess.CompletedProcess[str]:
    """A command run to its end: exit status, stdout and stderr as text, never raising on a
    failed run (`options`: `subprocess.run`'s, e.g. `env`, its whole environment)."""
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False, **options
    )


def binary(name: str, install: str) -> str:
    """The path of a server binary; a missing one is a failure (never a skip)."""
    path = shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} is not installed ({install})")
    return path
