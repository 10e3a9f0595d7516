"""Answers that must follow a grammar, through the real `openai` client against `sfchat serve` with two peer
processes and a random draft model in trees: response_format's JSON (the same tokens as plain transformers masked
by the same grammar; every answer parses and validates), and tools (calls parsed into tool_calls, their arguments
held to the function's schema, results fed back through the model's template)."""
from __future__ import annotations

import json

import jsonschema
import llguidance
import llguidance.hf
import llguidance.torch
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from serving import Server, client, user

# bounded (strings, numbers, lists), so that even a random model's answer ends
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"enum": ["fox", "dog", "ring"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                                       "required": ["zone"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory):
    from tiny import TOOLS_TEMPLATE, make_model
    d = make_model(tmp_path_factory.mktemp("tiny-tools"), "llama", layers=4, seed=1, max_position_embeddings=2048)
    (d / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return d


@pytest.fixture(scope="module")
def server(tools_model, tmp_path_factory):
    from tiny import make_model
    draft = make_model(tmp_path_factory.mktemp("tiny-draft"), "llama", layers=1, seed=7)
    s = Server(tools_model, tmp_path_factory.mktemp("serve") / "serve.log", "--draft", str(draft),
               "--in-flight", "3", "--temperature", "0", "--strict-model", peers=2)
    s.wait_until(lambda h: sum(m["layers"] not in ("", "none") for m in h["members"]) == 3, what="a ring of three")
    yield s
    s.close()


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def masked_greedy(model_dir, prompt: str, grammar: str, max_new: int) -> str:
    """Plain transformers, one token at a time, each the argmax of the logits llguidance's mask leaves."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tok, vocab), grammar)
    bits = llguidance.torch.allocate_token_bitmask(1, vocab)
    ids = list(tok.apply_chat_template(user(prompt), add_generation_prompt=True, tokenize=True, return_dict=True)
               ["input_ids"])
    out = []
    for _ in range(max_new):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[:, -1].float()
        llguidance.torch.fill_next_token_bitmask(matcher, bits, 0)
        llguidance.torch.apply_token_bitmask_inplace(logits, bits)
        t = int(logits.argmax())
        if t == tok.eos_token_id:
            break
        assert matcher.consume_token(t)
        ids.append(t)
        out.append(t)
    return tok.decode(out)


def test_a_schema_answer_is_the_masked_target_token_for_token(server, tools_model):
    """Greedy with drafts and trees: the same text as transformers masked by the same grammar; it validates."""
    from peers import json_grammar
    r = client(server).chat.completions.create(model=server.model, messages=user("a person please"), max_tokens=120,
                                               response_format=schema_format(PERSON))
    text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), PERSON)
    assert r.choices[0].finish_reason == "stop" and r.model_extra["sfchat"]["drafted"] > 0
    assert text == masked_greedy(tools_model, "a person please", json_grammar(PERSON), 120)


def test_twenty_schema_answers_parse_and_validate_and_a_seed_repeats(server):
    """Sampled, seeded, whole and streamed: each answer is JSON that the schema validates; a seeded request
    repeated around others gives one answer."""
    c = client(server)
    texts = {}
    for i in range(20):
        kw = dict(model=server.model, messages=user(f"person {i}"), max_tokens=120, temperature=1.0, seed=i,
                  response_format=schema_format(PERSON))
        if i % 2:
            text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**kw, stream=True)
                           if ch.choices)
        else:
            text = c.chat.completions.create(**kw).choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON)
        texts[i] = text
    again = c.chat.completions.create(model=server.model, messages=user("person 4"), max_tokens=120, temperature=1.0,
                                      seed=4, response_format=schema_format(PERSON)).choices[0].message.content
    assert again == texts[4] and len(set(texts.values())) > 10


def test_a_schema_that_cannot_be_followed_is_a_400(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=server.model, messages=user("x"),
                                  response_format=schema_format({"type": "objectx"}))
    assert e.value.body["param"] == "response_format" and "cannot be followed" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=server.model, messages=user("x"), response_format={"type": "xml"})
    assert e.value.body["param"] == "response_format"


@pytest.mark.parametrize("choice, called", [("required", None), ({"type": "function",
                                                                   "function": {"name": "get_time"}}, "get_time")])
def test_a_required_or_named_call_comes_as_tool_calls_that_validate(server, choice, called):
    c = client(server)
    kw = dict(model=server.model, messages=user("weather in paris?"), tools=[WEATHER, TIME], tool_choice=choice,
              max_tokens=200)
    r = c.chat.completions.create(**kw)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and m.content is None and len(m.tool_calls) == 1
    call = m.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == called or (called is None and call.function.name in ("get_weather", "get_time"))
    schema = next(t["function"]["parameters"] for t in (WEATHER, TIME) if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), schema)
    # streamed: the same call in one delta, then the finish
    chunks = [ch for ch in c.chat.completions.create(**kw, stream=True) if ch.choices]
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == \
        [(0, call.function.name, call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks)


def test_a_result_fed_back_is_rendered_by_the_template(server, tools_model):
    """The call and its result go back into the prompt as the model's template writes them (the prompt's tokens
    are exactly the template's), and the model answers."""
    c = client(server)
    r = c.chat.completions.create(model=server.model, messages=user("weather in paris?"), tools=[WEATHER],
                                  tool_choice="required", max_tokens=200)
    call = r.choices[0].message.tool_calls[0]
    messages = user("weather in paris?") + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees, sunny"}]
    r2 = c.chat.completions.create(model=server.model, messages=messages, tools=[WEATHER], max_tokens=8)
    assert r2.choices[0].finish_reason in ("stop", "length")
    tok = AutoTokenizer.from_pretrained(tools_model)
    shown = [{**m, "tool_calls": [{"type": "function", "id": call.id, "function": {
        "name": call.function.name, "arguments": json.loads(call.function.arguments)}}]} if m.get("tool_calls") else m
        for m in messages]
    want = tok.apply_chat_template(shown, tools=[WEATHER], add_generation_prompt=True, tokenize=False)
    assert "<tool_response>\n22 degrees, sunny\n</tool_response>" in want and '"name": "get_weather"' in want
    assert r2.usage.prompt_tokens == len(tok(want, add_special_tokens=False)["input_ids"])


def test_tools_asked_wrongly_are_400s_naming_them(server):
    c = client(server)
    for kw, param in ((dict(tools=[{"type": "function"}]), "tools[0]"),
                      (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
                       "tool_choice"),
                      (dict(tool_choice="required"), "tool_choice"),
                      (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
                       "tool_choice")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=server.model, messages=user("x"), **kw)
        assert e.value.body["param"] == param, e.value.body


def test_split_calls_reads_the_tool_call_form():
    from sfchat.serve.tools import split_calls
    text, calls = split_calls('Let me look.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
                              '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    assert text == "Let me look." and [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                       for c in calls] == [("f", {"a": 1}), ("g", {})]
    assert split_calls('<tool_call>\n{"name": "f", "argu') is None  # cut short: it is text
    assert split_calls('<tool_call>\n{"name": "f"}\n</tool_call> and more words') is None
    assert split_calls("<tool_call>\nnot json\n</tool_call>") is None


def test_each_template_gets_its_tool_format_said_once_in_the_log(server):
    """A template that teaches <tool_call> is used as it is (native); one that shows no tools gets the generic
    format (tests/app/test_serve_tools.py)."""
    from tiny import TOOLS_TEMPLATE, make_tokenizer

    from sfchat.serve.tools import tool_format
    tok = make_tokenizer()
    assert tool_format(tok) == "generic"
    tok.chat_template = TOOLS_TEMPLATE
    assert tool_format(tok) == "native"
    assert server.log.read_text().count("tool calls: ") == 1 and "gets the native format" in server.log.read_text()


def test_strict_model_keeps_the_404(server):
    with pytest.raises(openai.NotFoundError) as e:
        client(server).chat.completions.create(model="gpt-4o", messages=user("x"), max_tokens=2)
    assert e.value.code == "model_not_found"


def test_json_object_answers_are_json_objects(server):
    """response_format json_object: any JSON object, whole and streamed, greedy and sampled."""
    c = client(server)
    for i, temperature in enumerate((0, 1.0, 1.0)):
        kw = dict(model=server.model, messages=user(f"some json {i}"), max_tokens=200, temperature=temperature, seed=i,
                  response_format={"type": "json_object"})
        r = c.chat.completions.create(**kw)
        assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**kw, stream=True)
                           if ch.choices)
        assert streamed == r.choices[0].message.content
