"""OpenAI's response shapes: streamed `chat.completion.chunk` events (server-sent events) and the whole
`chat.completion` object.

A stream is: a first chunk whose delta carries the role, chunks of content, a last chunk with an empty delta and
the finish reason (and our `sfchat` statistics), with include_usage one more chunk with `usage` and no choices,
then `data: [DONE]`. Lines starting with ':' are comments clients skip: our keep-alives.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

KEEP_ALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy may hold events back


def event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


@dataclass(frozen=True)
class Stream:
    """What every chunk of one completion repeats."""

    id: str
    created: int
    model: str
    include_usage: bool = False
    done = DONE  # what ends the stream (a class attribute, not a field)

    def error(self, body: dict) -> bytes:
        """An error mid-stream, as OpenAI sends one."""
        return event(body)

    def chunk(self, delta: dict, finish_reason: str | None = None, logprobs: list | None = None, **extra) -> bytes:
        c = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
             "system_fingerprint": None, "choices": [{"index": 0, "delta": delta, "logprobs": _logprobs(logprobs),
                                                     "finish_reason": finish_reason}]}
        if self.include_usage:
            c["usage"] = None
        return event(c | extra)

    def role(self) -> bytes:
        return self.chunk({"role": "assistant", "content": ""})

    def content(self, text: str, logprobs: list | None = None) -> bytes:
        return self.chunk({"content": text}, logprobs=logprobs)

    def finish(self, reason: str, stats: dict, tool_calls: list[dict] | None = None) -> bytes:
        """The last chunk; before it, the answer's tool calls in one chunk (each whole, with its index)."""
        calls = self.chunk({"tool_calls": [{"index": i} | c for i, c in enumerate(tool_calls)]}) if tool_calls else b""
        return calls + self.chunk({}, reason, sfchat=stats)

    def whole(self, text: str, reason: str, usage: dict, stats: dict, logprobs: list | None = None,
              tool_calls: list[dict] | None = None) -> dict:
        return completion(self, text, reason, usage, stats, logprobs, tool_calls)

    def usage(self, usage: dict) -> bytes:
        return event({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                      "system_fingerprint": None, "choices": [], "usage": usage})


def _logprobs(entries: list | None) -> dict | None:
    """OpenAI's `logprobs` of a choice: None when not asked for, else the entries of its tokens."""
    return None if entries is None else {"content": entries, "refusal": None}


def completion(s: Stream, text: str, reason: str, usage: dict, stats: dict, logprobs: list | None = None,
               tool_calls: list[dict] | None = None) -> dict:
    message = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:  # (content null when the answer is only calls, as OpenAI sends it)
        message |= {"content": text or None, "tool_calls": tool_calls}
    return {"id": s.id, "object": "chat.completion", "created": s.created, "model": s.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": _logprobs(logprobs), "finish_reason": reason}],
            "usage": usage, "sfchat": stats}
