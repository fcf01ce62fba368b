"""RATELIMITD_WORKERS=N: N daemon processes sharing the ports, supervised by this one.

Each worker is `python -m ratelimitd serve` with RATELIMITD_WORKERS=1, its own uvloop
event loop and its own listeners bound with SO_REUSEPORT, so the kernel spreads
connections across them. A worker that dies is restarted (with backoff when it keeps
dying); SIGTERM/SIGINT to the supervisor is passed on and every worker drains and exits;
SIGHUP is passed on and every worker reloads its config. A supervisor killed outright
(SIGKILL, OOM killer) leaves no worker serving: each worker asks the kernel for SIGTERM
when its parent dies (PR_SET_PDEATHSIG) and exits at start if its parent is already gone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ..settings import worker_environ

log = logging.getLogger("ratelimitd.process.workers")

# A worker that lived shorter than this is "crashing": its restart is delayed.
STABLE_SECONDS = 5.0
MAX_BACKOFF_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 30.0


# prctl(2) option: the signal this process gets when its parent dies (Linux).
PR_SET_PDEATHSIG = 1


def die_with_supervisor(supervisor_pid: int) -> bool:
    """In a worker: SIGTERM when the supervisor dies; False if it is already gone.

    The death signal is armed first and the parent checked after, so that a supervisor
    dying between our fork and the prctl (which then never signals) is still noticed.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
    return os.getppid() == supervisor_pid


def _spawn(index: int, stats_dir: str) -> subprocess.Popen[bytes]:
    env = worker_environ(index, stats_dir)
    # A worker ignores SIGHUP until its event loop handles it (an ignored signal stays
    # ignored across exec): a SIGHUP passed on while it starts must not kill it.
    return subprocess.Popen(
        [sys.executable, "-m", "ratelimitd", "serve"], env=env, preexec_fn=_ignore_sighup
    )


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def supervise(count: int, share_stats: bool = False) -> int:
    """Run `count` workers until told to stop; exit status 0 after a clean drain.

    With `share_stats` (the Prometheus sink) the workers publish their totals in a shared
    directory so that whichever worker answers a scrape serves the sum over all of them.
    """
    stats_dir = tempfile.mkdtemp(prefix="ratelimitd-stats-") if share_stats else ""
    try:
        return _supervise(count, stats_dir)
    finally:
        if stats_dir:
            shutil.rmtree(stats_dir, ignore_errors=True)


def _supervise(count: int, stats_dir: str) -> int:
    stopping = False
    reload = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    def hangup(signum: int, frame: object) -> None:
        nonlocal reload
        reload = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    signal.signal(signal.SIGHUP, hangup)

    workers = [_spawn(i, stats_dir) for i in range(count)]
    started = [time.monotonic()] * count
    backoff = [0.0] * count
    restart_at = [0.0] * count
    log.info("supervising %d workers: %s", count, [w.pid for w in workers])
    while not stopping:
        time.sleep(0.1)
        if reload:
            reload = False
            log.info("SIGHUP: every worker reloads its configuration")
            for worker in workers:
                if worker.poll() is None:
                    worker.send_signal(signal.SIGHUP)
        now = time.monotonic()
        for i, worker in enumerate(workers):
            code = worker.poll()
            if code is None or stopping:
                continue
            if restart_at[i] == 0.0:
                lived = now - started[i]
                backoff[i] = (
                    0.0
                    if lived > STABLE_SECONDS
                    else min(MAX_BACKOFF_SECONDS, max(0.5, backoff[i] * 2))
                )
                restart_at[i] = now + backoff[i]
                log.warning("worker %d (pid %d) exited with %s", i, worker.pid, code)
            if now >= restart_at[i]:
                workers[i] = _spawn(i, stats_dir)
                started[i] = now
                restart_at[i] = 0.0
                log.warning("worker %d restarted as pid %d", i, workers[i].pid)

    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    for worker in workers:
        try:
            worker.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    return 0
