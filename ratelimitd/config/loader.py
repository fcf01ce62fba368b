"""Read config files from disk (or memory) and build a RuleSet from them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, ConfigReadError
from .ruleset import ConfigSource, RuleSet, StatsSource, build_ruleset
from .yamlfile import parse


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """A config's name (the error prefix) and its raw text."""

    name: str
    text: str


def parse_files(files: Iterable[ConfigFile]) -> list[ConfigSource]:
    """Parse every file into the documents `build_ruleset` takes (first error wins)."""
    return [ConfigSource(f.name, parse(f.name, f.text)) for f in files]


def load_ruleset(files: Iterable[ConfigFile], **options: Any) -> RuleSet:
    """Parse every file, then validate and compile them together (first error wins);
    `options` are `build_ruleset`'s (merge_domains, stats, matcher, backend)."""
    return build_ruleset(parse_files(files), **options)


def load_files(paths: Sequence[str]) -> list[ConfigFile]:
    """Read files, and every regular file directly inside directories (sorted by name).

    Like the reference's config checker there is no extension filter. A file that cannot
    be read or decoded as UTF-8 is a ConfigError named after it.
    """
    out: list[ConfigFile] = []
    for path in paths:
        if os.path.isdir(path):
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                raise ConfigError(path, f"error opening directory: {exc.strerror}") from None
            for entry in names:
                full = os.path.join(path, entry)
                if os.path.isfile(full):
                    out.append(_read(full))
        else:
            out.append(_read(path))
    return out


def load_paths(
    paths: Sequence[str], *, merge_domains: bool = False, stats: StatsSource | None = None
) -> RuleSet:
    """`load_files` + `load_ruleset`."""
    return load_ruleset(load_files(paths), merge_domains=merge_domains, stats=stats)


def read_file(path: str) -> bytes:
    """The bytes of one config file; ConfigReadError (path, errno) if it cannot be read.

    Only regular files are read: a FIFO would block the reader forever and a device such
    as /dev/zero would never end. The open is non-blocking so that neither can hang it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigReadError.from_os_error(exc, path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigReadError(path, f"not a regular file (mode {stat.filemode(mode)})")
        with open(fd, "rb", closefd=False) as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigReadError.from_os_error(exc, path) from None
    finally:
        os.close(fd)


def _read(path: str) -> ConfigFile:
    return decode_config(path, read_file(path))


def decode_config(name: str, raw: bytes) -> ConfigFile:
    """A config file's text: UTF-8 or a ConfigError (check-config and the server alike)."""
    try:
        return ConfigFile(name, raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(
            name, f"error loading config file: yaml: invalid UTF-8 at byte {exc.start}"
        ) from None
