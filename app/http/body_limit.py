"""A limit on request bodies, for REST and GraphQL alike (a pure ASGI middleware).

It acts where a body is read: `receive` raises BodyTooLarge instead of handing over a
byte of a body whose declared `Content-Length` is over the limit, and for a chunked body
as soon as the bytes received pass it, so no more than the limit is ever buffered. Each
endpoint answers it in its own error shape (REST's, or GraphQL's in schema/view.py),
HTTP 413 with RESOURCE_EXHAUSTED (docs/decisions/0001-readings-of-the-spec.md). Since a
body is read only after the caller is authenticated, a caller without a valid token is
told so first and nothing is read.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.asgi_headers import header
from app.errors import ResourceExhausted


class BodyTooLarge(ResourceExhausted):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            f"the request body is over the limit of {max_bytes} bytes",
            limit="body",
            maxBytes=max_bytes,
        )


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = header(scope, b"content-length") or ""
        over = declared.isdigit() and int(declared) > self.max_bytes
        received = 0

        async def limited() -> Message:
            nonlocal received
            if over:
                raise BodyTooLarge(self.max_bytes)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited, send)
