"""Place names as keys: matching a name however it is written, and the id of a locality
known by its name only."""

from __future__ import annotations

import re
import unicodedata


def fold(name: str) -> str:
    """Name key for matching: accents, case, punctuation and spacing do not matter."""
    text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    return re.sub(r"[^a-z0-9]+", " ", text).strip()


def locality_id(municipality_id: str, name: str) -> str:
    """The id of a locality known by name only: `<municipality_id>-<folded name>`
    (`1502-alcochete`), the ids of the shipped localities list."""
    return f"{municipality_id}-{fold(name).replace(' ', '-')}"
