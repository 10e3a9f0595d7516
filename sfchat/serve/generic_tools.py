"""Tool calls for a model whose chat template shows it no tools (or teaches a call form other than <tool_call>):
the generic format, as llama-server's "Generic" handler does it.

The tools, with their JSON schemas, are described in a system message every template can render, and the answer
is held by a grammar (peers/speculation/grammar.py) to one JSON object:
    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}       a call
    {"tool_calls": [{"name": ..., "arguments": ...}, ...]}                       calls, with parallel_tool_calls
    {"response": "It is sunny."}                                                 a reply (tool_choice auto only)
A call's arguments follow its function's schema. Calls and results of earlier turns go back as the template takes
any message: the assistant's calls as the JSON it wrote, a result as a user message "NAME answered: RESULT" (in words,
not JSON: a small model shown JSON there copies its keys rather than reply).
"""
from __future__ import annotations

import json
import uuid

from .tools import Tools

RESPONSE = "response"


def _key(tools: Tools) -> str:
    return "tool_calls" if tools.parallel else "tool_call"


def _call_form(tools: Tools) -> str:
    one = '{"name": <the tool\'s name>, "arguments": <an object following its parameters>}'
    return f'{{"tool_calls": [{one}, ...]}}' if tools.parallel else f'{{"tool_call": {one}}}'


def instructions(tools: Tools) -> str:
    """The system message that shows the model its tools and the form of its answer."""
    listed = "\n".join(json.dumps(f, ensure_ascii=False) for f in tools.functions)
    if tools.choice == "auto":
        how = (f"Answer in JSON, either with {_call_form(tools)} to call a tool, "
               f'or with {{"response": <your reply to the user>}}.\nOnce a tool has answered, reply to the user '
               'with {"response": ...}, using what it said.')  # (else a small model calls again)
    else:
        which = "a tool" if tools.choice == "required" else f"the tool {tools.choice}"
        how = f"Answer by calling {which}, in JSON: {_call_form(tools)}."
    return f"You can call these tools (each with the JSON schema of its arguments):\n{listed}\n\n{how}"


def schema(tools: Tools) -> dict:
    """The JSON schema of an answer (what the grammar holds it to)."""
    called = [f for f in tools.functions if tools.choice in ("auto", "required", f["name"])]
    each = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                              "arguments": f.get("parameters") or {"type": "object"}},
             "required": ["name", "arguments"], "additionalProperties": False} for f in called]
    call = each[0] if len(each) == 1 else {"anyOf": each}
    value = {"type": "array", "items": call, "minItems": 1} if tools.parallel else call
    calls = {"type": "object", "properties": {_key(tools): value}, "required": [_key(tools)],
             "additionalProperties": False}
    if tools.choice != "auto":
        return calls
    reply = {"type": "object", "properties": {RESPONSE: {"type": "string"}}, "required": [RESPONSE],
             "additionalProperties": False}
    return {"anyOf": [calls, reply]}


def messages(messages: list[dict], tools: Tools) -> list[dict]:
    """The request's messages as any template takes them, the tools' system message first (merged into the
    request's own system message, if it starts with one)."""
    names = {}  # call id -> function name, for the results that answer them
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}
                     for c in m["tool_calls"]]
            names |= {c["id"]: c["function"]["name"] for c in m["tool_calls"]}
            said = {"tool_calls": calls} if len(calls) > 1 else {"tool_call": calls[0]}
            m = {"role": "assistant", "content": json.dumps(said, ensure_ascii=False)}
        elif m["role"] == "tool":
            name = names.get(m.get("tool_call_id", "")) or "the tool"
            m = {"role": "user", "content": f"{name} answered: {m['content']}"}
        out.append(m)
    system = instructions(tools)
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + system}] + out[1:]
    return [{"role": "system", "content": system}] + out


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def read(text: str) -> tuple[str, list[dict]] | None:
    """An answer in the generic format: (the reply's text, the calls in OpenAI's shape); None if it is not one (cut
    short by max_tokens, say: the text is then the answer)."""
    try:
        answer = json.loads(text)
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    if isinstance(answer.get(RESPONSE), str):
        return answer[RESPONSE], []
    calls = answer.get("tool_calls", [answer["tool_call"]] if "tool_call" in answer else None)
    if not isinstance(calls, list) or not calls or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments", {}), dict)
            for c in calls):
        return None
    return "", [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}), ensure_ascii=False)}}
                for c in calls]
