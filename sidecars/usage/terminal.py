"""What the CLI draws on a terminal: the daily usage chart of `usage show` and the progress
bar of `usage export`. Pure text in, text out (the bar writes to the stream it is given)."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from typing import IO

from .db.daily import DailyUsage

# Eighths of a character cell, so a bar's length is exact to 1/8 of a column.
_BLOCKS = " ▏▎▍▌▋▊▉█"


def bar(value: int, top: int, width: int) -> str:
    """`value` of `top` as a bar of at most `width` cells."""
    if top <= 0 or value <= 0:
        return ""
    eighths = max(1, round(value / top * width * 8))
    full, part = divmod(eighths, 8)
    return "█" * full + (_BLOCKS[part] if part else "")


def chart(account: str, days: Sequence[DailyUsage], width: int = 80) -> str:
    """One line per day: date, a bar scaled to the busiest day, the usage; a note where the
    plan (or its quota) changes; a summary line."""
    if not days:
        return f"{account}: no daily usage recorded in this range\n"
    top = max(d.usage for d in days)
    figures = max(len(f"{d.usage:,}") for d in days)
    room = max(10, width - 10 - 2 - figures - 3)
    first, last = days[0], days[-1]
    lines = [f"{account}  {first.day} .. {last.day}  ({len(days)} days, UTC)"]
    previous: tuple[str, int] | None = None
    for d in days:
        line = f"{d.day} │{bar(d.usage, top, room):<{room}}│ {d.usage:>{figures},}"
        if (d.plan, d.limit) != previous:
            line += f"  {d.plan} ({d.limit:,} per window)"
            previous = (d.plan, d.limit)
        lines.append(line)
    busiest = max(days, key=lambda d: d.usage)
    total = sum(d.usage for d in days)
    lines.append(f"total {total:,}; busiest {busiest.day} with {busiest.usage:,}")
    return "\n".join(lines) + "\n"


def piped(stream: IO[str]) -> bool:
    """Whether `stream` goes to a pipe or socket (another program), not a file or terminal."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError):
        return True  # not a real file: no terminal to draw on either
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class Progress:
    """A one-line progress bar on a terminal (`out`), redrawn at most 10 times a second.

    `clear()` before writing to a stream that shares the terminal, so rows and the bar do
    not interleave; `done()` ends the line.
    """

    def __init__(self, out: IO[str], total: int, what: str = "rows") -> None:
        self.out = out
        self.total = total
        self.what = what
        self.count = 0
        self.started = time.monotonic()
        self._drawn = 0.0

    def advance(self, n: int) -> None:
        """`n` more done; redraw if the last drawing is 0.1 s old."""
        self.count += n
        now = time.monotonic()
        if now - self._drawn >= 0.1:
            self._drawn = now
            self.draw()

    def draw(self) -> None:
        """Draw the bar now."""
        share = self.count / self.total if self.total else 1.0
        elapsed = max(time.monotonic() - self.started, 1e-9)
        text = (
            f"[{bar(self.count, self.total, 30):<30}] {share:6.1%} "
            f"{self.count:,}/{self.total:,} {self.what} {self.count / elapsed:,.0f}/s"
        )
        self.out.write("\r\x1b[K" + text)
        self.out.flush()

    def clear(self) -> None:
        """Erase the bar's line."""
        self.out.write("\r\x1b[K")
        self.out.flush()

    def done(self) -> None:
        """Draw the final state and end the line."""
        self.draw()
        self.out.write("\n")
        self.out.flush()
