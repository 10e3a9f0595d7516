"""The legacy `/v1/completions` (prompt in, text out), still what many tools speak: the prompt is the model's raw
text (no chat template), the answer comes whole or streamed as `text_completion` objects, with usage.

It shares everything else with chat completions: the checks, admission, stops, the 400s for what is not done."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .request import ChatRequest, bad, json_body, parse_fields
from .sse import Stream, event

DEFAULT_MAX_TOKENS = 16  # OpenAI's for this endpoint (chat completions have none)


def parse_legacy(raw: bytes) -> tuple[ChatRequest, str]:
    """The request, and its prompt: a string (or a list holding one string)."""
    body = json_body(raw)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("'prompt' must be a string (one prompt per request; token lists are not supported)", "prompt")
    if body.get("logprobs") is not None:  # the legacy form (an int): only chat completions will have logprobs
        raise bad("'logprobs' is not supported on /v1/completions", "logprobs")
    for key in ("tools", "tool_choice"):
        if body.get(key) is not None:
            raise bad(f"'{key}' is only served on /v1/chat/completions", key)
    req = parse_fields(body, messages=[])
    if req.max_tokens is None:
        req = replace(req, max_tokens=DEFAULT_MAX_TOKENS)
    return req, prompt


@dataclass(frozen=True)
class TextStream(Stream):
    """A stream of `text_completion` chunks: no role chunk, the text in choices[0].text."""

    def chunk(self, text: str, finish_reason: str | None = None, **extra) -> bytes:
        c = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
             "system_fingerprint": None, "choices": [{"index": 0, "text": text, "logprobs": None,
                                                     "finish_reason": finish_reason}]}
        if self.include_usage:
            c["usage"] = None
        return event(c | extra)

    def role(self) -> bytes:
        return b""

    def content(self, text: str, logprobs: list | None = None) -> bytes:  # (refused here: always None)
        return self.chunk(text)

    def finish(self, reason: str, stats: dict, tool_calls: list[dict] | None = None) -> bytes:  # (no tools here)
        return self.chunk("", reason, sfchat=stats)

    def usage(self, usage: dict) -> bytes:
        return event({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                      "system_fingerprint": None, "choices": [], "usage": usage})

    def whole(self, text: str, reason: str, usage: dict, stats: dict, logprobs: list | None = None,
              tool_calls: list[dict] | None = None) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "system_fingerprint": None,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
                "usage": usage, "sfchat": stats}
