"""Encoded response bodies that are built once and served many times."""

from __future__ import annotations

import gzip
import hashlib
from collections import OrderedDict

# Below this size gzip's header costs more than it saves.
GZIP_MIN_BYTES = 512


def accepts_gzip(header: str | None) -> bool:
    """Whether an Accept-Encoding header admits gzip (`gzip` or `*`, with q > 0)."""
    if not header:
        return False
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() in ("gzip", "*"):
            q = params.strip().replace(" ", "")
            if not q.startswith("q="):
                return True
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
    return False


class Body:
    """Bytes of one response with a strong ETag and a gzip variant made on first request."""

    __slots__ = ("_gzip", "data", "etag")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.etag = '"' + hashlib.blake2b(data, digest_size=10).hexdigest() + '"'
        self._gzip: bytes | None = None

    @property
    def gzip_etag(self) -> str:
        """ETag of the gzip representation (a different byte sequence needs its own tag)."""
        return self.etag[:-1] + '-gz"'

    def gzipped(self) -> bytes | None:
        """The gzip representation, or None when the body is too small to be worth it."""
        if len(self.data) < GZIP_MIN_BYTES:
            return None
        if self._gzip is None:
            # mtime=0 keeps the bytes (and so the ETag) stable across workers and restarts.
            self._gzip = gzip.compress(self.data, compresslevel=6, mtime=0)
        return self._gzip


class BodyCache:
    """Encoded bodies by key, least recently used first out once `max_bytes` is exceeded.

    Patterns of a large feed run to hundreds of kilobytes each; a crawler fetching every one
    must not make a worker hold all of them. None (an unknown id) is cached too, at no cost.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._items: OrderedDict[str, Body | None] = OrderedDict()

    def get(self, key: str) -> tuple[bool, Body | None]:
        """(found, body)."""
        try:
            body = self._items[key]
        except KeyError:
            return False, None
        self._items.move_to_end(key)
        return True, body

    def put(self, key: str, body: Body | None) -> None:
        """Remember a body, evicting the least recently used ones over the budget."""
        self._items[key] = body
        self.size += _weight(body)
        while self.size > self.max_bytes and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self.size -= _weight(old)


def _weight(body: Body | None) -> int:
    if body is None:
        return 64
    # The gzip variant, once made, is about a tenth of the body.
    return len(body.data) + len(body.data) // 8
