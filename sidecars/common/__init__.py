"""What both HTTP sidecars really share.

- `errors`: the JSON error body (`ApiError`) of the usage API and of the rate limiter, which
  answers with it in front of either sidecar;
- `ratelimit`: the account-aware rate-limit middleware (authentication, quota, ratelimitd);
- `lifecycle`: the middleware that starts and stops a sidecar's background work with the ASGI
  lifespan;
- `server`: how a sidecar runs (gunicorn with uvicorn workers) and logs.

Each sidecar's own bodies, health report and resources live in its package; nothing here
imports either sidecar.
"""
