"""gRPC status codes (google.rpc.Code), declared once for every transport.

Not to be confused with `messages.CODE_UNKNOWN`, the RLS response's own `Code` (0): a gRPC status
is how a call ended, a response code what the rate limit decided.
"""

from .messages import FAULT, INVALID, OVERLOADED, STORE_FAILED, TOO_LARGE

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

# What each transport answers a request the service refused instead of deciding
# (`messages.Refusal.kind`): its gRPC status (with the error's text), the main listener's
# `/json` HTTP status, and the debug listener's (`/explain`, `/counters`).
GRPC, JSON, DEBUG = 0, 1, 2
REFUSED: dict[int, tuple[int, int, int]] = {
    # The reference's UNKNOWN; `/json` answers its 400.
    INVALID: (UNKNOWN, 400, 400),
    # Refused for its size before any work.
    TOO_LARGE: (RESOURCE_EXHAUSTED, 400, 400),
    # Refused for the load: worth trying again soon.
    OVERLOADED: (RESOURCE_EXHAUSTED, 503, 503),
    # The reference's UNKNOWN and `/json` 400; the operator's port says the store is down.
    STORE_FAILED: (UNKNOWN, 400, 503),
    FAULT: (UNKNOWN, 500, 500),
}
