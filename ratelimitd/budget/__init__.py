"""Exact token budgets: reserve at request time, settle at stream end, never overshoot
(README, "Token budgets for AI gateways").

`model` says what a budget call is and where a budget lives, `memory` is the in-process
store (and the twin of the Redis script in `backends.redis.budget`), `config` the `budget:`
block of a rule, `calls` how a budget call is recognised in the descriptors Envoy sends,
and `retry` the bounded buffer that retries a stream end the store could not take.
"""
