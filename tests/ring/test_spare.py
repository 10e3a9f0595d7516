"""Placement by speed through real processes: the slower member is a spare; killed (kill -9), the member holding
the layers is replaced by the spare, and the greedy answer stays token-identical to transformers."""
import signal

import trio

from helpers import assert_covers, new_chat, reference_ids, running_ring
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import make_drafter
from peers.speculation.sampling import SamplingParams

PROMPT = "the quick brown fox jumps over the lazy dog"
N = 32
# fixed speeds (ms per reference layer; a tiny layer costs a few thousandths of one): local-a the fastest,
# local-b slower by far more than a loopback round trip, the host slower still
SPEEDS = "host=1000000,local-a=1,local-b=1000"


async def spare_takes_over(model):
    async with running_ring(model, 2, heartbeat_s=0.5, dead_after_s=3.0, placement="speed") as (host, lp):
        host.auto_replan = True
        by_name = {m.name: m for m in host.members}
        fast, spare = by_name["local-a"], by_name["local-b"]
        before = {"ring": [m.name for m in host.ring], "spare": spare.state, "host": host.shard.span.size,
                  "info": {m["name"]: m for m in host.members_info()}}
        rounds = 0

        def on_round(ev):
            nonlocal rounds
            if ev["event"] == "round":
                rounds += 1
                if rounds == 3:
                    lp.procs[0].send_signal(signal.SIGKILL)  # local-a, the one holding the layers

        chat = new_chat(host)
        drafter = make_drafter("none", host.model_dir, host.config.vocab_size, chat.tokenizer)
        _, r = await chat.reply(PROMPT, drafter=drafter, params=SamplingParams(), policy=KPolicy(pinned=2),
                                          max_new_tokens=N, on_round=on_round)
        with trio.fail_after(30):
            while fast.state != "lost":
                await trio.sleep(0.1)
        async with host.planner.gate.share():
            assert_covers(host)
            after = [m.name for m in host.ring]
        return r, before, after


def test_the_spare_takes_over_exactly(tiny_llama, monkeypatch):
    monkeypatch.setenv("SFCHAT_TEST_MS_PER_LAYER", SPEEDS)
    r, before, after = trio.run(spare_takes_over, tiny_llama)
    assert before["ring"] == ["local-a"] and before["host"] == 0  # the fastest holds every layer
    assert before["spare"] == "spare"
    assert before["info"]["local-b"]["spare"] and before["info"]["local-b"]["ms_per_layer"] == 1000.0
    assert after == ["local-b"]  # the spare, not the slow host, took the layers over
    assert r.token_ids == reference_ids(tiny_llama, PROMPT, N)
