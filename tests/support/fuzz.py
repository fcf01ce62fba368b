"""schemathesis over one operation of an app's own OpenAPI document: up to MAX_EXAMPLES cases
in one generation mode, each sent and checked (no server error, status, header, content-type
or schema violation), counted by (operation, status)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import hypothesis
import schemathesis
from hypothesis import HealthCheck, Phase

MAX_EXAMPLES = 20


def fuzz(
    operation: Any,
    mode: schemathesis.GenerationMode,
    seen: Counter[tuple[str, int]],
    headers: dict[str, str] | None = None,
    excluded: Sequence[Callable[..., Any]] = (),
    max_examples: int = MAX_EXAMPLES,
    prepare: Callable[[schemathesis.Case], None] | None = None,
) -> None:
    """Generate, send and check the cases (`excluded`: checks left out for this operation;
    `prepare`: makes a positive case valid as a whole where the API has rules a schema
    cannot state)."""
    positive = mode == schemathesis.GenerationMode.POSITIVE

    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(
        max_examples=max_examples,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
        # The same cases on every run: what the suite asserts about them (each status seen)
        # must not depend on the draw.
        derandomize=True,
    )
    def run(case: schemathesis.Case) -> None:
        if positive and prepare is not None:
            prepare(case)
        response = case.call_and_validate(headers=headers, excluded_checks=list(excluded))
        seen[(case.operation.label, response.status_code)] += 1

    run()
