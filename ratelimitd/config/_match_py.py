"""The descriptor trie and the reference lookup algorithm: the pure-Python twin.

`_match.pyx` is the compiled twin with the same names; `match.py` selects one.
A domain compiles to a `Level`: a dict from composite key (`key` or `key_value`) to
`Node`, plus the level's wildcard nodes in config order. Lookup is one dict probe per
request entry (plus the level's wildcards on a miss), so its cost does not grow with
the number of rules. The walk is envoyproxy/ratelimit's `GetLimit` (reference section
5): exact > wildcard (config order, first wins) > key-only, no backtracking, a limit
only at the request's own depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# How the node of one level was reached; it decides that level's part of a stats key.
EXACT, WILDCARD, KEY_ONLY = 0, 1, 2


def wildcard_match(parts: Sequence[str], s: str) -> bool:
    """Does `s` match a pattern pre-split on `*`? (`*` matches zero or more characters.)"""
    first = parts[0]
    if not s.startswith(first):
        return False
    pos = len(first)
    last_index = len(parts) - 1
    for j in range(1, last_index):
        mid = parts[j]
        found = s.find(mid, pos)
        if found < 0:
            return False
        pos = found + len(mid)
    last = parts[last_index]
    return len(s) - len(last) >= pos and s.endswith(last)


class Node:
    """One config descriptor entry, compiled."""

    __slots__ = (
        "children",
        "detailed",
        "final_key",
        "full_key",
        "has_value",
        "key",
        "parts",
        "rule",
        "share",
        "value_to_metric",
    )

    def __init__(self, spec: Any) -> None:
        self.key: str = spec.key
        self.final_key: str = spec.final_key
        self.has_value: bool = bool(spec.value)
        self.rule: Any = spec.rule
        self.detailed: bool = spec.rule is not None and spec.rule.detailed_metric
        self.full_key: str = spec.rule.full_key if spec.rule is not None else ""
        self.value_to_metric: bool = bool(spec.value_to_metric)
        self.share: bool = bool(spec.share_threshold) and "*" in spec.final_key
        self.parts: tuple[str, ...] = tuple(spec.final_key.split("*"))
        self.children: Level | None = compile_level(spec.children) if spec.children else None


class Level:
    """The children of one node (or of a domain root)."""

    __slots__ = ("children", "wildcards")

    def __init__(self, children: dict[str, Node], wildcards: tuple[Node, ...]) -> None:
        self.children = children
        self.wildcards = wildcards


def compile_level(specs: Sequence[Any]) -> Level:
    """Compile config entries (objects with key, value, final_key, rule, value_to_metric,
    share_threshold, children) into a Level. Composite keys must already be unique."""
    children: dict[str, Node] = {}
    wildcards: list[Node] = []
    for spec in specs:
        node = Node(spec)
        children[spec.final_key] = node
        if "*" in spec.final_key:
            wildcards.append(node)
    return Level(children, tuple(wildcards))


def _trim_prefix(s: str, prefix: str) -> str:
    return s[len(prefix) :] if s.startswith(prefix) else s


def lookup(
    root: Level,
    domain: str,
    entries: Sequence[tuple[str, str]],
    walked: list[tuple[int, Node | None]] | None = None,
) -> tuple[Any, str, tuple[str, ...] | None, bool] | None:
    """Find the limit for one request descriptor.

    Returns None, or (rule, stats_key, share, keep_metadata): `share` is None or one
    pattern per entry ("" where the value is used) for the cache key; `keep_metadata` is
    False where the reference re-creates the limit and so loses its metadata.

    `walked`, when given, receives the walk itself, one `(how, node)` per level reached
    (EXACT, WILDCARD or KEY_ONLY), and `(-1, None)` for an entry that no node matched
    (where the walk stopped): what `/explain` tells.
    """
    n = len(entries)
    if n == 0:
        return None
    level = root
    rule = None
    leaf = False
    dynamic = False
    share: list[str] | None = None
    path: list[tuple[Node, int]] = []
    for i in range(n):
        k, v = entries[i]
        probe = k + "_" + v
        node = level.children.get(probe)
        how = EXACT
        if node is None:
            for w in level.wildcards:
                if wildcard_match(w.parts, probe):
                    node = w
                    how = WILDCARD
                    break
            if node is None:
                node = level.children.get(k)
                how = KEY_ONLY
                if node is None:
                    if walked is not None:
                        walked.append((-1, None))
                    break
        path.append((node, how))
        if walked is not None:
            walked.append((how, node))
        if how == WILDCARD:
            if node.share:
                if share is None:
                    share = [""] * n
                share[i] = _trim_prefix(node.final_key, k + "_")
            if node.value_to_metric or not (node.has_value and k == node.key):
                dynamic = True
        elif how == EXACT:
            if not v:
                dynamic = True
        elif node.value_to_metric and v:
            dynamic = True
        if node.rule is not None and i == n - 1:
            rule = node.rule
        if node.children is None:
            leaf = True
            break
        level = node.children
    if rule is None:
        return None

    node = path[n - 1][0]
    share_t = tuple(share) if share is not None else None
    if node.detailed:
        parts = [domain]
        for i in range(n):
            k, v = entries[i]
            if share_t is not None and share_t[i]:
                parts.append(k + "_" + share_t[i])
            elif share_t is not None:
                parts.append(k + "_" + v if v else k)
            else:
                parts.append(k + "_" + v)
        # A detailed leaf without children is re-created by the reference: metadata lost.
        return rule, ".".join(parts), share_t, not leaf
    if not dynamic:
        return rule, node.full_key, share_t, True
    parts = [domain]
    for i in range(n):
        k, v = entries[i]
        pnode, how = path[i]
        if how == WILDCARD:
            if share_t is not None and share_t[i]:
                parts.append(k + "_" + share_t[i])
            elif pnode.value_to_metric:
                parts.append(k + "_" + v if v else k)
            else:
                parts.append(k + "_" + _trim_prefix(pnode.final_key, k + "_"))
        elif how == EXACT:
            parts.append(k + "_" + v if v else k)
        elif pnode.value_to_metric and v:
            parts.append(k + "_" + v)
        else:
            parts.append(k)
    enhanced = ".".join(parts)
    if enhanced == node.full_key:
        return rule, enhanced, share_t, True
    return rule, enhanced, share_t, False


# What the compiled module provides too (`_twins.select` checks a build against it).
__all__ = [
    "Level",
    "Node",
    "compile_level",
    "lookup",
    "wildcard_match",
]
