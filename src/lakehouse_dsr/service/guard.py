"""The service's outer wall, in front of the application (plain ASGI, so nothing inside can answer
first): a per-client rate limit, a body size limit, the headers every response carries, and the
timing of every answer, its own refusals included (for `/metrics`)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

# Called once per HTTP answer with the request's scope, the status sent and the seconds it took.
Observer = Callable[[dict[str, Any], int, float], None]

# Pages load only what the service itself serves; nothing may frame them or guess content types.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                                 b"base-uri 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class RateLimit:
    """A token bucket per client address: `per_minute` requests in a burst, refilled evenly over a
    minute. Memory: one small entry per address seen in the last minute. A subclass whose `wait` does
    I/O (the shared one of a PostgreSQL queue) says `blocking`: the Guard calls it in a thread."""

    blocking = False

    def __init__(self, per_minute: int):
        self.capacity, self.rate = float(per_minute), per_minute / 60.0
        self._buckets: dict[str, tuple[float, float]] = {}

    def wait(self, client: str, now: float | None = None) -> float:
        """0 if `client` may go on (one token is taken), else the seconds until it may."""
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.get(client, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - last) * self.rate)
        if tokens < 1:
            self._buckets[client] = (tokens, now)
            return (1 - tokens) / self.rate
        self._buckets[client] = (tokens - 1, now)
        if len(self._buckets) > 100_000:  # forget addresses whose bucket is full again
            self._buckets = {c: (t, s) for c, (t, s) in self._buckets.items() if now - s < 60}
        return 0.0


class Guard:
    """Wraps the application: 429 over the rate limit (API calls only), 413 for a body over
    `max_body_bytes` (declared or streamed), security headers on every response; `observe` (if given)
    hears of every answer. `limit`: the rate limit to apply (default: this process's own bucket of
    `rate_limit_per_minute`; none when that is 0)."""

    def __init__(self, app, max_body_bytes: int, rate_limit_per_minute: int, observe: Observer | None = None,
                 limit: RateLimit | None = None):
        self.app, self.max_body, self.observe = app, max_body_bytes, observe
        self.limit = (limit or RateLimit(rate_limit_per_minute)) if rate_limit_per_minute else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.observe is None:
            return await self._guarded(scope, receive, send)
        started, status = time.perf_counter(), 500  # 500: an answer never started is a failure

        async def timed_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, timed_send)
        finally:
            self.observe(scope, status, time.perf_counter() - started)

    async def _guarded(self, scope, receive, send):
        if self.limit and scope["path"].startswith("/api/"):
            client = scope["client"][0] if scope.get("client") else ""
            wait = await asyncio.to_thread(self.limit.wait, client) if self.limit.blocking else self.limit.wait(client)
            if wait:
                seconds = math.ceil(wait)
                return await _answer(send, 429, f"too many requests from this address; try again in {seconds} s",
                                     [(b"retry-after", str(seconds).encode())])
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            return await _answer(send, 413, f"the request body is larger than {self.max_body} bytes")
        received, too_large, started = 0, False, False

        async def limited_receive():
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    too_large = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            if too_large:  # whatever the application makes of a body it never got whole is not sent
                return
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            # Starlette re-raises what it already answered with a 500: that answer stands, the
            # connection stays usable, and the error was logged by the application's handler.
            if not (too_large or started):
                raise
        if too_large:
            await _answer(send, 413, f"the request body is larger than {self.max_body} bytes")


async def _answer(send, status: int, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers,
        *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})
