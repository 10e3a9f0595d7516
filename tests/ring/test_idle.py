"""A ring left idle keeps its data links: its next prompt is answered at once, exactly, with no recovery. (The
links' idle read timeout, an hour by default, is shortened here to half a second for the host and its members.)"""
import time

import trio

from helpers import new_chat, reference_ids, running_ring
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams

PROMPT = "the quick brown fox jumps over the lazy dog"
N = 12


def test_an_idle_ring_answers_its_next_prompt_at_once(tiny_llama, monkeypatch):
    monkeypatch.setenv("SFCHAT_LINK_IDLE_S", "0.5")  # (the peers get this process's environment)

    async def main():
        async with running_ring(tiny_llama, 2, heartbeat_s=0.5, dead_after_s=3.0) as (host, _):
            events = []
            ask = lambda: new_chat(host).reply(PROMPT, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                               max_new_tokens=N, on_round=events.append)
            await ask()
            epoch = host.epoch
            await trio.sleep(2.0)  # idle past every link's read timeout, four times over
            t0 = time.monotonic()
            with trio.fail_after(20):
                _, r = await ask()
            took = time.monotonic() - t0
            assert not [e for e in events if e["event"] == "recovering"], events
            assert host.epoch == epoch, "the idle ring was re-planned"
            assert took < 3, f"the idle ring took {took:.1f} s to answer"
            return r.token_ids

    assert trio.run(main) == reference_ids(tiny_llama, PROMPT, N)
