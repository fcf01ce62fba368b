"""Config documents -> one immutable RuleSet (validation in the reference's order).

`build_ruleset` runs the reference's `loadConfig`/`loadDescriptors` checks
(`src/config/config_impl.go`) over all files in order, merges domains when asked, and compiles
each domain into the descriptor trie of `ratelimitd.config.match`. A RuleSet is never mutated
after it is built: a reload builds a new one and swaps the reference, so each request sees
exactly one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from . import keys, match
from .errors import ConfigError
from .windows import (
    ALGORITHM_BY_NAME,
    ALGORITHM_NAMES,
    FIXED_WINDOW,
    Window,
    key_suffix,
)
from .yamlfile import DescriptorDoc, RateLimitDoc, RootDoc

if TYPE_CHECKING:
    from .budgets import BudgetSpec

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

# What the load checks limits against (`backends.base.counted_by`): the store's name, the
# algorithms it counts exactly and, when given, those it keeps budgets for (none if absent).
Store = tuple[str, frozenset[int]] | tuple[str, frozenset[int], frozenset[int]]

# Sliding windows and token buckets count in integer "ticks" (1 ms, or 1 s for very long,
# very large limits) so that every product of their maths stays below 2**53: exact in
# C, in Python and in Redis' Lua (whose numbers are doubles) alike.
MAX_TICK_PRODUCT = 1 << 50


class StatsSource(Protocol):
    """Where a rule gets its counters (see ratelimitd.stats.StatsStore.rule_stats)."""

    def rule_stats(self, key: str) -> Any: ...


class Rule:
    """One rate limit: a config `rate_limit` block, or a request's limit override."""

    __slots__ = (
        "algorithm",
        "budget",
        "budget_terms",
        "detailed_metric",
        "extended",
        "full_key",
        "key_memo",
        "limits",
        "metadata",
        "meter",
        "name",
        "quota_mode",
        "replaces",
        "requests_per_unit",
        "shadow_mode",
        "special",
        "stats",
        "tick",
        "unit",
        "unit_multiplier",
        "unit_seconds",
        "unlimited",
        "window_ticks",
        "windows",
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
        algorithm: int = FIXED_WINDOW,
        unit_multiplier: int = 1,
        limits: Sequence[Rule] | None = None,
        tick: int = 1,
    ) -> None:
        self.full_key = full_key
        self.requests_per_unit = requests_per_unit
        self.unit = unit
        # The window: unit_multiplier units (every window length below is this one).
        self.unit_seconds = keys.unit_seconds(unit) * unit_multiplier
        self.unit_multiplier = unit_multiplier
        self.algorithm = algorithm
        # Extension: a descriptor's several limits (`rate_limits:`), each a Rule; None
        # for one limit. The descriptor's own Rule then carries the shared fields.
        self.limits: tuple[Rule, ...] | None = tuple(limits) if limits is not None else None
        # Sliding window and token bucket maths run in ticks of `tick` ms.
        self.tick = tick
        self.window_ticks = self.unit_seconds * 1000 // tick
        # Anything but the reference's fixed window: its keys carry their window.
        self.extended = limits is not None or algorithm != FIXED_WINDOW or unit_multiplier != 1
        self.name = name
        self.replaces = tuple(replaces)
        self.unlimited = unlimited
        self.shadow_mode = shadow_mode
        self.quota_mode = quota_mode
        self.detailed_metric = detailed_metric
        self.metadata = metadata
        self.stats = stats
        self.meter = meter  # extension: count matching hits in per-day usage buckets
        # One test on the hot path instead of four for the rare cases.
        self.special = bool(self.replaces) or unlimited or meter
        # Extension: a token budget (`budget:`, set by `budgeted`), its windows the store's.
        self.budget: BudgetSpec | None = None
        # What a budget call reads of this rule, read once (`budget.calls.terms_of`).
        self.budget_terms: Any = None
        # What the count step counts: one window per limit (none when unlimited). The limits
        # of a list are counted through their descriptor's Rule, which compiles them here.
        # The compiled decision's last cache key for this rule's window (start, prefix,
        # domain, key, value, cache key): a request of the same window reuses the key object.
        self.key_memo: tuple[Any, ...] | None = None
        self.windows: tuple[Window, ...] = (
            ()
            if unlimited
            else tuple(_window(limit, not self.extended) for limit in self.limits or (self,))
        )

    def budgeted(self, spec: BudgetSpec) -> None:
        """Make this rule a token budget (the descriptor's `budget:`, checked)."""
        self.budget = spec.with_windows(self.windows)
        self.budget_terms = None  # read again from this budget on its next call
        self.special = True

    @property
    def unit_name(self) -> str:
        """The unit's enum name (`MINUTE`, ...; `UNKNOWN` for unlimited rules)."""
        return UNIT_NAMES.get(self.unit, "UNKNOWN")

    def without(self, names: set[str]) -> Rule | None:
        """This several-limits rule without the limits `names` replace (None: without any)."""
        assert self.limits is not None
        kept = [limit for limit in self.limits if not (limit.name and limit.name in names)]
        if len(kept) == len(self.limits):
            return self
        if not kept:
            return None
        return self.relimited(
            kept[0].requests_per_unit,
            kept[0].unit,
            replaces=self.replaces,
            meter=self.meter,
            limits=kept,
        )

    def relimited(self, requests_per_unit: int, unit: int, **fields: Any) -> Rule:
        """This rule at another limit: its key, modes, metadata, statistics and budget kept
        (the budget's windows remade for the new limit), `fields` as given."""
        rule = Rule(
            self.full_key,
            requests_per_unit,
            unit,
            shadow_mode=self.shadow_mode,
            quota_mode=self.quota_mode,
            detailed_metric=self.detailed_metric,
            metadata=self.metadata,
            stats=self.stats,
            **fields,
        )
        if self.budget is not None:
            rule.budgeted(self.budget)
        return rule

    @property
    def algorithm_name(self) -> str:
        """`fixed_window`, `sliding_window` or `token_bucket`."""
        return ALGORITHM_NAMES[self.algorithm]

    def __repr__(self) -> str:
        window = f"{self.unit_multiplier}x" if self.unit_multiplier != 1 else ""
        return f"Rule({self.full_key!r}, {self.requests_per_unit}/{window}{self.unit_name})"


