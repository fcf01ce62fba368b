"""One config file's text -> a typed `RootDoc`, with the reference's exact error texts.

The Go service parses with yaml.v2 twice (`src/config/config_impl.go`): once into a
generic map whose keys are checked against a flat whitelist, then into typed structs.
We compose the YAML once into a node tree and do both passes over it, so every message
(including yaml.v2's `line N: cannot unmarshal ...` type errors) is reproduced, but in
file order: the reference reports whichever problem Go's random map order meets first.
The text -> node tree half, and the bounds a hostile file meets, are in `compose`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .compose import check_size, compose, dismantle, quoted
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
        # Extension: usage metering (docs/metering.md). Not a reference key.
        "meter",
        # Extension: algorithms, N-unit windows, several limits (docs/algorithms.md).
        "algorithm",
        "unit_multiplier",
        "rate_limits",
        # Extension: token budgets (docs/budgets.md).
        "budget",
    }
)

_TAG = "tag:yaml.org,2002:"
_STR, _INT, _BOOL, _NULL, _FLOAT = (_TAG + t for t in ("str", "int", "bool", "null", "float"))
_TIMESTAMP, _BINARY = _TAG + "timestamp", _TAG + "binary"
_MAX_U32 = 0xFFFFFFFF


@dataclass(slots=True)
class RateLimitDoc:
    """A `rate_limit` block."""

    requests_per_unit: int = 0
    unit: str = ""
    unlimited: bool = False
    name: str = ""
    replaces: list[str] = field(default_factory=list)
    # Extensions (docs/algorithms.md): "" is the reference's fixed window; None: absent.
    algorithm: str = ""
    unit_multiplier: int | None = None
    line: int = 0  # 1-based line of the block in its file (0: not from a file)


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
    meter: bool = False
    # Extension: several limits on one descriptor (exclusive with rate_limit).
    rate_limits: list[RateLimitDoc] | None = None
    # Extension: the `budget:` block as written (checked by the rule set's load), and its
    # line (0: no budget).
    budget: Any = None
    budget_line: int = 0
    line: int = 0


@dataclass(slots=True)
class RootDoc:
    """A whole config file."""

    domain: str = ""
    descriptors: list[DescriptorDoc] = field(default_factory=list)


def parse(name: str, text: str) -> RootDoc:
    """Parse and type-check one config file; raise ConfigError with the reference's text."""
    root, anchors = compose(name, text)
    try:
        return _decode(name, root, anchors)
    finally:
        if root is not None:
            dismantle(root)


def _decode(name: str, root: Node | None, anchors: dict[int, str]) -> RootDoc:
    if root is not None:
        check_size(name, root, anchors)
        if not isinstance(root, MappingNode):
            _raise_unmarshal(name, [_terror(root, "map[interface {}]interface {}")])
        _check_keys(name, root)
    decoder = _Decoder()
    doc = decoder.root(root)
    if decoder.errors:
        _raise_unmarshal(name, decoder.errors)
    if decoder.misplaced:
        raise ConfigError(name, decoder.misplaced[0])
    return doc


_NULLS = frozenset({"", "~", "null", "Null", "NULL"})
_TRUES = frozenset({"y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE"})
_FALSES = frozenset({"n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE"})
_FLOAT_WORDS = frozenset(
    {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF"}
    | {".nan", ".NaN", ".NAN"}
)
# yaml.v2's yamlStyleFloat.
_YAML_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_INT64 = (-(1 << 63), (1 << 64) - 1)


def _go_parse_int(text: str) -> int | None:
    """strconv.ParseInt(text, 0, 64) (or ParseUint): 0x / 0o / 0b / leading-0 octal."""
    s = text
    sign = 1
    if s[:1] in "+-" and s:
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if not s:
        return None
    base = 10
    if len(s) > 1 and s[0] == "0":
        prefix = s[1].lower()
        if prefix == "x":
            base, s = 16, s[2:]
        elif prefix == "o":
            base, s = 8, s[2:]
        elif prefix == "b":
            base, s = 2, s[2:]
        else:
            base, s = 8, s[1:]
    digits = "0123456789abcdef"[:base]
    if not s or any(c not in digits for c in s.lower()):
        return None
    value = sign * int(s, base)
    return value if _INT64[0] <= value <= _INT64[1] else None


def _plain_kind(text: str) -> str:
    """yaml.v2's resolve() of a plain scalar: null, bool, int, float or str."""
    if text in _NULLS:
        return "null"
    if text in _TRUES or text in _FALSES:
        return "bool"
    if text in _FLOAT_WORDS:
        return "float"
    plain = text.replace("_", "")
    if plain and (plain[0].isdigit() or plain[0] in "+-."):
        if _go_parse_int(plain) is not None:
            return "int"
        if _YAML_FLOAT.match(plain):
            return "float"
        if plain.startswith(("0b", "-0b")):
            return "int" if _go_parse_int(plain) is not None else "str"
    return "str"


def _scalar_kind(node: ScalarNode) -> str:
    """The yaml.v2 type of a scalar: str, int, bool, null or float."""
    tag = node.tag
    if tag == _STR:
        # Plain scalars are resolved by content; quoted ones are strings.
        return _plain_kind(node.value) if node.style is None else "str"
    if tag == _INT:
        return "int"
    if tag == _BOOL:
        return "bool"
    if tag == _NULL:
        return "null"
    if tag == _FLOAT:
        return "float"
    # Timestamps, binary and unknown tags: yaml.v2 keeps them as strings in generic maps.
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
                name, f"config error, key is not of type string: {quoted(_go_value(knode))}"
            )
        key = knode.value
        if key not in VALID_KEYS:
            raise ConfigError(name, f"config error, unknown key '{quoted(key)}'")
        if key in ("metadata", "budget"):
            # metadata is free-form (a protobuf Struct); a budget's fields are checked by
            # the rule set's load, with messages of its own.
            continue
        if isinstance(vnode, SequenceNode):
            for element in vnode.value:
                if not isinstance(element, MappingNode):
                    raise ConfigError(
                        name,
                        "config error, yaml file contains list of type other than map: "
                        + quoted(_go_value(element)),
                    )
                _check_keys(name, element)
        elif isinstance(vnode, MappingNode):
            _check_keys(name, vnode)
        elif isinstance(vnode, ScalarNode) and _scalar_kind(vnode) == "float":
            raise ConfigError(name, "error checking config")


