"""One log line per request, as any HTTP server writes: the client, method and path, status, the answer's tokens
and the time it took (a streamed answer's: until its last event)."""
from __future__ import annotations

import logging
import time

log = logging.getLogger("sfchat.serve.access")
TOKENS = "sfchat.completion_tokens"  # what a completion puts in its request's scope for this line


class AccessLog:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [0]

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            client = scope.get("client")
            who = f"{client[0]}:{client[1]}" if client else "-"
            tokens = f" {scope[TOKENS]} tokens" if TOKENS in scope else ""
            log.info('%s "%s %s" %s%s %.2f s', who, scope["method"], scope["path"], status[0] or "-", tokens,
                     time.perf_counter() - t0)
