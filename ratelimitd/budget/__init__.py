"""Exact token budgets: reserve at request time, settle at stream end, never overshoot
(docs/budgets.md).

`model` says what a budget call is and where a budget lives, `memory` is the in-process
store (and the twin of the Redis script in `backends.redis.budget`), and `config` the
`budget:` block of a rule and how a budget call is recognised in a descriptor.
"""
