"""OpenAI's Responses API (`POST /v1/responses`), as much as the openai-agents SDK and tools built on it use: `input`
as text or items (messages, function calls and their outputs), `instructions`, function tools, `tool_choice`,
`parallel_tool_calls`, `max_output_tokens`, temperature/top_p/seed, `text.format` (JSON), usage; whole, or
streamed as its typed events.

A request becomes a chat request (sfchat/serve/request.py checks it as it checks chat completions) and is answered
by the same machinery; only the shapes differ. Nothing is stored: `previous_response_id` and the like are a 400
that says to send the whole conversation in `input`.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace

from .errors import ApiError
from .request import ChatRequest, bad, json_body, parse_fields, _messages

# parameter -> why it is refused; a value in NEUTRAL[parameter] (or None) passes
UNSUPPORTED = {
    "previous_response_id": "responses are not stored here: send the whole conversation in 'input'",
    "conversation": "conversations are not stored here: send the whole conversation in 'input'",
    "store": "responses are not stored here",
    "background": "background responses are not supported",
    "include": "no extra output can be included",
    "reasoning": "this model has no reasoning to configure",
    "prompt": "stored prompt templates are not supported",
    "truncation": "only truncation 'disabled' is supported: a conversation too long is a 400",
    "max_tool_calls": "max_tool_calls is not supported",
    "top_logprobs": "logprobs are served on /v1/chat/completions only",
    "metadata": "stored responses' metadata is not supported",
    "service_tier": "service tiers are not supported",
    "stream_options": "stream_options are not supported here",
}
NEUTRAL = {"store": (False,), "background": (False,), "include": ([],), "truncation": ("disabled",),
           "metadata": ({},), "service_tier": ("auto", "default"), "top_logprobs": (0,)}
TEXT_PARTS = ("input_text", "output_text", "text")


def parse_responses(raw: bytes) -> ChatRequest:
    body = json_body(raw)
    for key, why in UNSUPPORTED.items():
        if (v := body.get(key)) is not None and v not in NEUTRAL.get(key, ()):
            raise ApiError(400, f"'{key}': {why}", param=key, code="unsupported_parameter")
    messages = _input(body)
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    elif body.get("instructions") is not None and not isinstance(body.get("instructions"), str):
        raise bad("'instructions' must be a string", "instructions")
    chat = {"model": body.get("model"), "stream": body.get("stream"), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "seed": body.get("seed"), "max_tokens": body.get("max_output_tokens"),
            "parallel_tool_calls": body.get("parallel_tool_calls"), "tools": _tools(body.get("tools")),
            "tool_choice": _tool_choice(body.get("tool_choice")), "response_format": _format(body.get("text"))}
    if chat["max_tokens"] is not None and (isinstance(chat["max_tokens"], bool)
                                           or not isinstance(chat["max_tokens"], int) or chat["max_tokens"] < 1):
        raise bad("'max_output_tokens' must be an integer >= 1", "max_output_tokens")
    req = parse_fields({k: v for k, v in chat.items() if v is not None}, _messages({"messages": messages}))
    return replace(req, max_tokens_param="max_output_tokens")


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in TEXT_PARTS
                                         and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    raise bad(f"{where}: only text is supported (a string, or input_text/output_text parts)", where)


def _input(body: dict) -> list[dict]:
    """`input` as chat messages: a function_call item joins the assistant message before it (or one of its own),
    a function_call_output is a tool message."""
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad("'input' must be a string or a non-empty list of items", "input")
    out: list[dict] = []
    for i, it in enumerate(items):
        where = f"input[{i}]"
        kind = it.get("type", "message") if isinstance(it, dict) else None
        if kind == "message" and isinstance(it, dict) and "role" in it:
            out.append({"role": it["role"], "content": _text(it.get("content"), f"{where}.content")})
        elif kind == "function_call":
            if not all(isinstance(it.get(k), str) for k in ("call_id", "name", "arguments")):
                raise bad(f"{where}: a function_call needs call_id, name and arguments (strings)", where)
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(it.get("call_id"), str):
                raise bad(f"{where}: a function_call_output needs its call_id", where)
            out.append({"role": "tool", "tool_call_id": it["call_id"], "content": _text(it.get("output"),
                                                                                         f"{where}.output")})
        else:
            raise bad(f"{where}: items of type {kind!r} are not supported (message, function_call, "
                      "function_call_output are)", where)
    return out


def _tools(tools) -> list | None:
    """Responses' function tools ({"type": "function", "name", ...}) in chat completions' shape."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad("'tools' must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else t
            raise bad(f"tools[{i}]: only function tools are supported, not {kind!r}", f"tools[{i}]")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                     if k in t and t[k] is not None}})
    return out


