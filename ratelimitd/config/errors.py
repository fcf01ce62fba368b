"""The config error types."""

from __future__ import annotations

import errno as errnos
import os


class ConfigError(ValueError):
    """A rejected config: `str(err)` is `<config name>: <message>` as the reference prints it."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


class ConfigReadError(ConfigError):
    """A config that could not be read: `<path>: error reading config: <why> [errno N NAME]`.

    Never an empty config: a load that meets one fails as a whole and is retried, since
    what it reports (a directory renamed away, no file descriptors left) is usually brief.
    """

    def __init__(self, path: str, reason: str, errno: int | None = None) -> None:
        code = f" [errno {errno} {errnos.errorcode.get(errno, '?')}]" if errno else ""
        super().__init__(path, f"error reading config: {reason}{code}")
        self.errno = errno

    @classmethod
    def from_os_error(cls, exc: OSError, path: str | None = None) -> ConfigReadError:
        """The error for a failed system call on `path` (default: the one it names)."""
        name = path if path is not None else os.fsdecode(exc.filename or "")
        return cls(name, exc.strerror or str(exc), exc.errno)
