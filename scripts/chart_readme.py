"""Write deploy/helm/ratelimitd/README.md from the chart's values.yaml: every value, its
default and the comment above it, in the file's order (`--check`: exit 1 if it is stale)."""

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "ratelimitd"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+):(?P<rest>.*)$")

HEAD = """# ratelimitd Helm chart

ratelimitd, a drop-in replacement for Envoy's global rate-limit service
(envoyproxy/ratelimit). Installing it, from a tagged release:

```sh
helm install rl oci://ghcr.io/ratelimitd/charts/ratelimitd --version {version} \\
  --namespace ratelimit --create-namespace --set backend.redis.url=redis-master:6379
helm test rl --namespace ratelimit
```

The walk from a release to a running Envoy Gateway deployment is in the repository's
docs/deploy.md. This file is generated from values.yaml by scripts/chart_readme.py.

## Values

| value | default | description |
|---|---|---|
"""


def _lookup(values: Any, path: list[str]) -> Any:
    for part in path:
        values = values[part]
    return values


def _default(value: Any) -> str:
    if isinstance(value, str) and "\n" in value:
        return "(see values.yaml)"
    text = json.dumps(value)
    return f"`{text}`" if len(text) <= 60 else "(see values.yaml)"


def render() -> str:
    """The README's text for the values.yaml of today."""
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    rows = []
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    block = -1  # indentation of a multi-line string being skipped
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if block >= 0:
            if not stripped or indent > block:
                continue
            block = -1
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        found = KEY.match(line)
        if not found or stripped.startswith("-"):
            comment = []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, found["key"]))
        path = [key for _, key in stack]
        if found["rest"].strip() in ("|", "|-", ">", ">-"):
            block = indent
        value = _lookup(values, path)
        leaf = not isinstance(value, dict) or not value
        if comment or leaf:
            about = " ".join(comment).replace("|", "\\|")
            rows.append(f"| `{'.'.join(path)}` | {_default(value) if leaf else ''} | {about} |")
        comment = []
    return HEAD.format(version=version) + "\n".join(rows) + "\n"


def main() -> int:
    """Write the README, or with --check say whether it is current."""
    readme = CHART / "README.md"
    if sys.argv[1:] == ["--check"]:
        if readme.read_text() != render():
            print(f"{readme} is stale: run scripts/chart_readme.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
