"""The account's usage page: `GET {base}/account/usage[?from=&to=]`, server-rendered HTML with
an inline SVG chart and inline CSS (no script, no build step, nothing fetched from elsewhere:
the Content-Security-Policy forbids it).

The page shows what the API answers, from the same calls: the plan, its quota, the usage and
the remaining quota in the current window (the usage endpoint), the daily requests over the
chosen range (the history endpoint's rows), the thresholds of the quota and of each meter
with a limit, and where the usage stands against them.

Authentication: the account's bearer token, as an `Authorization` header or as the
`usage_session` cookie. A link `...?token=<token>` (for a browser, which cannot send the
header) sets that cookie (HttpOnly, SameSite=Strict, scoped to the page) and redirects to the
page without the token, so the token leaves the address bar and the browser's history. The
page is not metered: it is the account's own view of its quota.
"""

from __future__ import annotations

import html
from datetime import date, timedelta
from urllib.parse import urlencode

import falcon
import falcon.asgi

from sidecars.common.ratelimit import AccessDenied, bearer_token

from .db.daily import DailyTable, DailyUsage
from .metering import Metering
from .meters import plain
from .resources import MAX_HISTORY_DAYS, BadRequest, day_param
from .store import Account, StoreUnavailable, UsageStore
from .webhooks import marks
from .windows import day_range, utc_date, utc_datetime

COOKIE = "usage_session"
HTML = "text/html; charset=utf-8"
# Nothing but this document and its inline styles: no script, no external asset of any kind.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'"
CHART_W, CHART_H = 800, 220

STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:2rem auto;max-width:56rem;color:#1d2330}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1.2rem}dt{color:#5a6275}
dd{margin:0;font-variant-numeric:tabular-nums;font-weight:600}
table{border-collapse:collapse}
td,th{padding:.25rem .8rem;text-align:right;border-bottom:1px solid #e3e6ec}
th:first-child,td:first-child{text-align:left}.reached{color:#b3261e}.open{color:#2e7d32}
svg{width:100%;height:auto;background:#f7f8fa;border-radius:6px}rect{fill:#3d6fd8}
text{font-size:11px;fill:#5a6275}form{margin:1rem 0}input{font:inherit}
.bar{height:10px;background:#e3e6ec;border-radius:5px;overflow:hidden}
.bar>div{height:100%;background:#3d6fd8}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def chart(rows: list[DailyUsage], first: date, last: date) -> str:
    """An SVG bar chart of the daily usage over [first, last] (a bar per day, 0 where the
    system of record has no row)."""
    by_day = {r.day: r.usage for r in rows}
    days = (last - first).days + 1
    top = max(by_day.values(), default=0) or 1
    step = (CHART_W - 40) / days  # the plot starts right of the axis labels
    bars = []
    for i in range(days):
        d = first + timedelta(days=i)
        used = by_day.get(d, 0)
        if not used:
            continue
        h = (CHART_H - 30) * used / top
        bars.append(
            f'<rect x="{40 + i * step:.2f}" y="{CHART_H - 20 - h:.2f}" '
            f'width="{max(step * 0.8, 0.5):.2f}" height="{h:.2f}" data-date="{d}" '
            f'data-usage="{used}"><title>{d}: {used}</title></rect>'
        )
    return (
        f'<svg id="chart" viewBox="0 0 {CHART_W} {CHART_H}" role="img" '
        f'aria-label="Requests per day from {first} to {last}">'
        f'<text x="2" y="14">{top}</text><text x="2" y="{CHART_H - 22}">0</text>'
        f'<text x="40" y="{CHART_H - 4}">{first}</text>'
        f'<text x="{CHART_W - 70}" y="{CHART_H - 4}">{last}</text>' + "".join(bars) + "</svg>"
    )


def _thresholds(title: str, slug: str, used: float, limit: int, pcts: tuple[int, ...]) -> str:
    rows = []
    for pct, mark in marks(pcts, limit):
        state = "reached" if used >= mark else "open"
        rows.append(
            f'<tr data-meter="{_e(slug)}" data-threshold="{pct}"><td>{pct} %</td>'
            f'<td class="mark">{mark}</td><td class="{state}">{state}</td></tr>'
        )
    share = min(used / limit, 1.0) if limit else 1.0
    return (
        f'<h3>{_e(title)}</h3><div class="bar"><div style="width:{share * 100:.1f}%"></div></div>'
        f'<p><span class="meter-used" data-meter="{_e(slug)}">{_e(plain(used))}</span> of '
        f'<span class="meter-limit">{limit}</span></p>'
        "<table><tr><th>threshold</th><th>at</th><th>state</th></tr>" + "".join(rows) + "</table>"
    )


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>{body}</body></html>"
    )


class UsagePage:
    """`GET|HEAD {base}/account/usage`: the page (see the module docstring)."""

    def __init__(self, store: UsageStore, metering: Metering, daily: DailyTable) -> None:
        self.store = store
        self.metering = metering
        self.daily = daily

    def _finish(self, resp: falcon.asgi.Response, status: int, document: str) -> None:
        resp.status = falcon.code_to_http_status(status)
        resp.content_type = HTML
        resp.text = document
        resp.cache_control = ["no-store"]
        resp.set_header("Content-Security-Policy", CSP)
        resp.set_header("X-Content-Type-Options", "nosniff")
        resp.set_header("Referrer-Policy", "no-referrer")

    def _error(self, resp: falcon.asgi.Response, status: int, message: str) -> None:
        self._finish(resp, status, _page("Usage", f'<h1>Usage</h1><p id="error">{_e(message)}</p>'))

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """Sign in from a link, or render the page for the token's account."""
        link_token = req.get_param("token")
        if link_token is not None:
            query = urlencode([(k, v) for k, v in req.params.items() if k != "token"], True)
            resp.set_cookie(
                COOKIE, link_token, path=req.path, secure=req.scheme == "https",
                http_only=True, same_site="Strict",
            )  # fmt: skip
            resp.status = falcon.HTTP_303
            resp.location = req.path + (f"?{query}" if query else "")
            resp.cache_control = ["no-store"]
            resp.set_header("Referrer-Policy", "no-referrer")
            return
        token = bearer_token(req.get_header("Authorization")) or req.cookies.get(COOKIE)
        try:
            account = await self.store.authenticate(token) if token else None
            if account is None:
                self._error(resp, 401, "Sign in with your account's token (a sign-in link).")
                return
            first, last = self.range(req)
            document = await self.render(account, first, last)
        except BadRequest as bad:
            self._error(resp, 400, bad.message)
            return
        except AccessDenied as denied:
            self._error(resp, denied.status, denied.message)
            return
        except StoreUnavailable:
            resp.set_header("Retry-After", str(self.store.settings.retry_after_seconds))
            self._error(resp, 503, "Usage is unavailable right now; retry shortly.")
            return
        self._finish(resp, 200, document)

    async def on_head(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """GET's status and headers."""
        await self.on_get(req, resp)

    def range(self, req: falcon.asgi.Request) -> tuple[date, date]:
        """The chart's days, as the history endpoint takes them."""
        unknown = sorted(set(req.params) - {"from", "to"})
        if unknown:
            raise BadRequest(f"Unknown query parameter {unknown[0]!r}; supported: from, to.")
        last = day_param(req, "to") or utc_date(self.store.clock())
        try:
            first, last = day_range(day_param(req, "from"), last)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if (last - first).days + 1 > MAX_HISTORY_DAYS:
            raise BadRequest(f"At most {MAX_HISTORY_DAYS} days.")
        return first, last

    async def render(self, account: Account, first: date, last: date) -> str:
        """The page of `account` with the chart over [first, last]."""
        now = self.store.clock()
        window, used = await self.store.usage(account, now)
        limit = self.store.plans[account.plan].limit
        rows = await self.daily.series(account.id, first, last)
        total = sum(r.usage for r in rows)
        sections = [_thresholds("Requests (the plan's quota)", "requests", used, limit,
                                account.thresholds)]  # fmt: skip
        for meter in self.metering.meters.values():
            meter_limit = meter.limit(account.plan)
            if meter.builtin or meter_limit is None:
                continue
            value = await self.metering.total(
                account, meter, window.start * 1000, int(now * 1000) + 1
            )
            title = f"{meter.description or meter.slug} ({meter.slug})"
            sections.append(_thresholds(title, meter.slug, value, meter_limit, account.thresholds))
        start, end = utc_datetime(window.start), utc_datetime(window.end)
        period = f"{start:%Y-%m-%d %H:%MZ} – {end:%Y-%m-%d %H:%MZ}"
        body = (
            f'<h1>Usage of <span id="account">{_e(account.id)}</span></h1>'
            "<dl>"
            f'<dt>Plan</dt><dd id="plan-name">{_e(account.plan)}</dd>'
            f'<dt>Quota per window</dt><dd id="plan-limit">{limit}</dd>'
            f'<dt>Used this window</dt><dd id="current-usage">{used}</dd>'
            f'<dt>Remaining</dt><dd id="remaining-usage">{max(limit - used, 0)}</dd>'
            f'<dt>Window</dt><dd id="usage-window">{_e(account.window)}: {period}</dd>'
            "</dl>"
            "<h2>Requests per day</h2>"
            '<form method="get"><label>From <input type="date" name="from" '
            f'value="{first}"></label> <label>to <input type="date" name="to" value="{last}">'
            "</label> <button>Show</button></form>"
            f'<p>{first} – {last}: <span id="range-total">{total}</span> requests</p>'
            + chart(rows, first, last)
            + "<h2>Thresholds</h2>"
            + "".join(sections)
        )
        return _page(f"Usage of {account.id}", body)
