# cython: annotation_typing=False
"""The transactions of a budget in process memory (`memory_budget`): one record each, and
the heap of their deadlines.

Transactions are many (one per reserve, each kept a TTL after it ends), so a record holds
strings and C integers only: compiled, the cyclic collector does not track it (Cython
gives no collector hooks to a class whose objects can form no cycle), and a process holding
hundreds of thousands costs a collection nothing. A record is changed in place from
reserve to tombstone and queued once; the windows its estimate was reserved in are a
string, `name=start name=start` as the Redis script spells them, which a run of
reservations shares (`memory_budget._starts`) and `read` takes apart again.

Compiled in Cython's pure-Python mode (types in `budget_txns.pxd`); the same source runs
uncompiled where the extension is not built.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Txn", "pop", "push", "read", "spell"]


class Txn:
    """One transaction (`config.budget_store`): its state `o`pen, `c`ontested, or a
    tombstone (`s`, `x`, `r`) until `deadline`; its estimate; `starts` (`spell`). `due` is
    the deadline its heap entry is ordered by: a record whose deadline moved later keeps
    its place until that entry comes up, and is then queued again."""

    __slots__ = ("deadline", "due", "estimate", "id", "starts", "state")

    def __init__(self, id: str, state: str, estimate: int, starts: str, deadline: int) -> None:
        self.id = id
        self.state = state
        self.estimate = estimate
        self.starts = starts
        self.deadline = deadline
        self.due = deadline

    def copy(self) -> Txn:
        other = Txn(self.id, self.state, self.estimate, self.starts, self.deadline)
        other.due = self.due  # its place in a copied heap
        return other


def spell(starts: tuple[Any, ...]) -> str:
    """(name, start, name, start, ...) as a record holds it: `name=start name=start`."""
    return " ".join([f"{starts[i]}={starts[i + 1]}" for i in range(0, len(starts), 2)])


def read(spelt: str) -> tuple[Any, ...]:
    """`spell`'s (name, start, ...) back from its string."""
    out: list[Any] = []
    for pair in spelt.split():
        name, _, start = pair.rpartition("=")
        out += (name, int(start))
    return tuple(out)


def _before(a: Txn, b: Txn) -> bool:
    """Heap order: by `due`, then by id (the order of Redis' deadline set)."""
    return a.due < b.due or (a.due == b.due and a.id < b.id)


def push(heap: list[Txn], x: Txn) -> None:
    """heapq's push, in `_before`'s order (records compared by their C fields)."""
    heap.append(x)
    i = len(heap) - 1
    while i > 0:
        parent = (i - 1) >> 1
        p = heap[parent]
        if not _before(x, p):
            break
        heap[i] = p
        i = parent
    heap[i] = x


def pop(heap: list[Txn]) -> Txn:
    """heapq's pop, in `_before`'s order."""
    last = heap.pop()
    if not heap:
        return last
    top = heap[0]
    n, i, child = len(heap), 0, 1
    while child < n:
        if child + 1 < n and _before(heap[child + 1], heap[child]):
            child += 1
        c = heap[child]
        if not _before(c, last):
            break
        heap[i] = c
        i, child = child, 2 * child + 1
    heap[i] = last
    return top
