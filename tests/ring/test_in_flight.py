"""Rounds in flight (peers/speculation/in_flight.py) through a host and two real peer processes: greedy answers with three
rounds on the ring at once are plain transformers' answers, also when a member is killed mid-answer, and the
hedges really catch rejections and dead rounds really are cancelled."""
from __future__ import annotations

import trio

from helpers import new_chat, reference_ids, running_ring
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting.simulated import SimulatedDrafter
from peers.speculation.sampling import SamplingParams
from test_batching import prompt_ids

PROMPT = "the quick brown fox"
NEW = 32


async def _answer(host, want: list[int], on_round=None, **policy):
    chat = new_chat(host)
    truth = prompt_ids(chat, PROMPT) + want
    # first guesses right 60% of the time, second guesses 60% of the rest: rejections, and hedges that catch them
    drafter = SimulatedDrafter(0.6, host.config.vocab_size, [truth], seed=3, second=0.6)
    _, r = await chat.reply(PROMPT, drafter=drafter, params=SamplingParams(), policy=KPolicy(**policy),
                            max_new_tokens=NEW, on_round=on_round)
    return r


def test_three_rounds_in_flight_answer_as_transformers(tiny_llama):
    want = reference_ids(tiny_llama, PROMPT, NEW)

    async def main():
        async with running_ring(tiny_llama, 2) as (host, _):
            return await _answer(host, want, in_flight=3, tree_nodes=3)

    r = trio.run(main)
    assert r.token_ids == want
    rounds = r.rounds
    assert max(x["in_flight"] for x in rounds) == 3, rounds
    assert any(x["caught"] for x in rounds), rounds  # a rejection landed on a hedge already on the ring
    assert any(x["cancelled"] for x in rounds), rounds  # and a round a verdict made dead was cancelled
    assert r.stats.summary()["rounds_in_flight"] > 1.5


def test_a_member_killed_with_rounds_in_flight_changes_nothing(tiny_llama):
    want = reference_ids(tiny_llama, PROMPT, NEW)

    async def main():
        async with running_ring(tiny_llama, 2) as (host, lp):
            events = []

            def kill_once(ev):
                events.append(ev)
                rounds = [e for e in events if e.get("event") == "round"]
                if len(rounds) == 4 and lp.procs[1].poll() is None:
                    lp.procs[1].kill()  # local-b, with rounds on the ring
            r = await _answer(host, want, on_round=kill_once, in_flight=3, tree_nodes=3)
            return r, events, [m.name for m in host.ring]

    r, events, ring = trio.run(main)
    assert ring == ["local-a"] and any(e.get("event") == "recovering" for e in events)
    assert r.token_ids == want


def test_the_policy_keeps_rounds_in_flight_where_the_link_leaves_the_stages_idle():
    timing = {"pass_ms": 380.0, "network_ms": 180.0, "host_ms": 100.0, "peers": [["a", 60.0]]}
    slow, fast, pinned = KPolicy(), KPolicy(), KPolicy(in_flight=2)
    slow.stages(timing)
    fast.stages({**timing, "pass_ms": 170.0, "network_ms": 10.0})
    pinned.stages({**timing, "pass_ms": 170.0, "network_ms": 10.0})
    assert (slow.rounds_in_flight(), fast.rounds_in_flight(), pinned.rounds_in_flight()) == (2, 1, 2)
    # measured slower in flight than one at a time: one at a time, but for one stretch of rounds in four
    slow.pace(False, 60, 4000.0)
    slow.pace(True, 40, 4000.0)
    tried = [slow.rounds_in_flight() for slow.rounds in range(64)]
    assert tried[48:] == [2] * 16 and tried[:48] == [1] * 48
    slow.pace(True, 80, 0.0)  # and faster now
    assert {slow.rounds_in_flight() for slow.rounds in range(64)} == {2}


def test_conversations_sharing_passes_keep_rounds_in_flight_each_exactly(tiny_llama):
    prompts = ["hello world", "one two three four", "good morning to you"]
    wants = {p: reference_ids(tiny_llama, p, NEW) for p in prompts}

    async def main():
        async with running_ring(tiny_llama, 2) as (host, _):
            out = {}

            async def one(prompt):
                chat = new_chat(host)
                drafter = SimulatedDrafter(0.6, host.config.vocab_size, [prompt_ids(chat, prompt) + wants[prompt]],
                                           seed=5, second=0.6)
                _, out[prompt] = await chat.reply(prompt, drafter=drafter, params=SamplingParams(),
                                                  policy=KPolicy(in_flight=3, tree_nodes=3), max_new_tokens=NEW)
            async with trio.open_nursery() as nursery:
                for p in prompts:
                    nursery.start_soon(one, p)
            return out

    out = trio.run(main)
    for p in prompts:
        assert out[p].token_ids == wants[p], p
    rounds = [x for r in out.values() for x in r.rounds]
    assert max(x["in_flight"] for x in rounds) == 3 and max(x["batch"] for x in rounds) > 1
