"""YAML text -> a node tree, bounded: the composing half of `yamlfile`.

PyYAML's pure composer with its implicit resolvers off (yaml.v2 types plain scalars itself,
see yamlfile), libyaml's wording for the syntax errors users meet (yaml.v2 prints libyaml's),
and the limits a hostile file meets before anything builds on it.
"""

from __future__ import annotations

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from .errors import ConfigError

# Hostile files. Nesting past MAX_DEPTH is refused while composing (the
# composer recurses; real configs nest a few levels); aliases are expanded at most as far as
# yaml.v2 allows (its "excessive aliasing" ratio: a 590-byte alias bomb once grew the process
# to 3.25 GB); a document of more than MAX_NODES nodes, aliases expanded, is refused; and a
# message quotes at most MAX_QUOTED characters of the file (a config symlinked to a system
# file must not print it).
MAX_DEPTH = 100
MAX_NODES = 10_000_000
MAX_QUOTED = 40

# PyYAML's wording -> libyaml's (what yaml.v2 prints) for the syntax errors users meet.
_LIBYAML_WORDING = {
    "mapping values are not allowed here": "mapping values are not allowed in this context",
}


class _Loader(yaml.SafeLoader):
    """Composes nodes only; plain scalars are typed by `_plain_kind` the way yaml.v2 does.

    PyYAML resolves YAML 1.1 (`1:30` is 90, `1e3` a string, `y` a string); yaml.v2 does
    not, so PyYAML's implicit resolvers are switched off and every plain scalar arrives
    tagged `str` for us to resolve.
    """

    yaml_implicit_resolvers: dict = {}  # type: ignore[type-arg]  # noqa: RUF012

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.anchor_names: dict[int, str] = {}  # node id -> its anchor, of the last document

    def compose_document(self) -> Node | None:
        # PyYAML's, keeping the anchor names it forgets (for "anchor 'm' value contains itself").
        self.get_event()  # DOCUMENT-START
        node = self.compose_node(None, None)  # type: ignore[arg-type]
        self.get_event()  # DOCUMENT-END
        self.anchor_names = {id(n): a for a, n in self.anchors.items()}
        self.anchors = {}
        return node

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _TooDeep(mark.line + 1)
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self.depth -= 1


class _TooDeep(Exception):
    """Nesting past MAX_DEPTH, at this 1-based line."""


def compose(name: str, text: str) -> tuple[Node | None, dict[int, str]]:
    """The first document's root node, and the anchor names by node id."""
    try:
        loader = _Loader(text)  # the reader rejects control characters right here
    except yaml.YAMLError as exc:
        raise ConfigError(
            name, f"error loading config file: yaml: {_reader_problem(exc)}"
        ) from None
    try:
        # yaml.v2's Unmarshal reads the first document only.
        root = loader.get_node() if loader.check_node() else None
        return root, loader.anchor_names
    except _TooDeep as exc:
        raise ConfigError(
            name,
            f"error loading config file: yaml: line {exc.args[0]}: "
            f"exceeded max depth of {MAX_DEPTH}",
        ) from None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(name, f"error loading config file: {_libyaml_message(exc)}") from None
    except yaml.YAMLError as exc:  # e.g. a reader error on a control character
        raise ConfigError(
            name, f"error loading config file: yaml: {_reader_problem(exc)}"
        ) from None
    finally:
        loader.dispose()


def _allowed_alias_ratio(decoded: int) -> float:
    """yaml.v2's allowedAliasRatio: 99% up to 400,000 decoded nodes, down to 10% at 4M."""
    if decoded <= 400_000:
        return 0.99
    if decoded >= 4_000_000:
        return 0.10
    return 0.99 - 0.89 * (decoded - 400_000) / 3_600_000


