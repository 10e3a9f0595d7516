"""Agents as clients, against `sfchat serve --local-peers 2` with the defaults (the embedded SmolLM2 in the CPU's
own dtype and quantization: no SFCHAT_CPU_* pins), each through the real client library: a required tool call
whose arguments parse (SmolLM2's template shows no tools: the generic format), instructor in TOOLS mode,
openai-agents through its Chat Completions model and its default Responses model, `responses.create` whole and
streamed, /metrics with token counters; both local peers hold layers and no member is lost."""
from __future__ import annotations

import asyncio
import json

import instructor
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from helpers import child_env
from serving import KEY, Server, client, user

pytestmark = pytest.mark.slow  # the real SmolLM2

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    # the defaults users run: the CPU's own dtype and quantization, placement by each process's measured speed
    pins = ("SFCHAT_CPU_", "SFCHAT_PLACEMENT", "SFCHAT_TEST_MS_PER_LAYER")
    env = {k: v for k, v in child_env().items() if not k.startswith(pins)}
    s = Server(smollm2, tmp_path_factory.mktemp("agents") / "serve.log", peers=2, env=env)
    s.wait_until(lambda h: sum(m["layers"] not in ("", "none") for m in h["members"]) == 3, timeout=120,
                 what="a ring of three holding layers")
    yield s
    s.close()


def test_a_required_tool_call_has_arguments_that_parse(server):
    c = client(server)
    kw = dict(model=server.model, messages=user("What is the weather in Paris?"), tools=[WEATHER],
              tool_choice="required", max_tokens=60)
    r = c.chat.completions.create(**kw)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    chunks = [ch for ch in c.chat.completions.create(**kw, stream=True) if ch.choices]
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [("get_weather", call.function.arguments)]


class Person(BaseModel):
    name: str
    age: int


def test_instructor_in_tools_mode_returns_a_valid_object(server):
    c = instructor.from_openai(client(server), mode=instructor.Mode.TOOLS)
    p = c.chat.completions.create(model="gpt-4o", response_model=Person, max_retries=0,
                                  messages=user("John is 25 years old."))
    assert isinstance(p, Person) and p.name and p.age >= 0


def run_agent(server, model_class) -> tuple[list[str], object]:
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    set_tracing_disabled(True)  # (traces would go to OpenAI)
    cities = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"sunny, 22 C in {city}"

    c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    agent = Agent(name="weather", instructions="You answer questions about the weather.", tools=[get_weather],
                  model=model_class(model="gpt-4o", openai_client=c), tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", max_tokens=60))
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=2))
    return cities, result.final_output


def test_openai_agents_calls_a_function_tool_through_chat_completions(server):
    from agents import OpenAIChatCompletionsModel
    cities, output = run_agent(server, OpenAIChatCompletionsModel)
    assert len(cities) == 1 and output == f"sunny, 22 C in {cities[0]}"


def test_openai_agents_calls_a_function_tool_through_responses(server):
    from agents import OpenAIResponsesModel
    cities, output = run_agent(server, OpenAIResponsesModel)
    assert len(cities) == 1 and output == f"sunny, 22 C in {cities[0]}"


def test_responses_whole_and_streamed_to_completed(server):
    c = client(server)
    kw = dict(model=server.model, instructions="Answer in one word.", input="What is the capital of France?",
              max_output_tokens=40)
    r = c.responses.create(**kw)
    assert r.status == "completed" and r.output_text and r.model == server.model
    assert r.usage.output_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    events = list(c.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_metrics_are_prometheus_text_with_token_counters(server):
    r = server.http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(r.text) for s in f.samples}
    assert samples[("sfchat_prompt_tokens_total", ())] > 0 and samples[("sfchat_completion_tokens_total", ())] > 0
    assert samples[("sfchat_requests_total", (("route", "/v1/chat/completions"), ("status", "200")))] >= 2
    assert samples[("sfchat_requests_total", (("route", "/v1/responses"), ("status", "200")))] >= 2
    assert samples[("sfchat_time_to_first_token_seconds_count", ())] > 0
    layers = {dict(k[1])["name"]: v for k, v in samples.items() if k[0] == "sfchat_member_layers"}
    assert sorted(layers) == ["host", "local-a", "local-b"] and sum(layers.values()) == 30 and min(layers.values()) > 0


def test_both_local_peers_hold_layers_and_none_was_lost(server):
    h = server.health()
    assert h["status"] == "ok", h
    assert [m["state"] for m in h["members"]] == ["ready"] * 3 and all(m["layers"] for m in h["members"]), h
    assert {m["quant"] for m in h["members"]} == {h["members"][0]["quant"]} != {"auto"}, h
    assert "lost" not in server.log.read_text()
