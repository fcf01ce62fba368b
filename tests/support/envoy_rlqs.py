"""A stock Envoy with the rate_limit_quota filter (RLQS) in front of its own 200 backend.

The filter puts every request in bucket `{name: api, user: <x-user header>}` of domain
`rlqs`, reports to the RLQS server on `rlqs_port`, denies until the first assignment (a
one-token bucket there would bound the gap to one request, but a token bucket as
no_assignment_behavior crashes Envoy 1.40.0 on the first request), answers 429 when its
assignment denies, and admits everything once an assignment expires (for an hour).
"""

from __future__ import annotations

from pathlib import Path

from .envoy_server import Envoy, _listener, bootstrap, grpc_cluster, start_configured

QUOTA = "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3"
HEADER_INPUT = "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
DOMAIN = "rlqs"


def rules(limit: int, unit: str) -> str:
    """The rule of the filter's bucket in a ratelimitd config: `limit` per `unit` per user
    (with RLQS_BUCKET_KEYS=name,user)."""
    return f"""
domain: {DOMAIN}
descriptors:
  - key: name
    value: api
    descriptors:
      - key: user
        rate_limit: {{unit: {unit}, requests_per_unit: {limit}}}
"""


DENY_ALL = "{ blanket_rule: DENY_ALL }"

__all__ = ["DOMAIN", "envoy_rlqs_config", "rules", "start_envoy_rlqs"]


def envoy_rlqs_config(
    *,
    listen_port: int,
    backend_port: int,
    admin_port: int,
    rlqs_port: int | None,
    expired: str = "{ blanket_rule: ALLOW_ALL }",
    no_assignment: str = DENY_ALL,
) -> str:
    """An Envoy bootstrap: ingress (rate_limit_quota -> router -> backend) + backend listener;
    without `rlqs_port`, no filter at all (Envoy alone, the baseline)."""
    quota_filter = cluster = ""
    if rlqs_port is not None:
        quota_filter = f"""
          - name: envoy.filters.http.rate_limit_quota
            typed_config:
              "@type": {QUOTA}.RateLimitQuotaFilterConfig
              domain: {DOMAIN}
              rlqs_server: {{ envoy_grpc: {{ cluster_name: rlqs }} }}
              bucket_matchers:
                matcher_list:
                  matchers:
                  - predicate:
                      single_predicate:
                        input:
                          name: user
                          typed_config:
                            "@type": {HEADER_INPUT}
                            header_name: x-user
                        value_match: {{ safe_regex: {{ google_re2: {{}}, regex: ".+" }} }}
                    on_match:
                      action:
                        name: rate_limit_quota
                        typed_config:
                          "@type": {QUOTA}.RateLimitQuotaBucketSettings
                          bucket_id_builder:
                            bucket_id_builder:
                              name: {{ string_value: api }}
                              user:
                                custom_value:
                                  name: user
                                  typed_config:
                                    "@type": {HEADER_INPUT}
                                    header_name: x-user
                          reporting_interval: 5s
                          deny_response_settings: {{ http_status: {{ code: 429 }} }}
                          no_assignment_behavior: {{ fallback_rate_limit: {no_assignment} }}
                          expired_assignment_behavior:
                            # Past this the filter falls back to no_assignment_behavior.
                            expired_assignment_behavior_timeout: 3600s
                            fallback_rate_limit: {expired}"""
        cluster = grpc_cluster("rlqs", rlqs_port)
    route = """              - match: { prefix: "/" }
                route: { cluster: backend }"""
    backend_route = """              - match: { prefix: "/" }
                direct_response: { status: 200, body: { inline_string: "ok\\n" } }"""
    listeners = _listener("ingress", listen_port, route, quota_filter) + _listener(
        "backend", backend_port, backend_route
    )
    return bootstrap(admin_port, listeners, backend_port, cluster)


def start_envoy_rlqs(workdir: Path, rlqs_port: int | None, **config: str) -> Envoy:
    """A ready Envoy with the quota filter reporting to `rlqs_port` (None: no filter), on
    fresh free ports (retried if another process took one first)."""
    return start_configured(workdir, envoy_rlqs_config, rlqs_port=rlqs_port, **config)
