"""The Rate Limit Quota Service (RLQS): Envoy's second global rate-limit protocol, one
limit shared among many Envoys off the request path (docs/rlqs.md).

* ``share.py``: the fair-share arithmetic, pure functions;
* ``buckets.py``: a BucketId as descriptor entries (RLQS_BUCKET_KEYS), a bucket's state;
* ``codec.py``: the messages (protobuf);
* ``service.py``: `QuotaService`, the streams and their assignments, counted through the
  RLS service's own store; the transports' adapters are in ``transport/rlqs.py``.
"""

from .service import QuotaService, QuotaStream

__all__ = ["QuotaService", "QuotaStream"]
