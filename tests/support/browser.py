"""A real headless browser: Debian's Chromium (`chromium`, installed by scripts/bootstrap.sh
--system), driven from its command line: a screenshot of a page, or the DOM after it loaded.

A missing binary fails the test (FileNotFoundError), never skips it. Each call runs in a
fresh profile directory, so cookies a page sets live for that load only (redirects included).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

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
