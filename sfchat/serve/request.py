"""A chat completion request body, checked field by field into a typed request (anything odd is a 400)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from . import tools as tool_calls
from .errors import ApiError
from .unsupported import refuse_unsupported

ROLES = {"system", "user", "assistant", "developer", "tool"}  # developer: OpenAI's newer name for system
MAX_STOPS = 4
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict]  # {"role", "content": str}, developer turned into system
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"  # the name the request gave it (max_completion_tokens, its newer name)
    temperature: float | None = None  # None: the server's --temperature (the model's default), not OpenAI's 1
    top_p: float | None = None  # None: the server's --top-p
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int | None = None  # None: no logprobs; n (0..20): each token's and the n likeliest there
    json_schema: dict | None = None  # response_format: the schema the answer's JSON follows (None: free text)
    tools: tool_calls.Tools | None = None  # the functions the model may call, and tool_choice
    cache_prompt: bool = True  # False: computed from scratch, no warm row's prefix reused (llama-server's field)


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def _number(body: dict, key: str, lo: float, hi: float, default: float | None) -> float | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise bad(f"'{key}' must be a number from {lo:g} to {hi:g}", key)
    return float(v)


def _int(body: dict, key: str, lo: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise bad(f"'{key}' must be an integer >= {lo}", key)
    return v


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if c is None and m.get("role") == "assistant":
        return ""
    if isinstance(c, list):
        parts = []
        for p in c:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise bad(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
            parts.append(p["text"])
        return "\n".join(parts)
    raise bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def _messages(body: dict) -> list[dict]:
    ms = body.get("messages")
    if not isinstance(ms, list) or not ms:
        raise bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(ms):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad(f"messages[{i}] needs a role of {', '.join(sorted(ROLES))}", f"messages[{i}].role")
        role = "system" if m["role"] == "developer" else m["role"]
        one = {"role": role, "content": _content(m, i)}
        if role == "tool":  # a call's result, fed back
            one["tool_call_id"] = m.get("tool_call_id") if isinstance(m.get("tool_call_id"), str) else ""
        if role == "assistant" and m.get("tool_calls"):
            one["tool_calls"] = _calls(m["tool_calls"], i)
        out.append(one)
    return out


def _calls(calls, i: int) -> list[dict]:
    """An assistant message's tool_calls, as OpenAI sends them back: arguments a JSON string."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise bad(f"{where} must be a list", where)
    out = []
    for c in calls:
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments"), str):
            raise bad(f"{where}: each call needs a function with a name and arguments (a JSON string)", where)
        out.append({"id": str(c.get("id", "")), "type": "function",
                    "function": {"name": f["name"], "arguments": f["arguments"]}})
    return out


def _stop(body: dict) -> tuple[str, ...]:
    s = body.get("stop")
    if s is None:
        return ()
    stops = [s] if isinstance(s, str) else s
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(x, str) and x for x in stops):
        raise bad(f"'stop' must be a non-empty string or a list of at most {MAX_STOPS} of them", "stop")
    return tuple(stops)


def _logprobs(body: dict) -> int | None:
    """`logprobs` (a boolean) and `top_logprobs` (0 to 20, only with logprobs: true), as OpenAI checks them."""
    on, top = body.get("logprobs"), body.get("top_logprobs")
    if on is not None and not isinstance(on, bool):
        raise bad("'logprobs' must be a boolean", "logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad(f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
        if not on:
            raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if on else None


def _response_format(body: dict) -> dict | None:
    """`response_format`: text (None), json_object (any JSON object) or json_schema (its `schema`)."""
    rf = body.get("response_format")
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise bad("'response_format' must be an object with a type of text, json_object or json_schema",
                  "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise bad("'response_format.json_schema' must be an object with a 'name' and a 'schema'",
                  "response_format.json_schema")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise bad("'response_format.json_schema.schema' must be a JSON schema (an object)",
                  "response_format.json_schema.schema")
    return schema


def json_body(raw: bytes) -> dict:
    """A request's body: a JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    return body


def parse(raw: bytes) -> ChatRequest:
    body = json_body(raw)
    return parse_fields(body, _messages(body))


def parse_fields(body: dict, messages: list[dict]) -> ChatRequest:
    """All but the messages (the legacy completions' prompt is no list of messages)."""
    if not isinstance(body.get("model"), str):
        raise bad("'model' must be a string", "model")
    refuse_unsupported(body)
    stream = body.get("stream") or False
    options = body.get("stream_options") or {}
    if not isinstance(stream, bool) or not isinstance(options, dict):
        raise bad("'stream' must be a boolean and 'stream_options' an object", "stream")
    if options and not stream:
        raise bad("'stream_options' is only allowed with stream: true", "stream_options")
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, param, 1)
    seed = _int(body, "seed", -(2**63))
    top_logprobs = _logprobs(body)
    if not isinstance(cache_prompt := body.get("cache_prompt", True), bool):
        raise bad("'cache_prompt' must be a boolean", "cache_prompt")
    return ChatRequest(model=body["model"], messages=messages, stream=stream,
                       include_usage=bool(options.get("include_usage")), max_tokens=max_tokens, max_tokens_param=param,
                       temperature=_number(body, "temperature", 0, 2, None), top_p=_number(body, "top_p", 0, 1, None),
                       seed=None if seed is None else seed % 2**31, stop=_stop(body), top_logprobs=top_logprobs,
                       json_schema=_response_format(body), tools=tool_calls.parse(body), cache_prompt=cache_prompt)