def _window(limit: Rule, reference: bool) -> Window:
    seconds = limit.unit_seconds
    return Window(
        limit,
        limit.algorithm,
        seconds,
        limit.requests_per_unit,
        key_suffix(limit.algorithm, seconds, reference),
        limit.tick,
        limit.window_ticks,
        limit.unit == 1,
    )


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
    """A descriptor-trie implementation: `ratelimitd.config.match`, or one of its twins."""

    def compile_level(self, specs: Sequence[Any]) -> Any: ...

    def lookup(self, root: Any, domain: str, entries: Any, walked: Any = None) -> Any: ...


class RuleSet:
    """All loaded domains, compiled. Immutable; replaced as a whole on reload.

    `domains` maps a domain to its compiled trie (read-only), and `lookup` is the matcher
    function of the implementation that compiled it: a RuleSet is only ever searched by the
    code that built it, whichever of the compiled module and its twin that was. `budgets`
    maps a domain with budget rules to the (phase key, transaction key) its budget calls
    carry.
    """

    __slots__ = ("_specs", "_tries", "budgets", "domains", "lookup")

    domains: MappingProxyType[str, Any]
    lookup: Callable[[Any, str, Any], Any]
    budgets: MappingProxyType[str, tuple[str, str]]
    _specs: MappingProxyType[str, list[NodeSpec]]
    _tries: dict[str, Any]  # behind `domains`: the compiled decision reads it in C

    def __init__(
        self,
        domains: dict[str, Any],
        specs: dict[str, list[NodeSpec]],
        lookup: Callable[[Any, str, Any], Any] = match.lookup,
        budgets: dict[str, tuple[str, str]] | None = None,
    ) -> None:
        object.__setattr__(self, "_tries", dict(domains))
        object.__setattr__(self, "domains", MappingProxyType(self._tries))
        object.__setattr__(self, "_specs", MappingProxyType(dict(specs)))
        object.__setattr__(self, "lookup", lookup)
        object.__setattr__(self, "budgets", MappingProxyType(dict(budgets or {})))

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

    def limits(self) -> Iterable[tuple[str, int]]:
        """(stats key, requests per unit) of every rule with a limit; a rule of several
        limits (`rate_limits:`) gives its first."""
        for rule in self.rules():
            limit = rule.limits[0] if rule.limits else rule
            if not limit.unlimited:
                yield rule.full_key, limit.requests_per_unit

    def dump(self) -> str:
        """The `/rlconfig` text: one line per rule (config order, not Go's random order)."""
        lines = []
        for rule in self.rules():
            for limit in rule.limits or (rule,):
                number = 0 if limit.unlimited else limit.requests_per_unit
                unit = "UNKNOWN" if limit.unlimited else limit.unit_name
                # The extensions are shown only where used: reference configs dump as there.
                extra = ""
                if limit.unit_multiplier != 1:
                    extra += f" unit_multiplier={limit.unit_multiplier}"
                if limit.algorithm != FIXED_WINDOW:
                    extra += f" algorithm={limit.algorithm_name}"
                if rule.limits is not None and limit.name:
                    extra += f" name={limit.name}"
                lines.append(
                    f"{rule.full_key}: unit={unit} requests_per_unit={number}{extra}, "
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
    backend: Store | None = None,
    algorithms: Iterable[tuple[str, str]] = (),
) -> RuleSet:
    """Validate and compile configs in order; raise ConfigError on the first problem.

    `matcher` compiles the tries (the selected `ratelimitd.config.match` unless a caller, such as a
    benchmark of the pure twin, names another implementation). `backend` is the name of
    the counter store, the algorithms it can count exactly and those it keeps budgets for
    (None: every algorithm, and budgets of fixed and sliding windows); a limit it cannot
    count is refused here, at load, never at request time. `algorithms` are (domain,
    algorithm name) pairs: the algorithm of a limit of that domain (`*`: of any other) that
    names none (DOMAIN_DEFAULT_ALGORITHMS).
    """
    # Imported here: the budget modules read the config's algorithm ids (config.windows).
    from .budgets import domain_keys

    roots: dict[str, NodeSpec] = {}
    budgeted: dict[str, dict[str, BudgetSpec]] = {}
    defaults = dict(algorithms)
    for domain, algorithm in defaults.items():
        if algorithm not in ALGORITHM_BY_NAME:
            raise ConfigError(
                "DOMAIN_DEFAULT_ALGORITHMS",
                f"invalid rate limit algorithm '{algorithm}' for domain '{domain}' "
                "(expected fixed_window, sliding_window or token_bucket)",
            )
    for source in sources:
        doc = source.doc
        if doc.domain == "":
            raise ConfigError(source.name, "config file cannot have empty domain")
        algorithm = defaults.get(doc.domain, defaults.get("*", ""))
        docs = _defaulted(doc.descriptors, algorithm) if algorithm else doc.descriptors
        root = roots.get(doc.domain)
        if root is None:
            root = roots[doc.domain] = NodeSpec(doc.domain, "", doc.domain, None, False, False)
        elif not merge_domains:
            raise ConfigError(source.name, f"duplicate domain '{doc.domain}' in config file")
        mine = budgeted.setdefault(doc.domain, {})
        _load_descriptors(source.name, root, doc.domain + ".", docs, stats, backend, mine)
        domain_keys(source.name, mine)
    specs = {domain: root.children for domain, root in roots.items()}
    domains = {domain: matcher.compile_level(children) for domain, children in specs.items()}
    keys_by_domain = {
        domain: pair
        for domain, rules in budgeted.items()
        if (pair := domain_keys("", rules)) is not None
    }
    return RuleSet(domains, specs, matcher.lookup, keys_by_domain)


