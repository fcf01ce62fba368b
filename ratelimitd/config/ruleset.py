"""Config documents -> one immutable RuleSet (validation in the reference's order).

`build_ruleset` runs the reference's `loadConfig`/`loadDescriptors` checks (section 3.2,
step B) over all files in order, merges domains when asked, and compiles each domain into
the descriptor trie of `ratelimitd.match`. A RuleSet is never mutated after it is built:
a reload builds a new one and swaps the reference, so each request sees exactly one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from .. import keys, match
from .errors import ConfigError
from .yamlfile import DescriptorDoc, RootDoc

# RLS v3 `RateLimitResponse.RateLimit.Unit` enum, by name (the config's unit, upper-cased).
UNIT_BY_NAME = {
    "UNKNOWN": 0,
    "SECOND": 1,
    "MINUTE": 2,
    "HOUR": 3,
    "DAY": 4,
    "MONTH": 5,
    "YEAR": 6,
    "WEEK": 7,
}
UNIT_NAMES = {number: name for name, number in UNIT_BY_NAME.items()}


class StatsSource(Protocol):
    """Where a rule gets its counters (see ratelimitd.stats.StatsStore.rule_stats)."""

    def rule_stats(self, key: str) -> Any: ...


class Rule:
    """One rate limit: a config `rate_limit` block, or a request's limit override."""

    __slots__ = (
        "detailed_metric",
        "full_key",
        "metadata",
        "meter",
        "name",
        "quota_mode",
        "replaces",
        "requests_per_unit",
        "shadow_mode",
        "special",
        "stats",
        "unit",
        "unit_seconds",
        "unlimited",
    )

    def __init__(
        self,
        full_key: str,
        requests_per_unit: int,
        unit: int,
        *,
        name: str = "",
        replaces: Sequence[str] = (),
        unlimited: bool = False,
        shadow_mode: bool = False,
        quota_mode: bool = False,
        detailed_metric: bool = False,
        metadata: dict[str, Any] | None = None,
        stats: Any = None,
        meter: bool = False,
    ) -> None:
        self.full_key = full_key
        self.requests_per_unit = requests_per_unit
        self.unit = unit
        self.unit_seconds = keys.unit_seconds(unit)
        self.name = name
        self.replaces = tuple(replaces)
        self.unlimited = unlimited
        self.shadow_mode = shadow_mode
        self.quota_mode = quota_mode
        self.detailed_metric = detailed_metric
        self.metadata = metadata
        self.stats = stats
        self.meter = meter  # extension: count matching hits in per-day usage buckets
        # One test on the hot path instead of three for the rare cases.
        self.special = bool(self.replaces) or unlimited or meter

    @property
    def unit_name(self) -> str:
        """The unit's enum name (`MINUTE`, ...; `UNKNOWN` for unlimited rules)."""
        return UNIT_NAMES.get(self.unit, "UNKNOWN")

    def __repr__(self) -> str:
        return f"Rule({self.full_key!r}, {self.requests_per_unit}/{self.unit_name})"


@dataclass(slots=True)
class NodeSpec:
    """A validated config entry, the input of `match.compile_level`."""

    key: str
    value: str
    final_key: str
    rule: Rule | None
    value_to_metric: bool
    share_threshold: bool
    children: list[NodeSpec] = field(default_factory=list)
    index: dict[str, NodeSpec] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """One config to load: its name (error prefix) and its parsed document."""

    name: str
    doc: RootDoc


class Matcher(Protocol):
    """A descriptor-trie implementation: `ratelimitd.match`, or one of its twins."""

    def compile_level(self, specs: Sequence[Any]) -> Any: ...

    def lookup(self, root: Any, domain: str, entries: Any) -> Any: ...


