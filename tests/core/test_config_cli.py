"""The check-config CLI (`python -m ratelimitd check-config`, run by support.daemon's
run_check_config): its exit status and exactly what it prints for a valid config, an invalid
one, a missing file, a directory (valid, or with an invalid file), --merge-domain-config and a
multi-line yaml.v2 error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.core import CONFIGS, one_rule
from support.daemon import run_check_config

from ratelimitd.process import cli

# --- the check-config CLI ------------------------------------------------------------------------


def test_cli_valid_config() -> None:
    result = run_check_config(str(CONFIGS / "basic_config.yaml"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "all rate limit configs ok: 1 files, 1 domains, 10 rules" in result.stdout


def test_cli_invalid_config_prints_exactly_the_error() -> None:
    path = str(CONFIGS / "misspelled_key2.yaml")
    result = run_check_config(path)
    assert result.returncode == 1
    assert result.stderr == f"{path}: config error, unknown key 'requestsperunit'\n"


def test_cli_missing_file_is_named() -> None:
    path = Path(__file__).parent / "_never_written.yaml"
    result = run_check_config(str(CONFIGS / "basic_config.yaml"), str(path))
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}: ")


def test_cli_directory(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text("domain: a\ndescriptors:\n  - key: k\n")
    (tmp_path / "two.conf").write_text(
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n"
    )
    result = run_check_config(str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "all rate limit configs ok: 2 files, 2 domains, 1 rules" in result.stdout


def test_cli_directory_with_an_invalid_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("domain: a\n")
    (tmp_path / "b.yaml").write_text("domain: b\ndescriptors:\n  - key: ''\n")
    result = run_check_config(str(tmp_path))
    assert result.returncode == 1
    assert result.stderr == f"{tmp_path / 'b.yaml'}: descriptor has empty key\n"


def test_cli_merge(tmp_path: Path) -> None:
    first = CONFIGS / "merge_domain_key1.yaml"
    second = CONFIGS / "merge_domain_key2.yaml"
    plain = run_check_config(str(first), str(second))
    assert plain.returncode == 1
    assert plain.stderr == f"{second}: duplicate domain 'test-domain' in config file\n"
    merged = run_check_config("--merge-domain-config", str(first), str(second))
    assert merged.returncode == 0, merged.stderr
    assert "1 domains, 2 rules" in merged.stdout


def test_cli_yaml_unmarshal_error_is_multiline(tmp_path: Path) -> None:
    path = tmp_path / "neg.yaml"
    path.write_text(one_rule("      unit: second\n      requests_per_unit: -1\n"))
    result = run_check_config(str(path))
    assert result.returncode == 1
    assert result.stderr == (
        f"{path}: error loading config file: yaml: unmarshal errors:\n"
        "  line 6: cannot unmarshal !!int `-1` into uint32\n"
    )


def test_cli_applies_domain_default_algorithms_as_the_daemon_does(tmp_path: Path) -> None:
    # A budget keeps no token bucket: with the daemon's default algorithm for its domain,
    # the check refuses what the daemon would refuse.
    (tmp_path / "llm.yaml").write_text(
        "domain: llm\ndescriptors:\n  - key: user\n"
        "    rate_limit: {unit: hour, requests_per_unit: 10}\n    budget: {}\n"
    )
    assert run_check_config(str(tmp_path)).returncode == 0
    env = dict(os.environ, DOMAIN_DEFAULT_ALGORITHMS="llm=token_bucket")
    refused = run_check_config(str(tmp_path), env=env)
    assert refused.returncode == 1
    assert "a token_bucket limit cannot hold reservations" in refused.stderr
    bad = run_check_config(str(tmp_path), env=dict(os.environ, DOMAIN_DEFAULT_ALGORITHMS="x"))
    assert bad.returncode == 1
    assert bad.stderr.startswith("DOMAIN_DEFAULT_ALGORITHMS: invalid value 'x'")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_command(flag: str) -> None:
    """`ratelimitd --help` names each command `main` dispatches, none hidden."""
    done = subprocess.run(
        [sys.executable, "-m", "ratelimitd", flag],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(cli.COMMANDS), done.stdout
