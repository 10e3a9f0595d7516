"""Tools: OpenAI's `tools` and `tool_choice`, rendered by the model's own chat template, and the calls the model
writes parsed back into `tool_calls`.

sfchat reads the calls in the form Qwen2.5's and Hermes' templates teach their models:
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
one block per call (the "native" format). A template that shows the model no tools, or teaches it another form,
gets the generic format instead (sfchat/serve/generic_tools.py): tools in a system message, the answer JSON.

tool_choice: "auto" lets the model choose; "none" shows it no tools; "required" and a named function make the
answer a call, by a grammar (peers/speculation/grammar.py) whose arguments follow the function's JSON schema.
parallel_tool_calls (false unless asked, as llama-server: small models do better with one call) lets an answer
hold several calls.
"""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from peers import JSON_STYLE

from .errors import ApiError

log = logging.getLogger("sfchat.serve")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
PROBE = {"type": "function", "function": {"name": "probe", "description": "a probe", "parameters": {"type": "object"}}}


@dataclass(frozen=True)
class Tools:
    functions: tuple[dict, ...]  # each {"name", "description"?, "parameters"?}
    choice: str  # auto, none, required, or the name of the function the answer must call
    parallel: bool = False  # parallel_tool_calls: an answer may hold several calls

    def for_template(self) -> list[dict] | None:
        """The tools as chat templates take them (None: the model is shown none)."""
        return None if self.choice == "none" else [{"type": "function", "function": f} for f in self.functions]

    def lark(self) -> str | None:
        """The grammar of an answer that must be a call (None: the model may answer in text)."""
        if self.choice in ("auto", "none"):
            return None
        called = [f for f in self.functions if self.choice in ("required", f["name"])]
        calls = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                   "arguments": f.get("parameters") or {"type": "object"}},
                  "required": ["name", "arguments"], "additionalProperties": False} for f in called]
        schema = (calls[0] if len(calls) == 1 else {"anyOf": calls}) | {"x-guidance": JSON_STYLE}
        wrap = json.dumps(OPEN + "\n"), json.dumps("\n" + CLOSE)  # as Lark string literals
        start = 'start: one ("\\n" one)*' if self.parallel else "start: one"
        return f"{start}\none: {wrap[0]} call {wrap[1]}\ncall: %json {json.dumps(schema)}"


def bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param)


def parse(body: dict) -> Tools | None:
    """`tools` and `tool_choice`, checked as OpenAI checks them."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad("'tools' must be a list of functions", "tools")
    functions = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", f"tools[{i}]")
        if not isinstance(f.get("parameters", {}), dict):
            raise bad(f"tools[{i}].function.parameters must be a JSON schema (an object)",
                      f"tools[{i}].function.parameters")
        functions.append({k: f[k] for k in ("name", "description", "parameters") if k in f})
    names = {f["name"] for f in functions}
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise bad(f"'tool_choice' names a function that is not in 'tools': {name!r}", "tool_choice")
        choice = name
    elif choice not in ("auto", "none", "required"):
        raise bad("'tool_choice' must be auto, none, required or {'type': 'function', 'function': {'name': ...}}",
                  "tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    return Tools(tuple(functions), choice, bool(parallel))


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates take them: an assistant's calls with their arguments as objects."""
    def arguments(text: str):
        try:
            return json.loads(text)
        except ValueError:
            return text
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{"type": "function", "id": c["id"], "function": {
                "name": c["function"]["name"], "arguments": arguments(c["function"]["arguments"])}}
                for c in m["tool_calls"]]}
        out.append(m)
    return out


def tool_format(tokenizer, model: str = "the model") -> str:
    """native: the template shows the model its tools and teaches the <tool_call> form; else generic. Said once in
    the log, as llama-server says which format a model gets."""
    probe = [{"role": "user", "content": "x"}]
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=[PROBE], add_generation_prompt=True, tokenize=False)
        without = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
    except Exception:  # a template that cannot render tools at all
        with_tools = without = ""
    native = with_tools != without and OPEN in with_tools
    log.info("tool calls: %s gets the %s", model, f"native format (its template's {OPEN} JSON {CLOSE})" if native
             else "generic format (its template shows no tools in that form: they are described in a system message "
                  "and the answer is held to JSON, a call or a reply)")
    return "native" if native else "generic"


def split_calls(text: str) -> tuple[str, list[dict]] | None:
    """An answer's text before its first call, and its calls in OpenAI's shape; None if what follows the first
    <tool_call> is not calls in the form above (the text is then the answer)."""
    head, _, rest = text.partition(OPEN)
    calls = []
    for block in (OPEN + rest).split(OPEN)[1:]:
        body, closed, after = block.partition(CLOSE)
        if not closed or after.strip():  # (cut short, or text after a call)
            return None
        try:
            call = json.loads(body)
        except ValueError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or \
                not isinstance(call.get("arguments", {}), dict):
            return None
        arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": call["name"], "arguments": arguments}})
    return head.strip(), calls
