"""Rate-limit configuration: YAML files -> validated, compiled, immutable RuleSet; and what the
stores read of it: the algorithm ids (`windows`), the key and window maths (`keys`), the
descriptor trie (`match`), the `budget:` block (`budgets`) and the budget stores' contract
(`budget_store`)."""

from .errors import ConfigError
from .loader import ConfigFile, load_files, load_paths, load_ruleset
from .ruleset import UNIT_BY_NAME, UNIT_NAMES, ConfigSource, Rule, RuleSet, build_ruleset

__all__ = [
    "UNIT_BY_NAME",
    "UNIT_NAMES",
    "ConfigError",
    "ConfigFile",
    "ConfigSource",
    "Rule",
    "RuleSet",
    "build_ruleset",
    "load_files",
    "load_paths",
    "load_ruleset",
]
