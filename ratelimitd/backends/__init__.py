"""Counter backends behind one small async protocol (see base.Backend)."""

from .base import Backend, BackendError
from .memory import MemoryBackend

__all__ = ["Backend", "BackendError", "MemoryBackend"]
