"""Faults around a running daemon: unreadable configs, signals, a dead supervisor.

A config that cannot be read is a failed load: real read errors in a real daemon (its
config directory renamed away during a reload, its file-descriptor limit lowered with
`prlimit` so that every open() fails with EMFILE while a new config lands) must count
`config_load_error`, log one ERROR line with the path and the errno, keep the previous
rules in force, and load the new config once the files can be read again, with
RUNTIME_WATCH_ROOT true or false.

SIGHUP reloads; a supervisor killed with SIGKILL takes its workers down; the memory backend
warns that N workers count N times.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import wait_for
from support.daemon import DaemonProcess, write_config

CONFIG = """\
domain: test
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: {limit}
"""


def limit_of(d: DaemonProcess) -> int | None:
    rule = d.decide("test", [("user", "probe")]).statuses[0].rule
    return None if rule is None else rule.requests_per_unit


def counter(d: DaemonProcess, name: str) -> float:
    return d.stats()[f"ratelimit.service.config_load_{name}"]


def error_lines(d: DaemonProcess) -> list[str]:
    return [line for line in d.log().splitlines() if "Error loading new configuration" in line]


def test_a_directory_renamed_away_during_a_reload_keeps_the_last_good_config(
    daemon_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    write_config(daemon_env, "test.yaml", CONFIG.format(limit=3))
    d = start_daemon(daemon_env)
    assert limit_of(d) == 3
    config = Path(daemon_env["RUNTIME_ROOT"]) / "config"
    config.rename(config.with_name("config.deploying"))
    wait_for(lambda: counter(d, "error") >= 1, what="the failed load")
    # Still limited by the last good config; nothing was loaded as a success.
    assert limit_of(d) == 3
    assert counter(d, "success") == 1
    assert b"test.user: unit=MINUTE requests_per_unit=3" in d.debug("/rlconfig")[1]
    line = error_lines(d)[0]
    assert "level=error" in line
    assert f"{config}: error reading config: No such file or directory [errno 2 ENOENT]" in line

    config.with_name("config.deploying").rename(config)
    (config / "test.yaml").write_text(CONFIG.format(limit=5))
    wait_for(lambda: limit_of(d) == 5, what="the next good load")
    assert d.terminate() == 0


@pytest.mark.parametrize("watch_root", [False, True])
def test_running_out_of_file_descriptors_during_a_reload_keeps_the_last_good_config(
    daemon_env: dict[str, str],
    start_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
    watch_root: bool,
) -> None:
    env = dict(daemon_env)
    if watch_root:
        for version, limit in (("v1", 3), ("v2", 5)):
            (tmp_path / version / "config").mkdir(parents=True)
            (tmp_path / version / "config" / "test.yaml").write_text(CONFIG.format(limit=limit))
        current = tmp_path / "current"
        current.symlink_to(tmp_path / "v1")
        env.update(RUNTIME_ROOT=str(current), RUNTIME_WATCH_ROOT="true")
    else:
        write_config(env, "test.yaml", CONFIG.format(limit=3))
    d = start_daemon(env)
    assert limit_of(d) == 3

    soft, hard = resource.prlimit(d.pid, resource.RLIMIT_NOFILE)
    # Soft limit 0: from now on every open(), socket() or pipe() in the daemon fails with
    # EMFILE, exactly as when its clients have used up every descriptor.
    resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (0, hard))
    try:
        if watch_root:
            swapped = tmp_path / "current.tmp"
            swapped.symlink_to(tmp_path / "v2")
            os.replace(swapped, current)
        else:
            write_config(env, "test.yaml", CONFIG.format(limit=5))
        wait_for(lambda: "EMFILE" in d.log(), what="a reload attempt that ran out of fds")
    finally:
        resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (soft, hard))
    line = next(line for line in error_lines(d) if "EMFILE" in line)
    assert "Too many open files [errno 24 EMFILE]" in line
    assert "level=error" in line
    # The failed attempt is retried without waiting for another change, and nothing but
    # the old or the new rules were ever in force.
    wait_for(lambda: limit_of(d) == 5, what="the retried load")
    stats = d.stats()
    assert stats["ratelimit.service.config_load_error"] >= 1
    assert stats["ratelimit.service.config_load_success"] == 2
    assert d.terminate() == 0


def test_a_load_with_no_domains_after_one_with_some_is_a_warning(
    daemon_env: dict[str, str], start_daemon: Callable[..., DaemonProcess]
) -> None:
    path = write_config(daemon_env, "test.yaml", CONFIG.format(limit=3))
    d = start_daemon(daemon_env)
    path.unlink()  # an empty directory is a valid config: no domains
    wait_for(lambda: limit_of(d) is None, what="the empty config")
    warning = [line for line in d.log().splitlines() if "no domains" in line]
    assert warning and "level=warning" in warning[0]
    assert "the previous one had 1" in warning[0]
    assert d.terminate() == 0


# -- signals and workers ------------------------------------------------------------------


@pytest.fixture
def watched_root(daemon_env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], Path]:
    """RUNTIME_WATCH_ROOT=true on a symlink: editing a file under it reloads nothing."""
    (tmp_path / "v1" / "config").mkdir(parents=True)
    path = tmp_path / "v1" / "config" / "test.yaml"
    path.write_text(CONFIG.format(limit=3))
    current = tmp_path / "current"
    current.symlink_to(tmp_path / "v1")
    return dict(daemon_env, RUNTIME_ROOT=str(current), RUNTIME_WATCH_ROOT="true"), path


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def reap() -> Iterator[list[int]]:
    """Pids to SIGKILL at teardown (workers orphaned if a test fails)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_sighup_reloads_the_config_and_the_daemon_keeps_serving(
    watched_root: tuple[dict[str, str], Path], start_daemon: Callable[..., DaemonProcess]
) -> None:
    env, path = watched_root
    d = start_daemon(env)
    assert limit_of(d) == 3
    path.write_text(CONFIG.format(limit=7))  # in place: no symlink swap, no reload
    os.kill(d.pid, signal.SIGHUP)
    wait_for(lambda: limit_of(d) == 7, what="the reload SIGHUP asked for")
    assert d.alive()
    assert "reloading the configuration (SIGHUP)" in d.log()
    assert d.terminate() == 0


