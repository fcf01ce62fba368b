"""A config that cannot be read is a failed load: the last good config keeps serving.

Real read errors in a real daemon: its config directory renamed away during a reload, and
its file-descriptor limit lowered (`prlimit`) so that every open() fails with EMFILE while
a new config lands. Each must count `config_load_error`, log one ERROR line with the path
and the errno, keep the previous rules in force, and load the new config once the files can
be read again, with RUNTIME_WATCH_ROOT true or false.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
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
