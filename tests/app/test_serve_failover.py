"""Many conversations on one ring through the endpoint: requests beyond --max-conversations wait (hearing
keep-alives) and none is dropped; a member killed while four answers stream costs none of them a token."""
from __future__ import annotations

import asyncio
import json
import os
import signal

import httpx
import openai
import pytest

from helpers import assert_covers
from serving import KEY, Server

N = 40  # long enough that the kill lands mid-answer


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    s = Server(tiny_llama, tmp_path_factory.mktemp("failover") / "serve.log", "--draft", "ngram",
               "--max-conversations", "4", "--keep-alive-s", "0.3", peers=2)
    s.wait_until(lambda h: sum(m["state"] == "ready" for m in h["members"][1:]) == 2, what="two ready members")
    yield s
    s.close()


PROMPTS = ["hello world", "the lazy dog", "def fib(n)", "quantum entanglement"]


def body(server, prompt: str) -> dict:
    return {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": N,
            "temperature": 0, "stream": True}


async def stream_text(h: httpx.AsyncClient, server, prompt: str, seen: list[str]) -> str:
    """The answer's text; `seen` gets every event's first line, keep-alives included, as they come."""
    text = []
    async with h.stream("POST", "/v1/chat/completions", json=body(server, prompt)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith(":") or line.startswith("data: "):
                seen.append(line)
            if line.startswith("data: {"):
                d = json.loads(line[6:])
                text.append(d["choices"][0]["delta"].get("content") or "" if d["choices"] else "")
    return "".join(text)


def client(server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(server) -> dict[str, str]:
    c = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    return {p: c.chat.completions.create(model=server.model, messages=[{"role": "user", "content": p}], max_tokens=N,
                                         temperature=0).choices[0].message.content for p in PROMPTS}


def test_past_the_limit_requests_wait_with_keep_alives(server, uninterrupted):
    async def main():
        seen, counts = [[] for _ in range(6)], set()
        async with client(server) as h:
            answers = asyncio.gather(*(stream_text(h, server, p, s) for p, s in zip(PROMPTS + PROMPTS[:2], seen)))
            while not answers.done():  # what the server counts meanwhile: in flight, and waiting for a place
                c = (await h.get("/health")).json()["conversations"]
                counts.add((c["in_flight"], c["waiting"]))
                await asyncio.sleep(0.01)
            texts = await answers
        return texts, seen, counts

    texts, seen, counts = asyncio.run(main())
    assert texts == [uninterrupted[p] for p in PROMPTS + PROMPTS[:2]]  # none dropped, each exact
    # four at once, never more, while the other two waited for a place
    assert (4, 2) in counts and max(n for n, _ in counts) == 4, counts
    # and those two heard keep-alives before their first words (on a busy machine a slow start hears them too)
    assert sum(s[1] == ": keep-alive" for s in seen) >= 2, seen


def test_member_killed_while_four_stream(server, uninterrupted):
    victim = server.peer_pids()[0]

    async def main():
        seen = [[] for _ in PROMPTS]
        async with client(server) as h:
            tasks = [asyncio.ensure_future(stream_text(h, server, p, s)) for p, s in zip(PROMPTS, seen)]
            while not all(sum(x.startswith("data: {") for x in s) >= 3 for s in seen):  # all four under way
                await asyncio.sleep(0.01)
            os.kill(victim, signal.SIGKILL)
            return await asyncio.gather(*tasks)

    texts = asyncio.run(main())
    assert texts == [uninterrupted[p] for p in PROMPTS]
    assert "re-planning and replaying" in server.log.read_text()  # the kill did land mid-answer
    h = server.health()
    assert [m["state"] for m in h["members"]].count("lost") == 1 and h["status"] == "ok"
    assert_covers(h["members"], 4)  # the two left hold the tiny Llama's 4 layers between them, each once


def test_health_is_a_503_while_a_member_is_silent(server):
    """A paused member (SIGSTOP: a machine asleep) stalls every answer: /health says so (degraded, the member named,
    a 503 for a readiness probe) before the member is declared lost, and ok again once it answers."""
    server.wait_until(lambda h: h["status"] == "ok" and sum(m["state"] == "ready" for m in h["members"][1:]) == 2,
                      60, "a ring that can answer, both members back")  # (one killed before is started again)
    pids = server.peer_pids()
    seen = []
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as h:  # (open: no key)
            while not seen or seen[-1][1]["status"] == "ok":
                r = h.get("/health")
                seen.append((r.status_code, r.json()))
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    status, body = seen[-1]
    assert status == 503 and body["status"] == "degraded" and "silent for" in body["reason"] and body["since"], body
    assert all(s == 200 for s, _ in seen[:-1])
    h = server.wait_until(lambda h: h["status"] == "ok", what="ok again")
    assert h["reason"] == "" and h["since"] >= body["since"]
