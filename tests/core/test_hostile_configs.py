"""Hostile config files: bounded parse work, one-line errors, nothing quoted from elsewhere.

An alias bomb must not grow memory, deep nesting must give one line (never a traceback),
a file that is not UTF-8 is rejected by the server as by check-config, and a config that is
a symlink to some system file must not print that file's contents: at most the offending
key, truncated.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest
from support.daemon import run_check_config

from ratelimitd.config import ConfigError, ConfigFile, compose, load_ruleset
from ratelimitd.config.compose import MAX_DEPTH, MAX_NODES, MAX_QUOTED
from ratelimitd.config.provider import FileLayout
from ratelimitd.config.yamlfile import parse

RULE = "    rate_limit: {unit: second, requests_per_unit: 1}\n"


def alias_bomb() -> str:
    """The billion-laughs shape in `metadata`: 9 levels of 9 references (9^9 leaves)."""
    lines = ["domain: d", "descriptors:", "  - key: k", "    metadata:"]
    lines.append('      a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]')
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"      {name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n" + RULE


def error_of(text: str, name: str = "a.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        load_ruleset([ConfigFile(name, text)])
    return str(info.value)


def check_config(
    path: Path, *, memory_limit: int | None = None
) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return run_check_config(str(path), timeout=120, preexec_fn=limit)


# -- aliases -----------------------------------------------------------------------------


def test_the_590_byte_alias_bomb_is_refused_at_parse_time() -> None:
    bomb = alias_bomb()
    assert len(bomb) < 650
    assert error_of(bomb) == (
        "a.yaml: error loading config file: yaml: document contains excessive aliasing"
    )


def test_check_config_refuses_the_alias_bomb_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    # 1 GiB of address space: the old parser needed 3.25 GB here.
    done = check_config(path, memory_limit=1 << 30)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"{path}: error loading config file: yaml: document contains excessive aliasing"
    ]


def test_ordinary_aliases_are_fine() -> None:
    # yaml.v2's rule: up to 99% of a small document may come from aliases.
    text = (
        "domain: d\ndescriptors:\n"
        + "".join(
            f"  - key: k{i}\n    rate_limit: &r{i} {{unit: second, requests_per_unit: 5}}\n"
            f"  - key: j{i}\n    rate_limit: *r{i}\n"
            for i in range(50)
        )
        + "  - key: m\n    metadata: &m {a: [1, 2, 3], b: {c: d}}\n"
        + "".join(f"  - key: n{i}\n    metadata: *m\n{RULE}" for i in range(200))
    )
    ruleset = load_ruleset([ConfigFile("a.yaml", text)])
    assert len(list(ruleset.rules())) == 300


def test_an_anchor_that_contains_itself_is_refused() -> None:
    text = "domain: d\ndescriptors:\n  - key: k\n    metadata: &m {a: *m}\n" + RULE
    assert error_of(text) == (
        "a.yaml: error loading config file: yaml: anchor 'm' value contains itself"
    )


def test_an_unknown_anchor_is_yaml_v2s_error() -> None:
    text = "domain: d\ndescriptors:\n  - key: k\n    metadata: *nowhere\n"
    assert error_of(text) == (
        "a.yaml: error loading config file: yaml: unknown anchor 'nowhere' referenced"
    )


def test_the_node_limit_counts_alias_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    # Below the aliasing ratio but above the node limit: refused by the count alone.
    assert MAX_NODES >= 5_000_000  # generous enough for 50 MB configs (README)
    monkeypatch.setattr(compose, "MAX_NODES", 1000)
    text = "a: [" + ", ".join(str(i) for i in range(2000)) + "]\n"
    with pytest.raises(ConfigError) as info:
        parse("a.yaml", text)
    assert str(info.value) == (
        "a.yaml: error loading config file: yaml: document contains more than 1,000 nodes"
    )


# -- nesting -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "domain: d\ndescriptors: " + "[" * 10_000 + "]" * 10_000 + "\n",
        "domain: d\ndescriptors:\n  - key: k\n    metadata: "
        + "{a: " * 10_000
        + "b"
        + "}" * 10_000
        + "\n",
        "".join("  " * i + "a:\n" for i in range(2_000)),
    ],
    ids=["flow-sequences", "flow-mappings-in-metadata", "block-mappings"],
)
def test_deep_nesting_is_one_line_in_check_config(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    done = check_config(path)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"{path}: error loading config file: yaml: line ")
    assert line.endswith(f": exceeded max depth of {MAX_DEPTH}")


def test_nesting_up_to_the_limit_loads() -> None:
    depth = MAX_DEPTH - 4  # root map, descriptors list, the entry's map, metadata's map
    metadata = "{a: " * depth + "b" + "}" * depth
    text = f"domain: d\ndescriptors:\n  - key: k\n    metadata: {metadata}\n{RULE}"
    (rule,) = load_ruleset([ConfigFile("a.yaml", text)]).rules()
    assert rule.metadata is not None


# -- encodings ---------------------------------------------------------------------------


def test_a_file_that_is_not_utf8_is_rejected_by_the_server_as_by_check_config(
    tmp_path: Path,
) -> None:
    (tmp_path / "config").mkdir()
    path = tmp_path / "config" / "latin1.yaml"
    path.write_bytes("domain: café\ndescriptors:\n  - key: k\n".encode("latin-1") + RULE.encode())
    layout = FileLayout(str(tmp_path), watch_root=False)
    with pytest.raises(ConfigError) as server:
        layout.read()
    assert str(server.value) == (
        "latin1.yaml: error loading config file: yaml: invalid UTF-8 at byte 11"
    )
    done = check_config(path)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"{path}: error loading config file: yaml: invalid UTF-8 at byte 11"
    ]


# -- nothing quoted from a file that is not a config ------------------------------------------

SECRET = "root:$y$j9T$s3cr3tS4lt$VeryS3cretHashValue0123456789abcdefABCDEF:19000:0:99999:7:::"


@pytest.mark.parametrize(
    "text",
    [
        SECRET + "\n",  # a shadow file: its first line is one long scalar
        SECRET.replace(":", ": ", 1) + "\n",  # `key: value`: an unknown key
        f"- {SECRET}\n",  # a list: not a map
        f"domain: d\ndescriptors:\n  - {SECRET}\n",  # a list element that is not a map
        f"{{[{SECRET}]: 1}}\n",  # a key that is not a string
        f"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {SECRET}}}\n",
        f"domain: d\ndescriptors:\n  - key: k\n    metadata: *{SECRET[:40].replace(':', '')}\n",
    ],
    ids=["scalar", "unknown-key", "list", "list-element", "key-type", "unit", "alias"],
)
def test_errors_quote_at_most_a_truncated_key(text: str) -> None:
    message = error_of(text)
    windows = {SECRET[i : i + MAX_QUOTED + 1] for i in range(len(SECRET) - MAX_QUOTED)}
    leaked = [w for w in windows if w in message]
    assert not leaked, message
    assert "\n" not in message or "unmarshal errors" in message


def test_a_symlink_to_a_system_file_does_not_print_it(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    for system in ("/etc/passwd", "/etc/shadow", "/etc/group", "/etc/hosts", "/etc/os-release"):
        if not os.path.exists(system):
            continue
        link = tmp_path / "config" / "link.yaml"
        link.unlink(missing_ok=True)
        link.symlink_to(system)
        with pytest.raises(ConfigError) as info:
            load_ruleset(FileLayout(str(tmp_path), watch_root=False).read())
        message = str(info.value)
        for line in Path(system).read_text(errors="replace").splitlines():
            for i in range(max(0, len(line) - MAX_QUOTED)):
                assert line[i : i + MAX_QUOTED + 1] not in message, (system, message)
