"""Encoded response bodies that are built once and served many times."""

from __future__ import annotations

import gzip
import hashlib

# Below this size gzip's header costs more than it saves.
GZIP_MIN_BYTES = 512


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
