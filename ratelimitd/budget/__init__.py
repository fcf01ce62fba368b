"""Exact token budgets: reserve at request time, settle at stream end, never overshoot
(docs/budgets.md).

This package is the service's side of a budget: `calls` turns a request's budget entries into
store calls and their results into statuses, `retry` settles what a store could not take at
stream end, `outbox` shapes the usage events a budget store appends. What a budget call is
and where a budget lives is `config.budget_store` (the contract every store keeps), the
`budget:` block of a rule is `config.budgets`, and the stores are `backends.memory_budget`
and `backends.redis.budget`.
"""
