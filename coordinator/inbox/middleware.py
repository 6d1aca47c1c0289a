"""ASGI wrappers around the whole inbox: a cap on request bodies, and the ``Secure`` cookie flag.

Both sit outside authentication and CSRF, so they hold for anonymous requests too: a body over
the cap is refused before anything reads it (by its ``Content-Length``), or as soon as a body
sent without one passes the cap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["MAX_BODY_BYTES", "BodyLimit", "SecureCookies"]

MAX_BODY_BYTES = 1 << 20
"""The largest request body the inbox reads (its forms are a decision, a hint, a login)."""


class _BodyTooLargeError(Exception):
    """A body sent without ``Content-Length`` passed the cap while it was read."""


class BodyLimit:
    """413 for a request body over ``max_body_bytes``, read no further than the cap;
    ``refusal`` makes the answer from what was refused and the cap (the inbox's: plain text)."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int = MAX_BODY_BYTES,
        refusal: Callable[[str, int], Response] | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.refusal = refusal or _plain_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            await self._refusal(f"a body of Content-Length {declared[:20]}")(scope, receive, send)
            return
        received = 0
        started = over = False
        too_large = f"a body of more than {self.max_body_bytes} bytes"

        async def capped_receive() -> Message:
            nonlocal received, over
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                over = True
                raise _BodyTooLargeError
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if over:  # the app turned the refusal into an answer of its own: ours instead
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await self._refusal(too_large)(scope, receive, send)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, capped_receive, tracked_send)
        except _BodyTooLargeError:
            if started:  # nothing reads a body after answering: never seen, but never a 2nd start
                raise
            await self._refusal(too_large)(scope, receive, send)

    def _refusal(self, what: str) -> Response:
        return self.refusal(what, self.max_body_bytes)


def _plain_refusal(what: str, max_body_bytes: int) -> Response:
    return PlainTextResponse(
        f"request refused: {what}; the inbox reads at most {max_body_bytes} bytes "
        "(shorten the hint or the reason)",
        status_code=413,
        headers={"Connection": "close"},
    )


class SecureCookies:
    """Adds ``Secure`` to every cookie the inbox sets: always (``secure`` True), never (False),
    or when the request came over HTTPS (``"auto"``: uvicorn's TLS, or a trusted proxy's
    ``X-Forwarded-Proto``)."""

    def __init__(self, app: ASGIApp, secure: bool | Literal["auto"] = "auto") -> None:
        self.app = app
        self.secure = secure

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        https = scope["type"] == "http" and scope.get("scheme") == "https"
        if self.secure is False or not (self.secure is True or https):
            await self.app(scope, receive, send)
            return

        async def send_secure(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [_secure(name, value) for name, value in message["headers"]]
            await send(message)

        await self.app(scope, receive, send_secure)


def _secure(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    if name.lower() != b"set-cookie" or b"; secure" in value.lower():
        return name, value
    return name, value + b"; Secure"