def _bool(text: str) -> bool:
    return text in _TRUES


def _int(text: str) -> int:
    value = _go_parse_int(text.replace("_", ""))
    return 0 if value is None else value


def _float(text: str) -> float:
    if text in _FLOAT_WORDS:
        return float(text.lower().replace(".", ""))
    try:
        return float(text.replace("_", ""))
    except ValueError:
        return 0.0


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


def _raise_unmarshal(name: str, errors: list[str]) -> NoReturn:
    detail = "\n  ".join(errors)
    raise ConfigError(name, f"error loading config file: yaml: unmarshal errors:\n  {detail}")


class _Decoder:
    """yaml.v2's typed decode into the reference's YamlRoot structs, collecting type errors.

    Fields are decoded in document order (as yaml.v2 walks a mapping node), so several
    type errors come out in file order; a repeated key is decoded again and wins.
    """

    def __init__(self) -> None:
        self.errors: list[str] = []
        # The extension's keys where they would do nothing: refused, not ignored (the
        # reference's own keys keep its position-blind whitelist).
        self.misplaced: list[str] = []

    def _misplaced(self, key: str, node: Node, where: str) -> None:
        self.misplaced.append(
            f"line {node.start_mark.line + 1}: '{key}' has no effect {where} "
            f"(it belongs in {_EXTENSION_KEYS[key]})"
        )

    @staticmethod
    def _pairs(node: MappingNode) -> list[tuple[str, Node]]:
        return [(k.value, v) for k, v in node.value if isinstance(k, ScalarNode)]

    @staticmethod
    def _null(node: Node | None) -> bool:
        return node is None or (isinstance(node, ScalarNode) and _scalar_kind(node) == "null")

    def _elements(self, node: Node, go_type: str) -> list[Node]:
        """A sequence's elements as yaml.v2 fills a Go slice: null is empty, anything but a
        sequence is a type error (and empty)."""
        if self._null(node):
            return []
        if not isinstance(node, SequenceNode):
            self.errors.append(_terror(node, go_type))
            return []
        return node.value  # type: ignore[no-any-return]

    def _mapping(self, node: Node, go_type: str) -> MappingNode | None:
        """A mapping as yaml.v2 fills a Go pointer or map: null is nil, anything but a
        mapping is a type error (and nil)."""
        if self._null(node):
            return None
        if not isinstance(node, MappingNode):
            self.errors.append(_terror(node, go_type))
            return None
        return node

    def string(self, node: Node) -> str:
        if self._null(node):
            return ""
        if isinstance(node, ScalarNode):
            return node.value  # any scalar decodes into a Go string as its literal text
        self.errors.append(_terror(node, "string"))
        return ""

    def boolean(self, node: Node) -> bool:
        if self._null(node):
            return False
        if isinstance(node, ScalarNode) and _scalar_kind(node) == "bool":
            return _bool(node.value)
        self.errors.append(_terror(node, "bool"))
        return False

    def uint32(self, node: Node) -> int:
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
        self.errors.append(_terror(node, "uint32"))
        return 0

    def int64(self, node: Node) -> int:
        if self._null(node):
            return 0
        if isinstance(node, ScalarNode) and _scalar_kind(node) == "int":
            value = _go_parse_int(node.value.replace("_", ""))
            if value is not None and value < 1 << 63:
                return value
        self.errors.append(_terror(node, "int"))
        return 0

    def root(self, node: Node | None) -> RootDoc:
        doc = RootDoc()
        if node is None or not isinstance(node, MappingNode):
            return doc
        for key, value in self._pairs(node):
            decode = _ROOT_FIELDS.get(key)
            if decode is not None:
                setattr(doc, key, decode(self, value))
            elif key in _EXTENSION_KEYS:
                self._misplaced(key, value, "at the top level")
        return doc

    def descriptor_list(self, node: Node) -> list[DescriptorDoc]:
        return [self.descriptor(e) for e in self._elements(node, "[]config.YamlDescriptor")]

    def descriptor(self, node: Node) -> DescriptorDoc:
        d = DescriptorDoc(line=node.start_mark.line + 1)
        if not isinstance(node, MappingNode):
            if not self._null(node):
                self.errors.append(_terror(node, "config.YamlDescriptor"))
            return d
        for key, value in self._pairs(node):
            decode = _DESCRIPTOR_FIELDS.get(key)
            if decode is not None:
                setattr(d, key, decode(self, value))
            elif key == "budget":
                d.budget = _construct(value)
                d.budget_line = value.start_mark.line + 1
            elif key in ("algorithm", "unit_multiplier"):
                self._misplaced(key, value, "in a descriptor")
        return d

    def rate_limit(self, node: Node) -> RateLimitDoc | None:
        # `rate_limit:` with no body is a nil pointer: no limit at all.
        mapping = self._mapping(node, "config.YamlRateLimit")
        if mapping is None:
            return None
        r = RateLimitDoc(line=node.start_mark.line + 1)
        for key, value in self._pairs(mapping):
            decode = _RATE_LIMIT_FIELDS.get(key)
            if decode is not None:
                setattr(r, key, decode(self, value))
            elif key in ("rate_limits", "budget"):
                self._misplaced(key, value, "in a rate limit")
        return r

    def rate_limit_list(self, node: Node) -> list[RateLimitDoc]:
        out = []
        for element in self._elements(node, "[]config.YamlRateLimit"):
            r = self.rate_limit(element)
            if r is None:
                r = RateLimitDoc(line=element.start_mark.line + 1)
            out.append(r)
        return out

    def replaces(self, node: Node) -> list[str]:
        names = []
        for element in self._elements(node, "[]config.yamlReplaces"):
            name = ""
            if isinstance(element, MappingNode):
                for key, value in self._pairs(element):
                    if key == "name":
                        name = self.string(value)
            elif not self._null(element):
                self.errors.append(_terror(element, "config.yamlReplaces"))
            names.append(name)
        return names

    def metadata(self, node: Node) -> dict[str, Any] | None:
        mapping = self._mapping(node, "map[string]interface {}")
        return _construct(mapping) if mapping is not None else None


