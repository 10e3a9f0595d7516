"""A member that slows down mid-run (another program took its cores: here SFCHAT_TEST_SLOW adds to each of
its passes after its tenth: 0.2 s) hands its layers to the spare at the next gap between answers (placement by speed,
peers/plan/drift.py), and the answers stay token-identical to transformers across the re-plan."""
from dataclasses import replace

import trio

from helpers import new_chat, reference_ids, running_ring
from peers.plan.drift import Drift
from peers.plan.planner import Planner
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import make_drafter
from peers.speculation.sampling import SamplingParams

PROMPT = "the quick brown fox jumps over the lazy dog"
N = 24
SPEEDS = "host=1000000,local-a=1000,local-b=2000"  # local-a the fastest: it holds every layer, local-b is a spare;
# both slower than a tiny layer really runs (a few thousandths of a reference layer): their check once placed
# (peers/plan/calibration.py) finds nothing wrong, and only the drift moves layers


async def slowed_then_replanned(model):
    async with running_ring(model, 2, heartbeat_s=0.5, dead_after_s=30.0, placement="speed") as (host, lp):
        host.auto_replan = True
        host.planner.drift = Drift(hold_s=0.3, cooldown_s=60.0)
        before = [m.name for m in host.ring]
        answers, epochs = [], []
        for _ in range(3):  # the first slows local-a down; the re-plan comes after an answer, before the next
            chat = new_chat(host)
            drafter = make_drafter("none", host.model_dir, host.config.vocab_size, chat.tokenizer)
            _, r = await chat.reply(PROMPT, drafter=drafter, params=SamplingParams(), policy=KPolicy(pinned=1),
                                    max_new_tokens=N)
            answers.append(r.token_ids)
            with trio.fail_after(30):
                while host.replanning:
                    await trio.sleep(0.05)
            epochs.append(host.epoch)
        return before, [m.name for m in host.ring], answers, epochs


def test_a_member_that_slows_down_hands_its_layers_to_the_spare(tiny_llama, monkeypatch):
    # the plans by these speeds alone: loopback round trips (a tenth of a ms, and noisy) taken out
    offers = Planner.offers
    monkeypatch.setattr(Planner, "offers", lambda self, live, holds=True, at=None: [
        replace(o, link_ms=0.0) for o in offers(self, live, holds, at)])
    monkeypatch.setenv("SFCHAT_TEST_MS_PER_LAYER", SPEEDS)
    monkeypatch.setenv("SFCHAT_TEST_SLOW", "local-a:10:0.2")
    before, after, answers, epochs = trio.run(slowed_then_replanned, tiny_llama)
    assert before == ["local-a"] and after == ["local-b"]
    assert epochs[0] < epochs[1] == epochs[2], epochs  # once, between answers, and it did not flap
    ref = reference_ids(tiny_llama, PROMPT, N)
    assert answers == [ref] * 3
