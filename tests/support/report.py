"""Markdown for bench/results: the one way a benchmark writes a table or its load line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def table(columns: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """A Markdown table of already formatted cells. `align` has one letter a column, `l`
    (text) or `r` (figures); by default the first column is text and the rest figures."""
    align = align or "l" + "r" * (len(columns) - 1)
    if len(align) != len(columns):
        raise ValueError(f"{len(columns)} columns, alignment {align!r}")
    rule = "|".join("---" if a == "l" else "---:" for a in align)
    lines = ["| " + " | ".join(columns) + " |", f"|{rule}|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def load_averages(load: Mapping[str, Sequence[float]]) -> str:
    """The 1, 5 and 15 minute load averages `before` and `after` a measurement, as one
    benchmark on a shared machine reports them: `0.61 / 0.43 / 0.92, 0.77 / 0.51 / 0.92`."""
    return ", ".join(" / ".join(f"{x:.2f}" for x in load[when]) for when in ("before", "after"))
