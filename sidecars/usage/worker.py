"""The usage API's gunicorn worker: uvicorn's, without its own X-Forwarded-For handling.

uvicorn rewrites the client address from X-Forwarded-For for peers in FORWARDED_ALLOW_IPS
(127.0.0.1 by default), so any local caller could pick its address. The app decides instead,
trusting only USAGE_TRUSTED_PROXIES (`sidecars.common.clients.RequestLimits`).
"""

from typing import Any

from uvicorn.workers import UvicornWorker


class UsageWorker(UvicornWorker):
    """UvicornWorker with proxy_headers off."""

    CONFIG_KWARGS: dict[str, Any] = {  # noqa: RUF012 - uvicorn's own (instance) declaration
        **UvicornWorker.CONFIG_KWARGS,
        "proxy_headers": False,
    }
