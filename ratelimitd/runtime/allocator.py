"""Giving freed memory back to the operating system (glibc's malloc), so that the peak of a
flood does not stay resident once the flood is over (978 MB did, after a TLS flood).

Two things keep freed memory resident under glibc:

- its dynamic mmap threshold: a block of at least M_MMAP_THRESHOLD (128 KiB) is mmapped and
  unmapped when freed, but the first such block freed raises the threshold to its own size
  (up to 32 MiB), so from then on request buffers of 1-4 MiB come from the heap, where a
  freed block is a hole that stays resident. `tune()` fixes the threshold at 128 KiB, which
  also turns the adjustment off: large buffers always go back at once.
- fragmentation: a heap page is returned only when nothing on it is in use and it is at the
  top of the heap, unless malloc_trim(0) releases the free pages inside it (madvise). A
  `Trimmer` is told how many bytes were freed and calls it once 32 MiB were, at most once
  per second (a trim of a large heap costs a few milliseconds), and 5 s after the last
  4 MiB freed otherwise (the tail of a flood).

With another C library (musl) both are no-ops. CPython's small-object allocator returns its
1 MiB arenas by itself once they are empty.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("ratelimitd")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024
# Bytes freed before a trim is worth its cost, and the least time between two trims; fewer
# (but at least a eighth as many) are trimmed once nothing more was freed for TRIM_QUIET.
TRIM_AFTER = 32 * 1024 * 1024
TRIM_INTERVAL = 1.0
TRIM_QUIET = 5.0


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    except OSError:  # pragma: no cover - no C library to load
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def tune() -> bool:
    """Fix glibc's mmap threshold (see the module docstring); False when not glibc."""
    libc = _libc()
    if libc is None:
        return False
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    # The heap's own top is given back past 128 KiB free too (glibc raises this threshold
    # with the mmap one when it adjusts, which it no longer does).
    libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)
    return ok


def trim() -> bool:
    """malloc_trim(0): release the free pages of every heap; True if memory was released."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


@dataclass(eq=False, slots=True)
class Trimmer:
    """Calls `release` (`trim`) once enough memory was freed, at most once per `interval` (a
    trim due inside the interval runs at its end), or `quiet` seconds after a smaller amount
    was freed (on the running loop).

    Slots: the native transport reads `pending` and `wake` in C (`_h2`) for every call it
    gives back the bytes of."""

    after: int = TRIM_AFTER
    interval: float = TRIM_INTERVAL
    quiet: float = TRIM_QUIET
    clock: Callable[[], float] = time.monotonic
    release: Callable[[], bool] = trim
    pending: int = field(default=0, init=False)
    trims: int = field(default=0, init=False)
    # Below this many bytes pending, `freed` has nothing to do: an eighth of `after` with no
    # trim due, `after` once the quiet trim is due (only a full `after` can make it sooner),
    # and none at all once the interval's trim is due. A caller on a hot path (a connection
    # giving back a call's few hundred bytes) adds to `pending` and calls `freed(0)` only
    # past it: one comparison per call instead of a call and a clock read.
    wake: int = field(default=0, init=False)
    _scheduled: asyncio.TimerHandle | None = field(default=None, init=False)
    _due: float = field(default=0.0, init=False)
    _last: float = field(default=0.0, init=False)  # monotonic, of the last trim

    def __post_init__(self) -> None:
        self._last = -self.interval  # the first trim is never held back
        self.wake = self.after // 8

    def freed(self, n: int) -> None:
        """`n` bytes were freed."""
        self.pending += n
        if self.pending < self.after // 8:
            return
        if self.pending >= self.after:
            wait = self._last + self.interval - self.clock()
            if wait <= 0:
                self._cancel()
                self._trim()
                return
        else:
            wait = self.quiet  # a trim once the freeing has stopped
        due = self.clock() + wait
        if self._scheduled is not None and self._due <= due:
            return  # an earlier trim is already due
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test's synchronous use): the next call trims
        self._cancel()
        self._due = due
        self._scheduled = loop.call_later(wait, self._trim)
        self.wake = self.after if self.pending < self.after else 1 << 62

    def _cancel(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
            self.wake = self.after // 8

    def _trim(self) -> None:
        self._scheduled = None
        self.wake = self.after // 8
        self.pending = 0
        self._last = self.clock()
        self.trims += 1
        self.release()
