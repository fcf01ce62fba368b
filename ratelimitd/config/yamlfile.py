"""One config file's text -> a typed `RootDoc`, with the reference's exact error texts.

The Go service parses with yaml.v2 twice (reference section 3.2, step A): once into a
generic map whose keys are checked against a flat whitelist, then into typed structs.
We compose the YAML once into a node tree and do both passes over it, so every message
(including yaml.v2's `line N: cannot unmarshal ...` type errors) is reproduced, but in
file order: the reference reports whichever problem Go's random map order meets first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import ConfigError

# The reference's flat whitelist: position is not checked (`unit:` at descriptor level is
# accepted and ignored), exactly like `validateYamlKeys`.
VALID_KEYS = frozenset(
    {
        "domain",
        "key",
        "value",
        "descriptors",
        "rate_limit",
        "unit",
        "requests_per_unit",
        "unlimited",
        "shadow_mode",
        "quota_mode",
        "name",
        "replaces",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
    }
)

_TAG = "tag:yaml.org,2002:"
_STR, _INT, _BOOL, _NULL, _FLOAT = (_TAG + t for t in ("str", "int", "bool", "null", "float"))
_TIMESTAMP, _BINARY = _TAG + "timestamp", _TAG + "binary"
_MAX_U32 = 0xFFFFFFFF

# PyYAML's wording -> libyaml's (what yaml.v2 prints) for the syntax errors users meet.
_LIBYAML_WORDING = {
    "mapping values are not allowed here": "mapping values are not allowed in this context",
}


@dataclass(slots=True)
class RateLimitDoc:
    """A `rate_limit` block."""

    requests_per_unit: int = 0
    unit: str = ""
    unlimited: bool = False
    name: str = ""
    replaces: list[str] = field(default_factory=list)


@dataclass(slots=True)
class DescriptorDoc:
    """One `descriptors` entry."""

    key: str = ""
    value: str = ""
    rate_limit: RateLimitDoc | None = None
    descriptors: list[DescriptorDoc] = field(default_factory=list)
    shadow_mode: bool = False
    quota_mode: bool = False
    detailed_metric: bool = False
    value_to_metric: bool = False
    share_threshold: bool = False
    metadata: dict[str, Any] | None = None


@dataclass(slots=True)
class RootDoc:
    """A whole config file."""

    domain: str = ""
    descriptors: list[DescriptorDoc] = field(default_factory=list)


def parse(name: str, text: str) -> RootDoc:
    """Parse and type-check one config file; raise ConfigError with the reference's text."""
    root = _compose(name, text)
    if root is not None:
        if not isinstance(root, MappingNode):
            _raise_unmarshal(name, [_terror(root, "map[interface {}]interface {}")])
        _check_keys(name, root)
    decoder = _Decoder()
    doc = decoder.root(root)
    if decoder.errors:
        _raise_unmarshal(name, decoder.errors)
    return doc


def _compose(name: str, text: str) -> Node | None:
    try:
        loader = yaml.SafeLoader(text)  # the reader rejects control characters right here
    except yaml.YAMLError as exc:
        raise ConfigError(name, f"error loading config file: yaml: {_reader_problem(exc)}") from None
    try:
        # yaml.v2's Unmarshal reads the first document only.
        return loader.get_node() if loader.check_node() else None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(name, f"error loading config file: {_libyaml_message(exc)}") from None
    except yaml.YAMLError as exc:  # e.g. a reader error on a control character
        raise ConfigError(name, f"error loading config file: yaml: {_reader_problem(exc)}") from None
    finally:
        loader.dispose()


def _reader_problem(exc: yaml.YAMLError) -> str:
    """libyaml's wording for characters YAML does not allow."""
    if isinstance(exc, yaml.reader.ReaderError):
        return "control characters are not allowed"
    return str(exc).replace("\n", " ")


def _libyaml_message(exc: yaml.MarkedYAMLError) -> str:
    """`yaml: line N: <problem>`, numbering lines the way yaml.v2's parser.fail() does."""
    problem = exc.problem or "unknown problem parsing YAML content"
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


def _scalar_kind(node: ScalarNode) -> str:
    """The yaml.v2 resolved type of a plain scalar: str, int, bool, null or float."""
    tag = node.tag
    if tag in (_STR, _TIMESTAMP, _BINARY):
        # yaml.v2 keeps timestamp-looking scalars as strings in generic maps.
        return "str"
    if tag == _INT:
        return "int"
    if tag == _BOOL:
        return "bool"
    if tag == _NULL:
        return "null"
    if tag == _FLOAT:
        return "float"
    return "str"


