"""Fixtures of the tests/core modules: `impl` (each matcher twin, a module) and `match` (a
config compiled by it), shared by test_match.py and test_match_keys.py. Tests that parametrize
an `impl` of their own (test_core, test_saturation: "compiled" / "pure") override `impl`."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
from support.core import MATCH_IMPLEMENTATIONS as IMPLEMENTATIONS
from support.core import Matcher, ruleset_of


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> ModuleType:
    return importlib.import_module(request.param)


@pytest.fixture
def match(impl: ModuleType):
    """match("basic_config.yaml" | yaml text) -> Matcher for the parametrized implementation."""

    def build(name_or_text: str) -> Matcher:
        return Matcher(impl, ruleset_of(name_or_text))

    return build