def _defaulted(docs: list[DescriptorDoc], algorithm: str) -> list[DescriptorDoc]:
    """`docs` with `algorithm` for every limit that names none (unlimited ones apart)."""

    def limit(r: RateLimitDoc) -> RateLimitDoc:
        return r if r.algorithm or r.unlimited else replace(r, algorithm=algorithm)

    return [
        replace(
            d,
            rate_limit=None if d.rate_limit is None else limit(d.rate_limit),
            rate_limits=None if d.rate_limits is None else [limit(r) for r in d.rate_limits],
            descriptors=_defaulted(d.descriptors, algorithm),
        )
        for d in docs
    ]


def _load_descriptors(
    name: str,
    parent: NodeSpec,
    parent_key: str,
    docs: list[DescriptorDoc],
    stats: StatsSource | None,
    backend: Store | None,
    budgeted: dict[str, BudgetSpec],
) -> None:
    for d in docs:
        if d.key == "":
            raise ConfigError(name, "descriptor has empty key")
        final_key = d.key + "_" + d.value if d.value else d.key
        full_key = parent_key + final_key
        if final_key in parent.index:
            raise ConfigError(name, f"duplicate descriptor composite key '{full_key}'")

        rule = None
        if d.rate_limits is not None:
            rule = _multi_limit(name, full_key, d, stats, backend)
        elif d.rate_limit is not None:
            r = d.rate_limit
            own = {r.name} if r.name else set()
            rule = _limit(name, full_key, d, r, own, stats, backend, meter=d.meter)

        if d.meter and rule is None:
            raise ConfigError(
                name, f"meter needs a rate_limit (unlimited: true to only meter) on '{full_key}'"
            )
        if d.budget_line:
            budgeted[full_key] = _budget(name, full_key, d, rule, backend)
        if d.share_threshold and "*" not in final_key:
            raise ConfigError(
                name,
                "share_threshold can only be used with wildcard values (containing '*'), "
                f"but found key '{final_key}'",
            )

        spec = NodeSpec(d.key, d.value, final_key, rule, d.value_to_metric, d.share_threshold)
        _load_descriptors(name, spec, full_key + ".", d.descriptors, stats, backend, budgeted)
        parent.index[final_key] = spec
        parent.children.append(spec)