def check_size(name: str, root: Node, anchors: dict[int, str]) -> None:
    """Walk the document as a decoder would, aliases expanded, without recursion; refuse it
    past yaml.v2's aliasing ratio or MAX_NODES (before anything builds on it).

    PyYAML composes an alias as the anchored node itself, so a node met again is an alias
    being expanded; its whole subtree counts as aliased, as in yaml.v2's decoder.
    """
    decoded = aliased = 0
    # Visited nodes are marked on the node itself: a set of millions of ids would be
    # resized in single C calls that hold the GIL (the serving loop) for a tenth of a second.
    path: set[int] = set()  # the collections between the root and the node (a cycle test)
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, in_alias = stack.pop()
        if in_alias is None:  # leaving `node`'s subtree
            path.discard(id(node))
            continue
        if id(node) in path:
            anchor = quoted(anchors.get(id(node), "?"))
            raise ConfigError(
                name, f"error loading config file: yaml: anchor '{anchor}' value contains itself"
            )
        decoded += 1
        if node.__dict__.get("_visited"):
            in_alias = True
        else:
            node._visited = True  # type: ignore[attr-defined]
        if in_alias:
            aliased += 1
            if (
                aliased > 100
                and decoded > 1000
                and aliased / decoded > _allowed_alias_ratio(decoded)
            ):
                raise ConfigError(
                    name, "error loading config file: yaml: document contains excessive aliasing"
                )
        if decoded > MAX_NODES:
            raise ConfigError(
                name,
                f"error loading config file: yaml: document contains more than {MAX_NODES:,} nodes",
            )
        if isinstance(node, MappingNode | SequenceNode):
            path.add(id(node))
            stack.append((node, None))  # type: ignore[arg-type]  # the leave marker
            if isinstance(node, MappingNode):
                for k, v in reversed(node.value):
                    stack.append((v, in_alias))
                    stack.append((k, in_alias))
            else:
                stack.extend((v, in_alias) for v in reversed(node.value))


def quoted(text: str) -> str:
    """At most MAX_QUOTED characters of file content for a message."""
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 3] + "..."


def _reader_problem(exc: yaml.YAMLError) -> str:
    """libyaml's wording for characters YAML does not allow."""
    if isinstance(exc, yaml.reader.ReaderError):
        return "control characters are not allowed"
    return str(exc).replace("\n", " ")


def _libyaml_message(exc: yaml.MarkedYAMLError) -> str:
    """`yaml: line N: <problem>`, numbering lines the way yaml.v2's parser.fail() does."""
    problem = exc.problem or "unknown problem parsing YAML content"
    if problem.startswith("found undefined alias "):
        alias = problem.removeprefix("found undefined alias ").strip("'")
        return f"yaml: unknown anchor '{quoted(alias)}' referenced"
    if problem.startswith("found character") and "cannot start any token" in problem:
        problem = "found character that cannot start any token"
    elif problem.startswith("expected ',' or ']'"):
        problem = "did not find expected ',' or ']'"
    elif problem.startswith("expected ',' or '}'"):
        problem = "did not find expected ',' or '}'"
    elif problem.startswith("expected <block end>"):
        context = exc.context or ""
        problem = (
            "did not find expected '-' indicator"
            if "collection" in context
            else "did not find expected key"
        )
    problem = _LIBYAML_WORDING.get(problem, problem)
    line = 0
    pm, cm = exc.problem_mark, exc.context_mark
    if pm is not None and pm.line != 0:
        # Scanner errors are reported one line further on by libyaml.
        line = pm.line + (1 if isinstance(exc, yaml.scanner.ScannerError) else 0)
    elif cm is not None and cm.line != 0:
        line = cm.line
    return f"yaml: line {line}: {problem}" if line else f"yaml: {problem}"


def dismantle(root: Node) -> None:
    """Free a node tree a few nodes at a time. Dropped whole, the millions of nodes of a large
    file are freed in one cascade of deallocations that holds the GIL (so the serving loop,
    the file being parsed in a thread) for a fifth of a second at 50,000 rules."""
    stack: list[Node] = [root]
    while stack:
        node = stack.pop()
        value = node.value
        if value.__class__ is list:
            node.value = None
            for item in value:
                if item.__class__ is tuple:
                    stack.extend(item)
                else:
                    stack.append(item)