class RuleSet:
    """All loaded domains, compiled. Immutable; replaced as a whole on reload.

    `domains` maps a domain to its compiled trie (read-only), and `lookup` is the matcher
    function of the implementation that compiled it: a RuleSet is only ever searched by the
    code that built it, whichever of the compiled module and its twin that was.
    """

    __slots__ = ("_specs", "domains", "lookup")

    domains: MappingProxyType[str, Any]
    lookup: Callable[[Any, str, Any], Any]
    _specs: MappingProxyType[str, list[NodeSpec]]

    def __init__(
        self,
        domains: dict[str, Any],
        specs: dict[str, list[NodeSpec]],
        lookup: Callable[[Any, str, Any], Any] = match.lookup,
    ) -> None:
        object.__setattr__(self, "domains", MappingProxyType(dict(domains)))
        object.__setattr__(self, "_specs", MappingProxyType(dict(specs)))
        object.__setattr__(self, "lookup", lookup)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"RuleSet is immutable (cannot set {name!r})")

    @property
    def specs(self) -> MappingProxyType[str, list[NodeSpec]]:
        """The validated config entries per domain, the input the tries were compiled from."""
        return self._specs

    def __len__(self) -> int:
        return len(self.domains)

    def rules(self) -> Iterable[Rule]:
        """Every configured rule, in config order."""

        def walk(specs: list[NodeSpec]) -> Iterable[Rule]:
            for spec in specs:
                if spec.rule is not None:
                    yield spec.rule
                yield from walk(spec.children)

        for specs in self._specs.values():
            yield from walk(specs)

    def dump(self) -> str:
        """The `/rlconfig` text: one line per rule (config order, not Go's random order)."""
        lines = []
        for rule in self.rules():
            number = 0 if rule.unlimited else rule.requests_per_unit
            unit = "UNKNOWN" if rule.unlimited else rule.unit_name
            lines.append(
                f"{rule.full_key}: unit={unit} requests_per_unit={number}, "
                f"shadow_mode: {'true' if rule.shadow_mode else 'false'}, "
                f"quota_mode: {'true' if rule.quota_mode else 'false'}\n"
            )
        return "".join(lines)


def build_ruleset(
    sources: Iterable[ConfigSource],
    *,
    merge_domains: bool = False,
    stats: StatsSource | None = None,
    matcher: Matcher = match,
) -> RuleSet:
    """Validate and compile configs in order; raise ConfigError on the first problem.

    `matcher` compiles the tries (the selected `ratelimitd.match` unless a caller, such as a
    benchmark of the pure twin, names another implementation).
    """
    roots: dict[str, NodeSpec] = {}
    for source in sources:
        doc = source.doc
        if doc.domain == "":
            raise ConfigError(source.name, "config file cannot have empty domain")
        root = roots.get(doc.domain)
        if root is None:
            root = roots[doc.domain] = NodeSpec(doc.domain, "", doc.domain, None, False, False)
        elif not merge_domains:
            raise ConfigError(source.name, f"duplicate domain '{doc.domain}' in config file")
        _load_descriptors(source.name, root, doc.domain + ".", doc.descriptors, stats)
    specs = {domain: root.children for domain, root in roots.items()}
    domains = {domain: matcher.compile_level(children) for domain, children in specs.items()}
    return RuleSet(domains, specs, matcher.lookup)


def _load_descriptors(
    name: str,
    parent: NodeSpec,
    parent_key: str,
    docs: list[DescriptorDoc],
    stats: StatsSource | None,
) -> None:
    for d in docs:
        if d.key == "":
            raise ConfigError(name, "descriptor has empty key")
        final_key = d.key + "_" + d.value if d.value else d.key
        full_key = parent_key + final_key
        if final_key in parent.index:
            raise ConfigError(name, f"duplicate descriptor composite key '{full_key}'")

        rule = None
        if d.rate_limit is not None:
            r = d.rate_limit
            unit = UNIT_BY_NAME.get(r.unit.upper(), 0)
            if r.unlimited:
                if unit:
                    raise ConfigError(name, "should not specify rate limit unit when unlimited")
            elif not unit:
                raise ConfigError(name, f"invalid rate limit unit '{r.unit}'")
            for replaced in r.replaces:
                if replaced == "":
                    raise ConfigError(name, "should not have an empty replaces entry")
                if replaced == r.name:
                    raise ConfigError(name, "replaces should not contain name of same descriptor")
            rule = Rule(
                full_key,
                r.requests_per_unit,
                unit,
                name=r.name,
                replaces=r.replaces,
                unlimited=r.unlimited,
                shadow_mode=d.shadow_mode,
                quota_mode=d.quota_mode,
                detailed_metric=d.detailed_metric,
                metadata=d.metadata,
                stats=stats.rule_stats(full_key) if stats is not None else None,
                meter=d.meter,
            )

        if d.meter and rule is None:
            raise ConfigError(
                name, f"meter needs a rate_limit (unlimited: true to only meter) on '{full_key}'"
            )
        if d.share_threshold and "*" not in final_key:
            raise ConfigError(
                name,
                "share_threshold can only be used with wildcard values (containing '*'), "
                f"but found key '{final_key}'",
            )

        spec = NodeSpec(d.key, d.value, final_key, rule, d.value_to_metric, d.share_threshold)
        _load_descriptors(name, spec, full_key + ".", d.descriptors, stats)
        parent.index[final_key] = spec
        parent.children.append(spec)