def _tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(text) -> dict | None:
    """`text.format` as chat's response_format (the schema's fields sit in the format itself here)."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise bad("'text' must be an object with a 'format'", "text")
    if fmt is None or not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


@dataclass
class ResponseStream:
    """One response, whole or as events (the face of sse.Stream that completion.py drives)."""

    id: str
    created: int
    model: str
    include_usage: bool = True  # (the usage goes in response.completed, always)
    request: ChatRequest | None = None
    done: bytes = b""  # the Responses API ends with response.completed, not [DONE]
    seq: int = 0
    text: str = ""
    item: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex)
    finished: tuple = ()

    def __post_init__(self):
        self.include_usage = True  # whatever the caller says: response.completed carries it

    def event(self, kind: str, **fields) -> bytes:
        self.seq += 1
        data = {"type": kind, "sequence_number": self.seq - 1} | fields
        return f"event: {kind}\n".encode() + b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"

    def role(self) -> bytes:
        r = self.response("in_progress", [], None)
        return self.event("response.created", response=r) + self.event("response.in_progress", response=r)

    def _where(self) -> dict:
        return {"item_id": self.item, "output_index": 0, "content_index": 0}

    def content(self, text: str, logprobs=None) -> bytes:
        head = b""
        if not self.text:  # the message's item opens with its first text
            head = self.event("response.output_item.added", output_index=0, item=self._message("in_progress", "")) \
                + self.event("response.content_part.added", part=_part(""), **self._where())
        self.text += text
        return head + self.event("response.output_text.delta", delta=text, logprobs=[], **self._where())

    def finish(self, reason: str, stats: dict, tool_calls: list[dict] | None = None) -> bytes:
        out, index = b"", 0
        if self.text:
            out += self.event("response.output_text.done", text=self.text, logprobs=[], **self._where()) \
                + self.event("response.content_part.done", part=_part(self.text), **self._where()) \
                + self.event("response.output_item.done", output_index=0, item=self._message("completed", self.text))
            index = 1
        for i, c in enumerate(_calls(tool_calls), index):
            where = {"item_id": c["id"], "output_index": i}
            out += self.event("response.output_item.added", output_index=i, item=c | {"arguments": "",
                                                                                       "status": "in_progress"}) \
                + self.event("response.function_call_arguments.delta", delta=c["arguments"], **where) \
                + self.event("response.function_call_arguments.done", arguments=c["arguments"], name=c["name"],
                             **where) \
                + self.event("response.output_item.done", output_index=i, item=c)
        self.finished = (reason, stats, tool_calls)
        return out

    def usage(self, usage: dict) -> bytes:
        reason, stats, calls = self.finished
        r = self.whole(self.text, reason, usage, stats, None, calls)
        return self.event("response.incomplete" if r["status"] == "incomplete" else "response.completed", response=r)

    def error(self, body: dict) -> bytes:
        e = body["error"]
        return self.event("error", code=e.get("code"), message=e["message"], param=e.get("param"))

    def whole(self, text: str, reason: str, usage: dict, stats: dict, logprobs=None,
              tool_calls: list[dict] | None = None) -> dict:
        output = ([self._message("completed", text)] if text or not tool_calls else []) + _calls(tool_calls)
        u = {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": usage["total_tokens"]}
        return self.response("incomplete" if reason == "length" else "completed", output, u) | {"sfchat": stats}

    def _message(self, status: str, text: str) -> dict:
        return {"type": "message", "id": self.item, "status": status, "role": "assistant",
                "content": [_part(text)] if text or status == "completed" else []}

    def response(self, status: str, output: list, usage: dict | None) -> dict:
        req = self.request
        tools = req.tools
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": None, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": None, "max_output_tokens": req.max_tokens, "model": self.model, "output": output,
                "parallel_tool_calls": bool(tools and tools.parallel), "previous_response_id": None,
                "reasoning": None, "store": False, "temperature": req.temperature, "top_p": req.top_p,
                "text": {"format": {"type": "text"} if req.json_schema is None else
                         {"type": "json_schema", "name": "answer", "schema": req.json_schema}},
                "tool_choice": _choice(tools), "tools": [{"type": "function", "strict": False, **f}
                                                         for f in (tools.functions if tools else ())],
                "truncation": "disabled", "metadata": {}, "usage": usage}


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _calls(tool_calls: list[dict] | None) -> list[dict]:
    """Chat's tool_calls as Responses' function_call items."""
    return [{"type": "function_call", "id": "fc_" + c["id"].removeprefix("call_"), "call_id": c["id"],
             "name": c["function"]["name"], "arguments": c["function"]["arguments"], "status": "completed"}
            for c in tool_calls or ()]


def _choice(tools) -> object:
    if tools is None or tools.choice in ("auto", "none", "required"):
        return tools.choice if tools else "auto"
    return {"type": "function", "name": tools.choice}
