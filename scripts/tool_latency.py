"""Seconds per answer of agents' requests against a running `sfchat serve` (docs/benchmarks.md): a required tool
call through the openai client, instructor's TOOLS and JSON_SCHEMA modes, a Responses API answer, and an
openai-agents run through its Chat Completions model; medians of --runs, alternated so that a busy machine's load
falls on all alike. Needs the test extra (instructor, openai-agents).

    .venv/bin/python scripts/tool_latency.py --url http://127.0.0.1:8000/v1 --runs 5
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import instructor
import openai
from pydantic import BaseModel

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius",
                                                                                                    "fahrenheit"]}},
                   "required": ["city", "unit"]}}}


class Person(BaseModel):
    name: str
    age: int


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--key", default="none")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    c = openai.OpenAI(base_url=args.url, api_key=args.key, max_retries=0)
    user = [{"role": "user", "content": "John is 25 years old."}]

    def tool_call():
        r = c.chat.completions.create(model="gpt-4o", tools=[WEATHER], tool_choice="required", max_tokens=60,
                                      messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        json.loads(r.choices[0].message.tool_calls[0].function.arguments)

    def mode(m):
        return lambda: instructor.from_openai(c, mode=m).chat.completions.create(
            model="gpt-4o", response_model=Person, messages=user, max_retries=0)

    def responses():
        assert c.responses.create(model="gpt-4o", input="What is the capital of France? Answer in one word.",
                                  max_output_tokens=40).output_text

    def agent():
        from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                            set_tracing_disabled)
        set_tracing_disabled(True)

        @function_tool
        def get_weather(city: str) -> str:
            """The weather in a city."""
            return f"sunny, 22 C in {city}"
        a = Agent(name="w", instructions="You answer questions about the weather.", tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model="gpt-4o", openai_client=openai.AsyncOpenAI(  # (one per loop)
                      base_url=args.url, api_key=args.key, max_retries=0)),
                  model_settings=ModelSettings(tool_choice="required", max_tokens=60),
                  tool_use_behavior="stop_on_first_tool")
        asyncio.run(Runner.run(a, "What is the weather in Paris?", max_turns=2))

    cases = {"required tool call (chat)": tool_call, "instructor TOOLS": mode(instructor.Mode.TOOLS),
             "instructor JSON_SCHEMA": mode(instructor.Mode.JSON_SCHEMA), "responses.create": responses,
             "openai-agents, one tool": agent}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.runs):
        for name, f in cases.items():
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.2f} s | {min(ts):.2f}-{max(ts):.2f} s |")


if __name__ == "__main__":
    main()
