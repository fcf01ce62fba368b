"""The README is a front door: short, with the run and test commands on its first screen, and
every link into docs/ (and every link between the docs) leading somewhere that exists."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from support import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
MAX_WORDS = 3_000
# What a reader sees without scrolling: the title, the pitch and the commands block.
FIRST_SCREEN_LINES = 25
FENCE = re.compile(r"^ *```.*?^ *```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """`text` without its fenced code blocks (their `#` lines are comments, not headings)."""
    return FENCE.sub("", text)


def sections(text: str) -> list[str]:
    """`text` split at its second-level headings, each part starting with its heading."""
    starts = [m.start() for m in re.finditer(r"^## ", text, re.MULTILINE)]
    bounds = [0, *starts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def anchors(path: Path) -> set[str]:
    """The heading anchors GitHub makes for `path`: lower case, punctuation but `-` and `_`
    dropped, spaces as `-`."""
    found = set()
    for line in prose(path.read_text()).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
            found.add(slug)
    return found


def test_the_readme_is_at_most_3000_words() -> None:
    words = len(README.read_text().split())
    assert words <= MAX_WORDS, f"README.md: {words} words (at most {MAX_WORDS})"


def test_the_first_screen_has_the_run_and_test_commands() -> None:
    first_screen = README.read_text().splitlines()[:FIRST_SCREEN_LINES]
    assert "bash scripts/run.sh" in first_screen
    assert "bash scripts/test.sh" in first_screen
    # The test command is the one CI runs.
    assert "exec bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        has_anchors = linked.exists() and linked.suffix == ".md"
        if not linked.exists() or (anchor and has_anchors and anchor not in anchors(linked)):
            broken.append(target)
    assert broken == [], f"{page.relative_to(REPO)}: broken links {broken}"


def test_the_readme_links_every_docs_page() -> None:
    linked = set(LINK.findall(prose(README.read_text())))
    assert [p.name for p in DOCS if f"docs/{p.name}" not in linked] == []