def _budget(
    name: str, full_key: str, d: DescriptorDoc, rule: Rule | None, backend: Store | None
) -> BudgetSpec:
    """The descriptor's `budget:`, checked against its rule and the store; the rule made a
    budget."""
    if rule is not None and rule.meter:
        raise ConfigError(
            name,
            _at(d.budget_line, f"budget of '{full_key}': a budget rule cannot meter "
                "(its calls carry estimates, usage and response codes as hits)"),
        )  # fmt: skip
    from .budgets import budget_of

    kept_by = None
    if backend is not None:
        kept_by = (backend[0], backend[2] if len(backend) == 3 else frozenset())
    spec = budget_of(name, full_key, d.budget, d.budget_line, rule.windows if rule else (), kept_by)
    assert rule is not None  # budget_of refuses a descriptor without limits
    rule.budgeted(spec)
    if rule.stats is not None:
        rule.stats.budget = True  # its budget series are shown from the start
    return spec


def _at(line: int, message: str) -> str:
    """`line N: message` where the block's line is known (files), else the message (xDS)."""
    return f"line {line}: {message}" if line else message


def _checked_unit(name: str, r: RateLimitDoc) -> int:
    """The unit enum number, with the reference's unit/unlimited checks."""
    unit = UNIT_BY_NAME.get(r.unit.upper(), 0)
    if r.unlimited:
        if unit:
            raise ConfigError(name, "should not specify rate limit unit when unlimited")
    elif not unit:
        raise ConfigError(name, f"invalid rate limit unit '{r.unit}'")
    return unit


def _check_replaces(name: str, r: RateLimitDoc, own: set[str]) -> None:
    for replaced in r.replaces:
        if replaced == "":
            raise ConfigError(name, "should not have an empty replaces entry")
        if replaced in own:
            raise ConfigError(name, "replaces should not contain name of same descriptor")


def _checked_window(
    name: str,
    full_key: str,
    r: RateLimitDoc,
    unit: int,
    backend: Store | None,
) -> tuple[int, int, int]:
    """The extensions of one limit: (algorithm, unit_multiplier, tick in ms), checked."""
    if r.unlimited:
        if r.algorithm or r.unit_multiplier is not None:
            raise ConfigError(
                name,
                _at(r.line, "should not specify algorithm or unit_multiplier when unlimited"),
            )
        return FIXED_WINDOW, 1, 1
    algorithm = ALGORITHM_BY_NAME.get(r.algorithm or "fixed_window")
    if algorithm is None:
        raise ConfigError(
            name,
            _at(
                r.line,
                f"invalid rate limit algorithm '{r.algorithm}' of '{full_key}' "
                "(expected fixed_window, sliding_window or token_bucket)",
            ),
        )
    multiplier = 1 if r.unit_multiplier is None else r.unit_multiplier
    if multiplier < 1:
        raise ConfigError(
            name,
            _at(
                r.line,
                f"invalid rate limit unit_multiplier {multiplier} of '{full_key}' "
                "(must be at least 1)",
            ),
        )
    window = keys.unit_seconds(unit) * multiplier
    if backend is not None and algorithm not in backend[1]:
        raise ConfigError(
            name,
            _at(
                r.line,
                f"algorithm {ALGORITHM_NAMES[algorithm]} of '{full_key}' cannot be counted "
                f"exactly by the {backend[0]} backend (it counts {_names(backend[1])})",
            ),
        )
    tick = 1
    if algorithm != FIXED_WINDOW:
        product = r.requests_per_unit * window
        if product * 1000 <= MAX_TICK_PRODUCT:
            tick = 1  # milliseconds
        elif product <= MAX_TICK_PRODUCT:
            tick = 1000  # seconds: the limit is too large for milliseconds over this window
        else:
            raise ConfigError(
                name,
                _at(
                    r.line,
                    f"{ALGORITHM_NAMES[algorithm]} of '{full_key}' cannot be counted exactly: "
                    f"requests_per_unit x window ({r.requests_per_unit} x {window}s) "
                    "must be at most 2^50",
                ),
            )
    elif window > MAX_TICK_PRODUCT:
        raise ConfigError(
            name, _at(r.line, f"window of '{full_key}' is too long ({window}s; at most 2^50s)")
        )
    return algorithm, multiplier, tick


