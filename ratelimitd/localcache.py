"""The local over-limit cache (LOCAL_CACHE_SIZE_IN_BYTES): keys known to be over limit.

A key in the cache is answered OVER_LIMIT without touching the backend. Entries expire
at the end of their window: a cache key carries its window start, so after that it can
never be asked for again (the reference keeps it a whole unit; the answers are the same).
Capacity is counted as the reference's freecache counts it: an entry takes
its key's bytes plus freecache's 24-byte entry header (the value is empty), and a cache is never
smaller than freecache's 512 KiB minimum, whatever LOCAL_CACHE_SIZE_IN_BYTES asks (so a small
setting caches about as many keys as the reference does, where it once cached none). The oldest
entries are evicted first (freecache evicts per segment of 1/256 of its capacity: close, not
identical).
"""

from __future__ import annotations

# freecache's ENTRY_HDR_SIZE: what an entry costs on top of its key (and empty value).
ENTRY_OVERHEAD = 24
# freecache's minBufSize: NewCache(size) never makes a smaller cache.
MIN_CAPACITY = 512 * 1024


def reference_capacity(size_in_bytes: int) -> int:
    """The capacity freecache gives LOCAL_CACHE_SIZE_IN_BYTES (> 0; 0 means no cache)."""
    return max(size_in_bytes, MIN_CAPACITY)


class LocalCache:
    """A byte-bounded map of over-limit cache keys to their expiry (Unix seconds)."""

    __slots__ = (
        "_bytes",
        "_entries",
        "capacity",
        "evacuate_count",
        "expired_count",
        "hit_count",
        "miss_count",
        "overwrite_count",
    )

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self._entries: dict[str, int] = {}
        self._bytes = 0
        self.hit_count = 0
        self.miss_count = 0
        self.expired_count = 0
        self.evacuate_count = 0
        self.overwrite_count = 0

    def __len__(self) -> int:
        return len(self._entries)

    def contains(self, key: str, now: int) -> bool:
        """Is `key` known to be over limit at `now`?"""
        expiry = self._entries.get(key)
        if expiry is not None:
            if expiry > now:
                self.hit_count += 1
                return True
            del self._entries[key]
            self._bytes -= len(key) + ENTRY_OVERHEAD
            self.expired_count += 1
        self.miss_count += 1
        return False

    def expiry(self, key: str) -> int:
        """When `key` stops being over limit (0 if it is not in the cache)."""
        return self._entries.get(key, 0)

    def discard(self, key: str) -> None:
        """Forget `key` (a refund may have brought its counter under the limit again)."""
        if self._entries.pop(key, None) is not None:
            self._bytes -= len(key) + ENTRY_OVERHEAD

    def add(self, key: str, expiry: int) -> None:
        """Remember `key` as over limit until `expiry`."""
        entries = self._entries
        if key in entries:
            self.overwrite_count += 1
            entries[key] = expiry
            return
        size = len(key) + ENTRY_OVERHEAD
        if size > self.capacity:
            return
        while self._bytes + size > self.capacity and entries:
            old = next(iter(entries))
            del entries[old]
            self._bytes -= len(old) + ENTRY_OVERHEAD
            self.evacuate_count += 1
        entries[key] = expiry
        self._bytes += size

    def gauges(self) -> dict[str, float]:
        """The reference's `ratelimit.localcache.*` gauges."""
        lookups = self.hit_count + self.miss_count
        return {
            "hitCount": self.hit_count,
            "missCount": self.miss_count,
            "lookupCount": lookups,
            "entryCount": len(self._entries),
            "expiredCount": self.expired_count,
            "evacuateCount": self.evacuate_count,
            "overwriteCount": self.overwrite_count,
            "averageAccessTime": 0,
        }
