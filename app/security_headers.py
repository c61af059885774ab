"""Headers every HTTP answer carries, so no answer can be sniffed, framed or run as a page.

`X-Content-Type-Options: nosniff` (a JSON answer is never read as a script or HTML),
`X-Frame-Options: DENY` and `Referrer-Policy: no-referrer`; a `Content-Security-Policy`
of `default-src 'none'; frame-ancestors 'none'` unless the response set its own: the two
pages this service serves (the console, app/server.py; GraphiQL, schema/graphiql.py) set
theirs, each allowing only what the page loads from this service. An answer that is not a
page (JSON, assets) thus loads and runs nothing if a browser is made to open it.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.asgi_headers import add_missing, encoded

# What a page may not do whatever it loads: be framed (clickjacking), change its base URL,
# or post a form anywhere else.
PAGE_BASE = "base-uri 'none'; frame-ancestors 'none'"
NOTHING = f"default-src 'none'; {PAGE_BASE}; form-action 'none'"

DEFAULTS = (
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("content-security-policy", NOTHING),
)
_RAW_DEFAULTS = encoded(DEFAULTS)


class SecurityHeaders:
    """ASGI middleware: the defaults above on each HTTP response that lacks them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                add_missing(message, _RAW_DEFAULTS)
            await send(message)

        await self.app(scope, receive, send_with_headers)
