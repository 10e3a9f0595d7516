"""One chat completion as an ASGI response: the answer is generated in a task of its own while this one sends
what it makes (as server-sent events, or one JSON object at the end) and another watches the connection; a
client that goes away cancels the generation at once."""
from __future__ import annotations

import json
import math
import time
import uuid

import trio

from .access import TOKENS
from .conversations import Conversations, Job
from .errors import ApiError
from .sse import HEADERS, KEEP_ALIVE, Stream


class CompletionResponse:
    def __init__(self, conversations: Conversations, job: Job, model: str, keepalive_s: float,
                 shape: type[Stream] = Stream, prefix: str = "chatcmpl-", metrics=None):
        """shape: the chunks' and the whole answer's form (sfchat/serve/legacy.py's for /v1/completions);
        metrics: where the answer's figures are counted (sfchat/serve/metrics.py), if anywhere."""
        self.conv, self.job, self.keepalive_s, self.metrics = conversations, job, keepalive_s, metrics
        self.stream = shape(prefix + uuid.uuid4().hex, int(time.time()), model, job.request.include_usage)

    async def __call__(self, scope, receive, send) -> None:
        self.scope = scope  # the access log's line takes the answer's tokens from it
        items_in, self.items = trio.open_memory_channel(math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch, receive, nursery.cancel_scope)
            nursery.start_soon(self._produce, items_in)
            if self.job.request.stream:
                await self._send_events(send)
            else:
                await self._send_whole(send)
            nursery.cancel_scope.cancel()

    async def _watch(self, receive, scope: trio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async def _produce(self, items: trio.MemorySendChannel) -> None:
        try:
            outcome = await self.conv.run(self.job, lambda text, lps: items.send_nowait(("text", (text, lps))))
        except ApiError as e:
            items.send_nowait(("error", e))
        else:
            self.scope[TOKENS] = outcome.completion_tokens
            if self.metrics is not None:
                self.metrics.answered(self.job, outcome, self.job.first_token, time.monotonic())
            items.send_nowait(("done", outcome))

    def usage(self, outcome) -> dict:
        n, m = len(self.job.prompt), outcome.completion_tokens
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m,
                "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens}}

    async def _send_events(self, send) -> None:
        s = self.stream
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]
                    + [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]})
        if first := s.role():
            await send({"type": "http.response.body", "body": first, "more_body": True})
        while True:
            with trio.move_on_after(self.keepalive_s) as waited:
                kind, value = await self.items.receive()
            if waited.cancelled_caught:  # waiting for admission, or a long prefill
                await send({"type": "http.response.body", "body": KEEP_ALIVE, "more_body": True})
                continue
            if kind == "text":
                body = s.content(*value)
            elif kind == "done":
                body = s.finish(value.finish, value.stats, value.tool_calls)
                if s.include_usage:
                    body += s.usage(self.usage(value))
                body += s.done
            else:
                body = s.error(value.body())
            await send({"type": "http.response.body", "body": body, "more_body": kind == "text"})
            if kind != "text":
                return

    async def _send_whole(self, send) -> None:
        parts, lps = [], None
        while True:
            kind, value = await self.items.receive()
            if kind == "text":
                parts.append(value[0])
                if value[1] is not None:
                    lps = (lps or []) + value[1]
                continue
            if kind == "done":
                status, body = 200, self.stream.whole("".join(parts), value.finish,
                                                      self.usage(value), value.stats, lps,
                                                      value.tool_calls)
            else:
                status, body = value.status, value.body()
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps(body, ensure_ascii=False).encode()})
            return
