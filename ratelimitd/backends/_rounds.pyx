# cython: language_level=3
"""A store round started from C, for the decision's engine: a store whose `increment_later`
is a `Rounds` takes a plan's fixed windows as C values (each window's key, hits and
seconds), so that a decision that only consumes fixed windows makes no `Op` per window for
it to read back. The store keeps its encoding (Redis's `resp.Sender` writes the commands);
what this contract carries is what an `Op` of a consumed fixed window would.
"""


cdef class Rounds:
    """`increment_later`, with a C entry for fixed windows (`fixed`). A subclass is callable
    as `increment_later(ops, waiter)` too: every other kind of count comes as `Op`s."""

    cdef int fixed(self, list keys, long long* numbers, object waiter) except -1:
        """Start the round that counts `numbers[2 * i]` hits on the fixed window
        `keys[i]` (a str), expiring after `numbers[2 * i + 1]` seconds, for every key:
        1, and `waiter(results)` is called as `increment_later`'s; 0 when this store
        cannot (nothing started: hand it the `Op`s). Raises as `increment_later` does.
        `numbers` is the caller's scratch: the store may change it."""
        return 0
