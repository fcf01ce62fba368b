"""gRPC status codes (google.rpc.Code), declared once for every transport.

Not to be confused with `messages.CODE_UNKNOWN`, the RLS response's own `Code` (0): a gRPC status
is how a call ended, a response code what the rate limit decided.
"""

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
UNAUTHENTICATED = 16