# Where each key of the extension (docs/algorithms.md) belongs.
_EXTENSION_KEYS = {
    "algorithm": "a rate_limit or a rate_limits entry",
    "unit_multiplier": "a rate_limit or a rate_limits entry",
    "rate_limits": "a descriptor",
    "budget": "a descriptor",
}

_DESCRIPTOR_FLAGS = frozenset(
    {"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "meter"}
)

# How each key of a document is decoded into the attribute of the same name, as yaml.v2 fills
# the reference's structs; a key not listed is skipped (or reported misplaced) by its reader.
_Field = Callable[[_Decoder, Node], Any]
_ROOT_FIELDS: dict[str, _Field] = {
    "domain": _Decoder.string,
    "descriptors": _Decoder.descriptor_list,
}
_DESCRIPTOR_FIELDS: dict[str, _Field] = {
    "key": _Decoder.string,
    "value": _Decoder.string,
    **dict.fromkeys(_DESCRIPTOR_FLAGS, _Decoder.boolean),
    "rate_limit": _Decoder.rate_limit,
    "rate_limits": _Decoder.rate_limit_list,
    "descriptors": _Decoder.descriptor_list,
    "metadata": _Decoder.metadata,
}
_RATE_LIMIT_FIELDS: dict[str, _Field] = {
    "requests_per_unit": _Decoder.uint32,
    "unit": _Decoder.string,
    "name": _Decoder.string,
    "algorithm": _Decoder.string,
    "unit_multiplier": _Decoder.int64,
    "unlimited": _Decoder.boolean,
    "replaces": _Decoder.replaces,
}


def _construct(node: Node) -> Any:
    """A node as the JSON-like value google.protobuf.Struct would hold."""
    if isinstance(node, MappingNode):
        return {
            _go_value(k) if not isinstance(k, ScalarNode) else k.value: _construct(v)
            for k, v in node.value
        }
    if isinstance(node, SequenceNode):
        return [_construct(v) for v in node.value]
    kind = _scalar_kind(node)  # type: ignore[arg-type]
    text = node.value
    if kind == "null":
        return None
    if kind == "bool":
        return _bool(text)
    if kind == "int":
        return _int(text)
    if kind == "float":
        return _float(text)
    return text
