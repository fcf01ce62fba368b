"""Rate-limit configuration: YAML files -> validated, compiled, immutable RuleSet."""

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