def _go_value(node: Node) -> str:
    """Go's `%v` of what yaml.v2 would decode `node` into."""
    if isinstance(node, ScalarNode):
        kind = _scalar_kind(node)
        if kind == "null":
            return "<nil>"
        if kind == "bool":
            return "true" if _bool(node.value) else "false"
        if kind == "int":
            return str(_int(node.value))
        if kind == "float":
            return _go_float(_float(node.value))
        return node.value
    if isinstance(node, SequenceNode):
        return "[" + " ".join(_go_value(n) for n in node.value) + "]"
    if isinstance(node, MappingNode):
        items = " ".join(f"{_go_value(k)}:{_go_value(v)}" for k, v in node.value)
        return f"map[{items}]"
    return "?"


def _go_float(x: float) -> str:
    """strconv.FormatFloat(x, 'g', -1, 64), which is what `%v` prints for a float64."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    r = repr(x)
    mantissa, _, exp = r.partition("e")
    if mantissa.endswith(".0"):
        mantissa = mantissa[:-2]
    if exp:
        e = int(exp)
        return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e):02d}"
    exponent = math.floor(math.log10(abs(x))) if x else 0
    if exponent < -4 or exponent >= 21:
        m, _, e2 = f"{x:e}".partition("e")
        m = m.rstrip("0").rstrip(".")
        e = int(e2)
        return f"{m}e{'+' if e >= 0 else '-'}{abs(e):02d}"
    return mantissa


def _check_keys(name: str, mapping: MappingNode) -> None:
    """`validateYamlKeys`, walked in file order."""
    for knode, vnode in mapping.value:
        if not (isinstance(knode, ScalarNode) and _scalar_kind(knode) == "str"):
            raise ConfigError(
                name, f"config error, key is not of type string: {_go_value(knode)}"
            )
        key = knode.value
        if key not in VALID_KEYS:
            raise ConfigError(name, f"config error, unknown key '{key}'")
        if key == "metadata":
            continue  # free-form: converted to a protobuf Struct, never key-checked
        if isinstance(vnode, SequenceNode):
            for element in vnode.value:
                if not isinstance(element, MappingNode):
                    raise ConfigError(
                        name,
                        "config error, yaml file contains list of type other than map: "
                        + _go_value(element),
                    )
                _check_keys(name, element)
        elif isinstance(vnode, MappingNode):
            _check_keys(name, vnode)
        elif isinstance(vnode, ScalarNode) and _scalar_kind(vnode) == "float":
            raise ConfigError(name, "error checking config")


def _bool(text: str) -> bool:
    return text.lower() in ("yes", "true", "on", "y")


def _int(text: str) -> int:
    # PyYAML's resolver accepted it as an int, so its own constructor can convert it.
    return int(yaml.SafeLoader("").construct_yaml_int(ScalarNode(_INT, text)))


def _float(text: str) -> float:
    return float(yaml.SafeLoader("").construct_yaml_float(ScalarNode(_FLOAT, text)))


def _terror(node: Node, go_type: str) -> str:
    """One yaml.v2 type error line: `line N: cannot unmarshal !!tag `value` into T`."""
    if isinstance(node, SequenceNode):
        tag, value = "!!seq", ""
    elif isinstance(node, MappingNode):
        tag, value = "!!map", ""
    else:
        tag = "!!" + _scalar_kind(node)  # type: ignore[arg-type]
        text = node.value
        value = f" `{text[:7]}...`" if len(text) > 10 else f" `{text}`"
    return f"line {node.start_mark.line + 1}: cannot unmarshal {tag}{value} into {go_type}"


def _raise_unmarshal(name: str, errors: list[str]) -> None:
    detail = "\n  ".join(errors)
    raise ConfigError(name, f"error loading config file: yaml: unmarshal errors:\n  {detail}")


class _Decoder:
    """yaml.v2's typed decode into the reference's YamlRoot structs, collecting type errors."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def _fields(self, node: MappingNode) -> dict[str, Node]:
        # Last duplicate wins, as in yaml.v2 when decoding into a struct.
        out: dict[str, Node] = {}
        for k, v in node.value:
            if isinstance(k, ScalarNode):
                out[k.value] = v
        return out

    def _null(self, node: Node | None) -> bool:
        return node is None or (isinstance(node, ScalarNode) and _scalar_kind(node) == "null")

    def string(self, node: Node | None) -> str:
        if self._null(node):
            return ""
        if isinstance(node, ScalarNode):
            return node.value  # any scalar decodes into a Go string as its literal text
        self.errors.append(_terror(node, "string"))  # type: ignore[arg-type]
        return ""

    def boolean(self, node: Node | None) -> bool:
        if self._null(node):
            return False
        if isinstance(node, ScalarNode) and _scalar_kind(node) == "bool":
            return _bool(node.value)
        self.errors.append(_terror(node, "bool"))  # type: ignore[arg-type]
        return False

    def uint32(self, node: Node | None) -> int:
        if self._null(node):
            return 0
        if isinstance(node, ScalarNode):
            kind = _scalar_kind(node)
            if kind == "int":
                value = _int(node.value)
                if 0 <= value <= _MAX_U32:
                    return value
            elif kind == "float":
                number = _float(node.value)
                if 0 <= number <= _MAX_U32:
                    return int(number)
        self.errors.append(_terror(node, "uint32"))  # type: ignore[arg-type]
        return 0

    def root(self, node: Node | None) -> RootDoc:
        doc = RootDoc()
        if node is None or not isinstance(node, MappingNode):
            return doc
        f = self._fields(node)
        doc.domain = self.string(f.get("domain"))
        doc.descriptors = self.descriptor_list(f.get("descriptors"))
        return doc

    def descriptor_list(self, node: Node | None) -> list[DescriptorDoc]:
        if self._null(node):
            return []
        if not isinstance(node, SequenceNode):
            self.errors.append(_terror(node, "[]config.YamlDescriptor"))  # type: ignore[arg-type]
            return []
        return [self.descriptor(element) for element in node.value]

    def descriptor(self, node: Node) -> DescriptorDoc:
        d = DescriptorDoc()
        if not isinstance(node, MappingNode):
            if not self._null(node):
                self.errors.append(_terror(node, "config.YamlDescriptor"))
            return d
        f = self._fields(node)
        d.key = self.string(f.get("key"))
        d.value = self.string(f.get("value"))
        d.rate_limit = self.rate_limit(f.get("rate_limit"))
        d.descriptors = self.descriptor_list(f.get("descriptors"))
        d.shadow_mode = self.boolean(f.get("shadow_mode"))
        d.quota_mode = self.boolean(f.get("quota_mode"))
        d.detailed_metric = self.boolean(f.get("detailed_metric"))
        d.value_to_metric = self.boolean(f.get("value_to_metric"))
        d.share_threshold = self.boolean(f.get("share_threshold"))
        d.metadata = self.metadata(f.get("metadata"))
        return d

    def rate_limit(self, node: Node | None) -> RateLimitDoc | None:
        if self._null(node):
            return None  # `rate_limit:` with no body is a nil pointer: no limit at all
        if not isinstance(node, MappingNode):
            self.errors.append(_terror(node, "config.YamlRateLimit"))  # type: ignore[arg-type]
            return None
        f = self._fields(node)
        r = RateLimitDoc()
        r.requests_per_unit = self.uint32(f.get("requests_per_unit"))
        r.unit = self.string(f.get("unit"))
        r.unlimited = self.boolean(f.get("unlimited"))
        r.name = self.string(f.get("name"))
        replaces = f.get("replaces")
        if not self._null(replaces):
            if isinstance(replaces, SequenceNode):
                for element in replaces.value:
                    if isinstance(element, MappingNode):
                        r.replaces.append(self.string(self._fields(element).get("name")))
                    elif self._null(element):
                        r.replaces.append("")
                    else:
                        self.errors.append(_terror(element, "config.yamlReplaces"))
            else:
                self.errors.append(_terror(replaces, "[]config.yamlReplaces"))  # type: ignore[arg-type]
        return r

    def metadata(self, node: Node | None) -> dict[str, Any] | None:
        if self._null(node):
            return None
        if not isinstance(node, MappingNode):
            self.errors.append(_terror(node, "map[string]interface {}"))  # type: ignore[arg-type]
            return None
        value = yaml.SafeLoader("").construct_document(node)
        return _jsonable(value)


def _jsonable(value: Any) -> Any:
    """Metadata as google.protobuf.Struct would hold it (string keys, JSON values)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
