"""The OpenAI-compatible endpoint with the real `openai` client and raw HTTP, against a real `sfchat serve` with two
peer processes (the tiny random Llama: its text is gibberish, but greedy answers are exact and repeatable)."""
from __future__ import annotations

import asyncio
import json
import re

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from serving import KEY, Server, client, user

N = 12  # tokens per answer: enough to stream in several pieces, cheap on two shared cores


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    s = Server(tiny_llama, tmp_path_factory.mktemp("serve") / "serve.log", "--draft", "ngram", "--max-conversations",
               "8", peers=2)
    s.wait_until(lambda h: sum(m["layers"] not in ("", "none") for m in h["members"]) == 3, what="a ring of three")
    yield s
    s.close()


def whole(server, prompt: str, **kw) -> str:
    r = client(server).chat.completions.create(model=server.model, messages=user(prompt), max_tokens=N, temperature=0,
                                               **kw)
    return r.choices[0].message.content


def test_whole_and_streamed_with_usage(server, tiny_llama):
    c = client(server)
    assert [m.id for m in c.models.list()] == [tiny_llama.name]
    r = c.chat.completions.create(model=tiny_llama.name, messages=user("hello world"), max_tokens=N, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= N and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.model_extra["sfchat"]["rounds"] >= 1  # the speculative statistics ride along
    chunks = list(c.chat.completions.create(model=tiny_llama.name, messages=user("hello world"), max_tokens=N,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({ch.id for ch in chunks}) == 1
    assert chunks[-1].choices == [] and same_usage(chunks[-1].usage, r.usage)
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1]) == r.choices[0].message.content


def same_usage(again, first) -> bool:
    """The same request's usage, again: the same tokens; the prompt's tokens a warm row held may differ (at most all
    but the last: tests/app/test_prefix_cache.py)."""
    held = again.prompt_tokens_details.cached_tokens
    return again.model_dump(exclude={"prompt_tokens_details"}) == first.model_dump(exclude={"prompt_tokens_details"}) \
        and 0 <= held < again.prompt_tokens


def test_async_client_streams_the_same_answer(server, tiny_llama):
    async def main() -> str:
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        stream = await c.chat.completions.create(model=tiny_llama.name, messages=user("the quick brown fox"),
                                                 max_tokens=N, temperature=0, stream=True)
        return "".join([ch.choices[0].delta.content or "" async for ch in stream])

    assert asyncio.run(main()) == whole(server, "the quick brown fox")


def test_a_request_without_temperature_gets_the_servers(server, tiny_llama):
    """The server runs at the model's default (its generation_config names none here: greedy), not OpenAI's 1."""
    c = client(server)
    answers = {c.chat.completions.create(model=server.model, messages=user("the ring"), max_tokens=N)
               .choices[0].message.content for _ in range(3)}
    assert answers == {whole(server, "the ring")}


def test_stop_string_never_in_the_output(server, tiny_llama):
    full = whole(server, "speculative decoding")
    stop = full[len(full) // 2: len(full) // 2 + 2]
    want = full[: full.index(stop)]
    r = client(server).chat.completions.create(model=tiny_llama.name, messages=user("speculative decoding"),
                                               max_tokens=N, temperature=0, stop=[stop])
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (want, "stop")
    streamed = client(server).chat.completions.create(model=tiny_llama.name, messages=user("speculative decoding"),
                                                      max_tokens=N, temperature=0, stop=stop, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in streamed) == want


def test_sse_framing(server, tiny_llama):
    body = {"model": tiny_llama.name, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 4, "temperature": 0, "stream": True}
    with server.http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    data = [json.loads(e.removeprefix("data: ")) for e in events[:-2] if not e.startswith(":")]
    assert all(e.startswith("data: ") or e == ": keep-alive" for e in events[:-1])
    assert {d["object"] for d in data} == {"chat.completion.chunk"} and len({d["id"] for d in data}) == 1
    assert data[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert data[-1]["choices"][0]["delta"] == {} and data[-1]["choices"][0]["finish_reason"] == "length"
    assert all(d["choices"][0]["finish_reason"] is None for d in data[:-1])
    assert "usage" not in data[0]  # only with include_usage


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    return e


def test_error_shapes(server, tiny_llama):
    ok = {"model": tiny_llama.name, "messages": user("hi"), "max_tokens": 2}
    post = lambda body, **kw: server.http.post("/v1/chat/completions", json=body, **kw)  # noqa: E731
    assert error_of(httpx.post(server.url + "/v1/chat/completions", json=ok), 401)["code"] == "invalid_api_key"
    assert error_of(httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer nope"}), 401)
    assert error_of(post(ok | {"n": 2}), 400)["param"] == "n"
    assert error_of(post(ok | {"temperature": "hot"}), 400)["param"] == "temperature"
    assert error_of(post(ok | {"messages": [{"role": "robot", "content": "x"}]}), 400)
    too_long = error_of(post(ok | {"messages": user("word " * 600)}), 400)  # as OpenAI answers it
    assert (too_long["type"], too_long["code"]) == ("invalid_request_error", "context_length_exceeded")
    assert error_of(server.http.get("/v1/chat/completions"), 405)["type"] == "invalid_request_error"
    assert error_of(server.http.post("/v1/chat/completions", content=b"{not json"), 400)
    assert error_of(server.http.get("/v1/nothing"), 404)
    with pytest.raises(openai.BadRequestError):
        client(server).chat.completions.create(model=tiny_llama.name, messages=user("hi"), n=3)
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(model=tiny_llama.name, messages=user("word " * 600))
    assert e.value.code == "context_length_exceeded"
    # an answer longer than the context has room for is refused as OpenAI refuses it, naming the room left
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(model=tiny_llama.name, messages=user("hi"), max_tokens=100000)
    assert (e.value.code, e.value.param) == ("context_length_exceeded", "max_tokens")
    assert "'max_tokens' is 100000, but the context holds 512 tokens and the prompt takes " in e.value.message
    assert re.search(r": \d+ are left for the answer", e.value.message)
    err = error_of(post(ok | {"max_tokens": None, "max_completion_tokens": 513}), 400)
    assert err["param"] == "max_completion_tokens" and "are left for the answer" in err["message"]
    # one line per request in the server's log: client, method and path, status, tokens, time
    assert post(ok).status_code == 200
    log = server.log.read_text()
    assert re.search(r'127\.0\.0\.1:\d+ "POST /v1/chat/completions" 400 \d+\.\d\d s', log)
    assert re.search(r'"GET /v1/models" 401 ', log)
    assert re.search(r'"POST /v1/chat/completions" 200 \d+ tokens \d+\.\d\d s', log), log


def test_any_model_name_is_answered_by_the_one_served(server, tiny_llama):
    """As llama-server: a client's default name ("gpt-4o") gets the model served, named in the answer; the log
    says so once (--strict-model keeps the 404: tests/app/test_serve_structured.py)."""
    c = client(server)
    for name in ("gpt-4o", "gpt-4o", "some-other"):
        assert c.chat.completions.create(model=name, messages=user("hi"), max_tokens=2).model == tiny_llama.name
    log = server.log.read_text()
    assert log.count("asked for the model 'gpt-4o'") == 1 and log.count("asked for the model 'some-other'") == 1


def test_health_is_open_and_its_members_need_the_key(server):
    open_ = httpx.get(server.url + "/health")
    assert open_.status_code == 200 and open_.json()["status"] == "ok" and "members" not in open_.json()
    assert open_.json()["reason"] == "" and open_.json()["since"]
    members = server.health()["members"]  # with the key
    assert len(members) == 3
    # under --placement memory (the suite's) too, each member's ms/layer and share of the time per token
    assert all(m["ms_per_layer"] is not None and m["share"] > 0 for m in members), members


def test_hostile_bodies_leave_other_answers_alone(server, tiny_llama):
    want = whole(server, "pipeline parallelism")
    hostile = [b"[" * 200_000 + b"]" * 200_000, b"\xff\xfe" * 1000, b"x" * (5 * 2**20), b'{"model": 1}',
               json.dumps({"model": tiny_llama.name, "messages": user("hi"), "max_tokens": -1}).encode(),
               json.dumps({"model": tiny_llama.name, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
                          ).encode()]

    async def main() -> tuple[str, list[int]]:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"},
                                     timeout=120) as h:
            body = {"model": tiny_llama.name, "messages": user("pipeline parallelism"), "max_tokens": N,
                    "temperature": 0}
            answer = asyncio.ensure_future(h.post("/v1/chat/completions", json=body))
            codes = [(await h.post("/v1/chat/completions", content=b)).status_code for b in hostile]
            return (await answer).json()["choices"][0]["message"]["content"], codes

    text, codes = asyncio.run(main())
    assert text == want
    assert codes == [400, 400, 413, 400, 400, 400]


def test_a_body_cut_short_is_no_server_error(server):
    """A client that hangs up before its body is complete is nobody's error: no 500, no traceback in the log."""
    import socket
    import time

    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n").encode()
    url = httpx.URL(server.url)
    with socket.create_connection((url.host, url.port)) as s:
        s.sendall(head + b'{"model": ')
    for _ in range(30):  # the server sees the hang-up within moments
        assert "Traceback" not in server.log.read_text(), server.log.read_text()[-3000:]
        time.sleep(0.1)
    assert server.health()["status"] == "ok"


def test_disconnect_cancels_and_frees_every_member(server, tiny_llama):
    """Greedy, so the answer is the same every run: this tiny model does not end it before 400 tokens."""
    c = client(server)
    stream = c.chat.completions.create(model=tiny_llama.name, messages=user("a long story"), max_tokens=400,
                                       temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    assert server.health()["conversations"]["in_flight"] == 1  # still generating when the client leaves
    stream.close()
    # every member holds the warm rows of finished answers only (tests/app/test_prefix_cache.py)
    h = server.wait_until(lambda h: h["conversations"]["in_flight"] == 0
                          and all(m["conversations"] == h["conversations"]["warm"] for m in h["members"][1:]),
                          timeout=20, what="the cancelled conversation freed everywhere")
    assert h["status"] == "ok"


def test_eight_concurrent_streams_equal_ask(server, tiny_llama):
    """Each of eight streams at once is what `sfchat ask --json` answers alone (its answer, on a ring of its own)."""
    from shared_ring import SharedRing

    prompts = ["hello world", "the lazy dog", "def fib(n)", "quantum entanglement"]
    alone = SharedRing("--model", str(tiny_llama))
    try:
        asked = {p: alone.ask(p, "--draft", "ngram", "--max-new-tokens", str(N), "--temperature", "0")["text"]
                 for p in prompts}
    finally:
        alone.close()

    async def one(c, prompt: str) -> str:
        stream = await c.chat.completions.create(model=tiny_llama.name, messages=user(prompt), max_tokens=N,
                                                 temperature=0, stream=True)
        return "".join([ch.choices[0].delta.content or "" async for ch in stream])

    async def main() -> list[str]:
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        return await asyncio.gather(*(one(c, p) for p in prompts * 2))

    assert asyncio.run(main()) == [asked[p] for p in prompts * 2]


@pytest.mark.parametrize("extra", [{"logit_bias": {"50": 5}}, {"audio": {"voice": "alloy", "format": "wav"}},
                                   {"modalities": ["text", "audio"]}, {"prediction": {"type": "content",
                                                                                      "content": "x"}},
                                   {"web_search_options": {}}, {"functions": [{"name": "f"}]},
                                   {"function_call": "auto"}, {"presence_penalty": 0.5},
                                   {"frequency_penalty": 1.0}])
def test_what_sfchat_does_not_do_is_a_400_naming_it(server, tiny_llama, extra):
    """Nothing silently ignored: each is refused in OpenAI's shape, by the real client too."""
    (param,) = extra
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(model=tiny_llama.name, messages=user("hi"), max_tokens=2,
                                               extra_body=extra)
    assert e.value.param == param and param in e.value.message


def test_what_means_the_default_still_passes(server, tiny_llama):
    r = client(server).chat.completions.create(model=tiny_llama.name, messages=user("hi"), max_tokens=2, n=1,
                                               logit_bias={}, presence_penalty=0, frequency_penalty=0.0, store=False,
                                               modalities=["text"], temperature=0)
    assert r.choices[0].message.content is not None


def test_legacy_completions_whole_and_streamed(server, tiny_llama):
    c = client(server)
    r = c.completions.create(model=tiny_llama.name, prompt="The capital of France is", max_tokens=N, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.choices[0].text
    assert r.choices[0].finish_reason in ("length", "stop")
    assert 0 < r.usage.completion_tokens <= N and r.usage.prompt_tokens == len(
        AutoTokenizer.from_pretrained(tiny_llama)("The capital of France is")["input_ids"])  # the text as it is
    chunks = list(c.completions.create(model=tiny_llama.name, prompt="The capital of France is", max_tokens=N,
                                       temperature=0, stream=True, stream_options={"include_usage": True}))
    assert all(ch.object == "text_completion" for ch in chunks) and len({ch.id for ch in chunks}) == 1
    assert "".join(ch.choices[0].text for ch in chunks[:-1]) == r.choices[0].text
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason
    assert chunks[-1].choices == [] and same_usage(chunks[-1].usage, r.usage)
    # no chat template: the prompt is the model's text as it is, so a chat answer to the same words differs
    assert r.usage.prompt_tokens < c.chat.completions.create(
        model=tiny_llama.name, messages=user("The capital of France is"), max_tokens=1).usage.prompt_tokens
    # OpenAI's default for this endpoint: 16 tokens
    assert c.completions.create(model=tiny_llama.name, prompt="hello", temperature=0).usage.completion_tokens <= 16
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=tiny_llama.name, prompt="hi", best_of=3)
    assert e.value.param == "best_of"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=tiny_llama.name, prompt=[1, 2, 3])
    assert e.value.param == "prompt"


def test_model_card_and_unknown_routes_name_what_is_served(server, tiny_llama):
    c = client(server)
    assert c.models.retrieve(tiny_llama.name).id == tiny_llama.name
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("gpt-4o")
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as e:
        c.embeddings.create(model=tiny_llama.name, input="hi")
    assert "/v1/embeddings is not served here" in e.value.message and "POST /v1/completions" in e.value.message
    err = error_of(server.http.get("/v1/nothing"), 404)
    assert "POST /v1/chat/completions" in err["message"] and "GET /v1/models/{model}" in err["message"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {  # (closed: a random model's answer ends)
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}


def generic_prompt_tokens(model_dir, messages: list[dict], tools: list[dict], choice="auto") -> int:
    """The prompt the generic format makes: the template over our system message and the messages as it takes them."""
    from sfchat.serve import generic_tools
    from sfchat.serve.request import _messages
    from sfchat.serve.tools import parse as parse_tools
    tok = AutoTokenizer.from_pretrained(model_dir)
    shown = generic_tools.messages(_messages({"messages": messages}), parse_tools({"tools": tools,
                                                                                  "tool_choice": choice}))
    return len(tok.apply_chat_template(shown, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_template_without_tools_gets_the_generic_format(server, tiny_llama, choice):
    """The tiny Llama's template shows no tools: they go in a system message of ours, and a required or named call
    comes back as tool_calls whose arguments follow the schema, whole and streamed alike. (One short tool: the tiny
    tokenizer spends a token a character, and the context holds 512.)"""
    import jsonschema
    c = client(server)
    kw = dict(model=tiny_llama.name, messages=user("time?"), tools=[TIME], tool_choice=choice, max_tokens=80,
              temperature=0)
    r = c.chat.completions.create(**kw)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and m.content is None and len(m.tool_calls) == 1, r
    call = m.tool_calls[0]
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME["function"]["parameters"])
    assert r.usage.prompt_tokens == generic_prompt_tokens(tiny_llama, kw["messages"], kw["tools"], choice)
    chunks = [ch for ch in c.chat.completions.create(**kw, stream=True) if ch.choices]
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [(call.function.name, call.function.arguments)]
    assert "gets the generic format" in server.log.read_text()


def test_generic_results_go_back_as_the_template_takes_them(server, tiny_llama):
    c = client(server)
    r = c.chat.completions.create(model=tiny_llama.name, messages=user("time?"), tools=[TIME],
                                  tool_choice="required", max_tokens=80, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    messages = user("time?") + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                                {"role": "tool", "tool_call_id": call.id, "content": "noon"}]
    r2 = c.chat.completions.create(model=tiny_llama.name, messages=messages, tools=[TIME], tool_choice="required",
                                   max_tokens=4)
    assert r2.usage.prompt_tokens == generic_prompt_tokens(tiny_llama, messages, [TIME], "required")


def test_generic_schema_holds_one_call_or_with_parallel_tool_calls_several():
    import jsonschema

    from sfchat.serve import generic_tools
    from sfchat.serve.tools import parse as parse_tools
    one = {"name": "get_time", "arguments": {"zone": "utc"}}
    auto = generic_tools.schema(parse_tools({"tools": [WEATHER, TIME]}))
    for ok in ({"tool_call": one}, {"response": "hi"}):
        jsonschema.validate(ok, auto)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool_calls": [one, one]}, auto)
    parallel = generic_tools.schema(parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required",
                                                 "parallel_tool_calls": True}))
    jsonschema.validate({"tool_calls": [one, one]}, parallel)
    for bad in ({"response": "hi"}, {"tool_calls": []}, {"tool_call": one}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, parallel)
    text, calls = generic_tools.read(json.dumps({"tool_calls": [one, one]}))
    assert text == "" and [json.loads(c["function"]["arguments"]) for c in calls] == [{"zone": "utc"}] * 2
    assert generic_tools.read('{"response": "It is noon."}') == ("It is noon.", [])  # a reply: its text alone
    assert generic_tools.read('{"response": "It is') is None  # cut short: the text is the answer


def test_responses_with_function_calls_whole_and_streamed(server, tiny_llama):
    import jsonschema
    c = client(server)
    tools = [{"type": "function", **TIME["function"]}]
    kw = dict(model=tiny_llama.name, input="time?", tools=tools, tool_choice="required", max_output_tokens=80,
              temperature=0)
    r = c.responses.create(**kw)
    call = r.output[0]
    assert r.status == "completed" and call.type == "function_call" and call.name == "get_time"
    jsonschema.validate(json.loads(call.arguments), TIME["function"]["parameters"])
    events = list(c.responses.create(**kw, stream=True))
    assert [e.type for e in events][-4:] == ["response.function_call_arguments.delta",
                                            "response.function_call_arguments.done", "response.output_item.done",
                                            "response.completed"]
    assert events[-1].response.output[0].arguments == call.arguments
    # the call and its output go back as items: the same prompt as chat completions make of them
    back = [{"role": "user", "content": "time?"}, call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "noon"}]
    r2 = c.responses.create(model=tiny_llama.name, input=back, tools=tools, tool_choice="required",
                            max_output_tokens=4)
    assert r2.status == "incomplete" and r2.incomplete_details.reason == "max_output_tokens"
    as_chat = user("time?") + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "noon"}]
    assert r2.usage.input_tokens == generic_prompt_tokens(tiny_llama, as_chat, [TIME], "required")


def test_responses_refuse_what_is_not_done_naming_it(server, tiny_llama):
    c = client(server)
    for kw, param in ((dict(previous_response_id="resp_1"), "previous_response_id"), (dict(store=True), "store"),
                      (dict(tools=[{"type": "web_search"}]), "tools[0]"),
                      (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                       "input[0].content"),
                      (dict(max_output_tokens=0), "max_output_tokens")):
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(**{"model": tiny_llama.name, "input": "hi"} | kw)
        assert e.value.body["param"] == param, e.value.body
