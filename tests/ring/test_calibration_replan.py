"""A member whose figure is a lie: it offers itself as the fastest (SFCHAT_TEST_MS_PER_LAYER; as a 1-thread process
that timed itself on a core free for a moment would) while its passes are slow from the first (SFCHAT_TEST_SLOW: 0.1 s
more a pass). Its first rounds under the plan show it (peers/plan/calibration.py): between answers the host
re-plans once, its layers go to the other member, and the answers stay token-identical to transformers."""
from dataclasses import replace

import trio
import trio.testing

from helpers import new_chat, reference_ids, running_ring
from peers.plan.planner import Planner
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import make_drafter
from peers.speculation.sampling import SamplingParams

PROMPT = "the quick brown fox jumps over the lazy dog"
N = 16
# local-a offers itself the fastest: it holds every layer, local-b is a spare; both figures slower than a tiny
# layer really runs (a few thousandths of a reference layer), so only local-a's injected slowness shows
SPEEDS = "host=1000000,local-a=1000,local-b=2000"


async def lied_then_replanned(model):
    async with running_ring(model, 2, heartbeat_s=0.5, dead_after_s=30.0, placement="speed") as (host, lp):
        host.auto_replan = True
        before = [m.name for m in host.ring], host.epoch
        answers, epochs, rings = [], [], []
        for _ in range(3):
            chat = new_chat(host)
            drafter = make_drafter("none", host.model_dir, host.config.vocab_size, chat.tokenizer)
            _, r = await chat.reply(PROMPT, drafter=drafter, params=SamplingParams(), policy=KPolicy(pinned=1),
                                    max_new_tokens=N)
            answers.append(r.token_ids)
            await trio.testing.wait_all_tasks_blocked(0.05)  # a re-plan started between answers is under way
            with trio.fail_after(30):
                while host.replanning:
                    await trio.sleep(0.05)
            epochs.append(host.epoch)
            rings.append([m.name for m in host.ring])
        return before, rings, answers, epochs


def by_figures_alone(monkeypatch, speeds: str) -> None:
    """The plans by these figures alone: loopback round trips (a tenth of a ms, and noisy) taken out."""
    offers = Planner.offers
    monkeypatch.setattr(Planner, "offers", lambda self, live, holds=True, at=None: [
        replace(o, link_ms=0.0) for o in offers(self, live, holds, at)])
    monkeypatch.setenv("SFCHAT_TEST_MS_PER_LAYER", speeds)
    monkeypatch.setenv("SFCHAT_TEST_SLOW", "local-a:0:0.1")


def test_a_member_slower_than_it_said_hands_its_layers_over_after_its_first_rounds(tiny_llama, monkeypatch):
    by_figures_alone(monkeypatch, SPEEDS)
    (before, first), rings, answers, epochs = trio.run(lied_then_replanned, tiny_llama)
    assert before == ["local-a"] and rings == [["local-b"]] * 3, (before, rings)
    assert first < epochs[0] == epochs[1] == epochs[2], epochs  # once, after the first answer, and no flapping
    assert answers == [reference_ids(tiny_llama, PROMPT, N)] * 3


def test_a_corrected_figure_that_moves_nothing_is_no_replan(tiny_llama, monkeypatch):
    by_figures_alone(monkeypatch, "host=1000000,local-a=1000,local-b=100000")  # local-a, slowed, is still the best
    (before, first), rings, answers, epochs = trio.run(lied_then_replanned, tiny_llama)
    assert before == ["local-a"] and rings == [["local-a"]] * 3, (before, rings)
    assert epochs == [first] * 3  # no new epoch: the conversations' caches stay
