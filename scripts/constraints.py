"""Rewrite constraints.txt: the versions pip resolves today for ratelimitd[tracing,sidecars]
and the build requirements, pinned (`make constraints`)."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ("setuptools>=68", "cython>=3.0", "grpcio-tools==1.85.1", "wheel", "pip")


def main() -> None:
    """Resolve (nothing installed) and write the pins under constraints.txt's header."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
             "--report", str(report), f"{ROOT}[tracing,sidecars]", *BUILD],
            check=True,
        )  # fmt: skip
        found = json.loads(report.read_text())["install"]
    pins = sorted(
        f"{item['metadata']['name'].lower()}=={item['metadata']['version']}"
        for item in found
        if item["metadata"]["name"] != "ratelimitd"
    )
    path = ROOT / "constraints.txt"
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    path.write_text("\n".join([*header, *pins]) + "\n")


if __name__ == "__main__":
    main()