def _names(algorithms: frozenset[int]) -> str:
    names = [ALGORITHM_NAMES[a] for a in sorted(algorithms)]
    return f"{names[0]} only" if len(names) == 1 else ", ".join(names)


def _multi_limit(
    name: str,
    full_key: str,
    d: DescriptorDoc,
    stats: StatsSource | None,
    backend: Store | None,
) -> Rule:
    """`rate_limits:`: one Rule carrying the descriptor's fields and its limits."""
    docs = d.rate_limits or []
    if d.rate_limit is not None:
        raise ConfigError(
            name, _at(d.line, f"descriptor '{full_key}' has both rate_limit and rate_limits")
        )
    if not docs:
        raise ConfigError(name, _at(d.line, f"rate_limits of '{full_key}' is empty"))
    own = {r.name for r in docs if r.name}
    rule_stats = stats.rule_stats(full_key) if stats is not None else None
    limits = []
    windows: dict[tuple[int, int], int] = {}
    for r in docs:
        if r.unlimited:
            raise ConfigError(
                name, _at(r.line, f"a limit in rate_limits of '{full_key}' cannot be unlimited")
            )
        limit = _limit(name, full_key, d, r, own, stats, backend)
        window = (limit.algorithm, limit.unit_seconds)
        if window in windows:
            raise ConfigError(
                name,
                _at(
                    r.line,
                    f"rate_limits of '{full_key}' has two {limit.algorithm_name} limits of "
                    f"{limit.unit_seconds}s (lines {windows[window]} and {r.line}): "
                    "a window is limited once",
                ),
            )
        windows[window] = r.line
        limits.append(limit)
    first = limits[0]
    return Rule(
        full_key,
        first.requests_per_unit,
        first.unit,
        # The descriptor's Rule has no name of its own: `replaces` drops single limits.
        replaces=[n for limit in limits for n in limit.replaces],
        stats=rule_stats,
        meter=d.meter,
        limits=limits,
        **_descriptor_fields(d),
    )


def _limit(
    name: str,
    full_key: str,
    d: DescriptorDoc,
    r: RateLimitDoc,
    own: set[str],
    stats: StatsSource | None,
    backend: Store | None,
    *,
    meter: bool = False,
) -> Rule:
    """One `rate_limit` (alone, or one of `rate_limits`), checked: a Rule carrying the
    descriptor's fields. `own`: the names `replaces` may not name (the descriptor's own)."""
    unit = _checked_unit(name, r)
    _check_replaces(name, r, own)
    algorithm, multiplier, tick = _checked_window(name, full_key, r, unit, backend)
    return Rule(
        full_key,
        r.requests_per_unit,
        unit,
        name=r.name,
        replaces=r.replaces,
        unlimited=r.unlimited,
        stats=stats.rule_stats(full_key) if stats is not None else None,
        meter=meter,
        algorithm=algorithm,
        unit_multiplier=multiplier,
        tick=tick,
        **_descriptor_fields(d),
    )


def _descriptor_fields(d: DescriptorDoc) -> dict[str, Any]:
    """What every Rule of a descriptor carries from it, whatever its limits."""
    return {
        "shadow_mode": d.shadow_mode,
        "quota_mode": d.quota_mode,
        "detailed_metric": d.detailed_metric,
        "metadata": d.metadata,
    }