def test_sighup_to_the_supervisor_reloads_every_worker(
    watched_root: tuple[dict[str, str], Path],
    start_daemon: Callable[..., DaemonProcess],
    reap: list[int],
) -> None:
    env, path = watched_root
    d = start_daemon(dict(env, RATELIMITD_WORKERS="2"))
    wait_for(lambda: d.log().count("ratelimitd serving") == 2, what="two workers serving")
    workers = d.worker_pids()
    reap.extend(workers)
    path.write_text(CONFIG.format(limit=7))
    os.kill(d.pid, signal.SIGHUP)
    wait_for(
        lambda: (
            d.log().count("reloading the configuration (SIGHUP)") == 2
            and d.log().count("loaded rate limit configuration") == 4
        ),
        what="both workers reloaded",
    )
    assert d.worker_pids() == workers and d.alive()
    assert limit_of(d) == 7
    assert d.terminate() == 0


def test_a_supervisor_killed_with_sigkill_takes_its_workers_down(
    daemon_env: dict[str, str], start_daemon: Callable[..., DaemonProcess], reap: list[int]
) -> None:
    (Path(daemon_env["RUNTIME_ROOT"]) / "config" / "test.yaml").write_text(CONFIG.format(limit=3))
    d = start_daemon(dict(daemon_env, RATELIMITD_WORKERS="2"))
    wait_for(lambda: len(d.worker_pids()) == 2, what="two workers")
    workers = d.worker_pids()
    reap.extend(workers)
    os.kill(d.pid, signal.SIGKILL)
    d.proc.wait()
    wait_for(lambda: not any(alive(pid) for pid in workers), what="the workers to exit")
    assert not d.ready()  # nobody serves the port any more


def test_a_worker_started_after_its_supervisor_died_exits_at_once(
    daemon_env: dict[str, str], serve_until_exit: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    # The race PR_SET_PDEATHSIG cannot cover: the supervisor died between fork and prctl.
    # Its pid is then no longer the worker's parent (here the parent is pytest itself).
    env = dict(
        daemon_env,
        RATELIMITD_WORKERS="1",
        RATELIMITD_WORKER_INDEX="0",
        RATELIMITD_SUPERVISOR_PID=str(os.getpid() + 1_000_000),
    )
    done = serve_until_exit(env, 60)
    assert done.returncode == 0
    lines = [line for line in done.stderr.splitlines() if "supervisor" in line]
    assert len(lines) == 1 and "is gone" in lines[0]
    assert "ratelimitd serving" not in done.stderr


def test_the_memory_backend_with_several_workers_warns_at_start(
    daemon_env: dict[str, str], start_daemon: Callable[..., DaemonProcess], reap: list[int]
) -> None:
    (Path(daemon_env["RUNTIME_ROOT"]) / "config" / "test.yaml").write_text(CONFIG.format(limit=3))
    d = start_daemon(dict(daemon_env, RATELIMITD_WORKERS="2", BACKEND_TYPE="memory"))
    reap.extend(d.worker_pids())
    warning = [line for line in d.log().splitlines() if "each worker counts" in line]
    assert len(warning) == 1 and "level=warning" in warning[0]
    assert "up to 2x its requests_per_unit" in warning[0]
    assert d.terminate() == 0
