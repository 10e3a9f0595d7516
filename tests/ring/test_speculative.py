"""Speculative decoding on tiny models: exact with every drafter, rollback, vocab padding, look-ahead, K."""
import copy
import random

import pytest
import trio
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import answer, reference_ids
from shared_ring import ask_in_process
from peers.speculation.adaptive import EXPLORE_EVERY, KPolicy, best_k, expected_tokens
from peers.conversation.chat import load_tokenizer
from peers.speculation.drafting import ModelDrafter, NgramDrafter, lookup, make_drafter
from peers.models.source import ModelError
from peers.speculation.sampling import SamplingParams

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def other_llama(tmp_path_factory):
    """Same tokenizer, other random weights, 8 more vocabulary rows on the target side than here."""
    from tiny import make_model
    return make_model(tmp_path_factory.mktemp("other"), "llama", layers=2, seed=9)


@pytest.fixture(scope="module")
def padded_target(tmp_path_factory):
    from tiny import make_model
    return make_model(tmp_path_factory.mktemp("padded"), "llama", layers=3, seed=4, vocab_pad=8)


async def _answer(model, draft_spec, *, k=None, params=None, max_new=24, prompt=PROMPT):
    return await answer(model, draft_spec, prompt=prompt, k=k, params=params, max_new=max_new)


@pytest.mark.parametrize("draft", ["none", "ngram", "other", "self"])
@pytest.mark.parametrize("k", [None, 1, 5])
def test_greedy_is_exact_with_every_drafter(draft, k, tiny_llama, other_llama):
    spec = {"other": str(other_llama), "self": str(tiny_llama)}.get(draft, draft)
    r = trio.run(lambda: _answer(tiny_llama, spec, k=k))
    assert r.token_ids == reference_ids(tiny_llama, PROMPT, 24)
    for rd in r.rounds:
        assert rd["accepted"] <= rd["drafted"] and rd["committed"] <= rd["accepted"] + 1


def test_a_draft_identical_to_the_target_is_fully_accepted(tiny_llama):
    # one peer process: the look-ahead drafts while the round is on the wire (never while the host computes)
    r = trio.run(lambda: answer(tiny_llama, str(tiny_llama), prompt=PROMPT, k=6, max_new=42, peers=1))
    full = [rd for rd in r.rounds if rd["committed"] == 7]
    assert len(full) >= len(r.rounds) - 1, r.rounds  # all but a last, shorter round commit K+1 = 7
    assert r.stats.drafted == r.stats.accepted
    # with every round fully accepted the look-ahead's drafts were used: drafting hidden behind the pass
    assert sum(rd["hidden_draft_ms"] > 0 for rd in r.rounds) >= len(r.rounds) - 2


def test_a_bad_draft_is_rolled_back_and_the_answer_stays_exact(tiny_llama, other_llama):
    r = trio.run(lambda: _answer(tiny_llama, str(other_llama), k=4))
    assert r.stats.accepted < r.stats.drafted  # it really was rejected some of the time
    assert r.token_ids == reference_ids(tiny_llama, PROMPT, 24)


def test_draft_with_fewer_vocabulary_rows(padded_target, tiny_llama):
    """The target has 8 more rows than the draft (like Qwen2.5-7B vs 0.5B): those ids get q = 0."""
    assert AutoModelForCausalLM.from_pretrained(padded_target).config.vocab_size == \
        AutoModelForCausalLM.from_pretrained(tiny_llama).config.vocab_size + 8
    r = trio.run(lambda: _answer(padded_target, str(tiny_llama), k=3))
    assert r.token_ids == reference_ids(padded_target, PROMPT, 24)
    sampled = [trio.run(lambda: _answer(padded_target, str(tiny_llama), k=3, params=SamplingParams(1.0, seed=3)))
               for _ in range(2)]
    assert sampled[0].token_ids == sampled[1].token_ids and len(sampled[0].token_ids) == 24  # seeded: reproducible
    assert sampled[0].stats.drafted > 0


def test_draft_with_another_tokenizer_is_refused(tiny_llama, tmp_path):
    from tiny import make_model
    other = make_model(tmp_path / "m", "llama", layers=1)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<extra-token>"])
    tok.save_pretrained(other)
    with pytest.raises(ModelError, match="tokenizer"):
        make_drafter(str(other), tiny_llama, 300, load_tokenizer(tiny_llama))


def test_model_drafter_cache_follows_the_context(tiny_llama):
    """After a fully accepted round the draft also processes its last drafted token (no hole in its context),
    and a rejected branch is cropped away: proposals always equal those of a fresh drafter."""
    tok = load_tokenizer(tiny_llama)
    ctx = tok.encode(PROMPT)
    d = ModelDrafter(tiny_llama, 300)
    greedy = SamplingParams()
    first, _ = d.propose(ctx, 4, greedy)
    assert d.seen == ctx + first[:3] and d.cache.length == len(d.seen)
    ctx2 = ctx + first + [7]  # fully accepted, bonus token 7
    second, _ = d.propose(ctx2, 3, greedy)
    assert d.seen[: len(ctx2)] == ctx2
    fresh, _ = ModelDrafter(tiny_llama, 300).propose(ctx2, 3, greedy)
    assert second == fresh
    ctx3 = ctx + first[:1] + [11]  # rejected at the second draft
    third, _ = d.propose(ctx3, 3, greedy)
    assert third == ModelDrafter(tiny_llama, 300).propose(ctx3, 3, greedy)[0]


def test_ngram_lookup():
    assert lookup([1, 2, 3, 9, 9, 1, 2, 3], 3) == [9, 9, 1]
    assert lookup([1, 2, 3, 4], 3) == []
    assert lookup([5, 6, 7, 5, 6], 2) == [7, 5]
    assert NgramDrafter().propose([1, 2], 3, SamplingParams())[0] == []


def test_adaptive_k_maximises_expected_tokens_per_second():
    assert expected_tokens(0.8, 0) == pytest.approx(1.0)
    assert expected_tokens(0.8, 8) == pytest.approx((1 - 0.8 ** 9) / 0.2)
    # over a WAN drafting is cheap next to a round: long drafts pay (alpha 0.8, c = 0.03 -> K about 10)
    assert 8 <= best_k(0.8, 100.0, 3.0, 16) <= 12
    # when a draft token costs as much as a round, drafting does not pay
    assert best_k(0.3, 10.0, 10.0, 16) == 0
    p = KPolicy()
    for _ in range(30):
        p.update(8, 0, 100.0)
    assert p.alpha < 0.1 and p.choose(3.0) < 2
    # one accepted of 8 drafted is one hit in two tests (the first miss ends a round), not 1/8
    for _ in range(30):
        p.update(8, 1, 100.0)
    assert p.alpha == pytest.approx(0.5, abs=0.03) and 2 <= p.choose(3.0) <= 6
    assert KPolicy(pinned=6).choose(1.0) == 6


def test_adaptive_k_learns_what_each_verified_token_costs():
    rng = random.Random(0)

    def accepted(k: int) -> int:  # each draft right with probability 0.5, up to the first miss
        n = 0
        while n < k and rng.random() < 0.5:
            n += 1
        return n

    # a CPU ring with no round trip: a pass costs 20 ms plus 12 ms per drafted token, a draft token 1 ms.
    # at acceptance 0.5, E(1) / (20 + 13) = 1.5 / 33 < 1 / 20: drafting does not pay
    p = KPolicy()
    ks = []
    for _ in range(64):
        k = p.choose(1.0)
        ks.append(k)
        p.update(k, accepted(k), 20.0 + 12.0 * k, positions=k + 1)
    assert p.verify_ms == pytest.approx(12.0, rel=0.05) and p.base_ms == pytest.approx(20.0, rel=0.05)
    # K = 0, but one round in EXPLORE_EVERY still drafts, to keep alpha measured
    late = ks[32:]
    assert late.count(0) >= len(late) * 0.8 and 0 < late.count(1) <= len(late) // EXPLORE_EVERY + 1
    # the same draft and CPU behind an 86 ms round trip: 1.5 / 119 > 1 / 106, so it drafts every round
    wan = KPolicy()
    for _ in range(40):
        k = wan.choose(1.0)
        wan.update(k, accepted(k), 106.0 + 12.0 * k, positions=k + 1)
    assert all(wan.choose(1.0) >= 1 for _ in range(EXPLORE_EVERY))
    # a prompt's prefill (hundreds of positions in one pass) does not bend the line
    wan.update(0, 0, 900.0, positions=300)
    assert wan.base_ms == pytest.approx(106.0, rel=0.05)


def test_a_confident_drafter_gets_a_floor_at_the_rate_rounds_make_now():
    """The marginal rule of peers/speculation/adaptive.py: one more draft with chance P is worth its cost c = verify_ms +
    draft_ms when P > R * c, R the tokens per ms rounds make now."""
    p = KPolicy()
    assert p.plan(3.0, confident=True) == (p.choose(3.0), 0.0)  # nothing measured yet
    for k in (2, 4, 2, 4, 2, 4) * 4:
        p.update(k, 1, 100.0 + 10.0 * k, positions=k + 1)  # two tokens a round
    rate = 2.0 / (100.0 + 10.0 * 3)  # tokens per ms
    assert p.verify_ms == pytest.approx(10.0, rel=0.01)
    k, floor = p.plan(3.0, confident=True)
    assert k == p.k_max and floor == pytest.approx(rate * 13.0, rel=0.05)
    assert p.plan(3.0) == (p.choose(3.0), 0.0)  # a drafter with no confidence: one K
    assert KPolicy(pinned=5).plan(3.0, confident=True) == (5, 0.0)


def test_in_a_shared_pass_a_draft_pays_for_the_time_it_adds_to_every_round():
    """Four conversations share each pass and one policy: R is what the whole pass makes (four rounds' tokens per
    pass ms), a position costs the pass's own slope, so the floor is four times a lone conversation's."""
    alone, shared = KPolicy(), KPolicy()
    for k in (2, 4, 2, 4, 2, 4) * 4:
        alone.update(k, 1, 100.0 + 10.0 * k, positions=k + 1)
        for _ in range(4):  # the four rounds of one pass, each told it had a quarter of it
            shared.update(k, 1, 100.0 + 10.0 * k, positions=k + 1, share=0.25)
    assert shared.verify_ms == pytest.approx(alone.verify_ms) == pytest.approx(10.0, rel=0.01)
    assert shared.plan(3.0, confident=True)[1] == pytest.approx(4 * alone.plan(3.0, confident=True)[1], rel=0.05)


def test_a_position_costs_what_it_adds_to_a_pass_of_all_conversations_positions():
    """Alone, a second position costs 40 ms (one row's kernel to several rows'); in a pass that already carries
    four conversations' rows, one more costs 3 ms. The line and the table are over the pass's positions, so
    conversations that share passes learn the cheap slope even while none of them drafts, and verify drafts
    that one conversation alone would not."""
    p = KPolicy()
    cost = {1: 60.0, 2: 100.0, 3: 103.0, 4: 106.0, 5: 109.0, 6: 112.0}
    for _ in range(10):  # alone: 1 or 2 positions
        for k in (0, 1):
            p.update(k, 0, cost[k + 1], positions=k + 1)
    assert p.select([0.3]) == 0
    for _ in range(10):  # four, then three conversations of one position each share passes
        for b in (4, 3):
            for _ in range(b):
                p.update(0, 0, cost[b], positions=1, share=1 / b, others=b - 1)
    assert p.verify_ms == pytest.approx(3.0, rel=0.05) and p.others == 2
    assert p.select([0.3]) == 1  # (1 + 0.3) / pass_ms(4) beats 1 / pass_ms(3)
    assert p.plan(1.0, confident=True)[1] < 0.3  # the floor: R x (3 ms + 1 ms)


def test_the_likeliest_drafts_are_chosen_by_what_passes_of_each_size_cost():
    """A CPU's pass cost steps up where its matrix kernels change (measured here: 4 positions cost 14 ms more than
    3); the policy keeps what each size cost and verifies the number of the likeliest drafts that makes the most
    tokens per ms, not what a straight line through the costs suggests."""
    p = KPolicy()
    steps = {1: 100.0, 2: 104.0, 3: 108.0, 4: 140.0, 5: 144.0, 6: 148.0, 7: 152.0}
    for n in (1, 2, 3, 4, 5, 6, 7) * 3:
        p.update(n - 1, 1, steps[n], positions=n)
    assert p.pass_ms(4) == pytest.approx(140.0) and p.pass_ms(3) == pytest.approx(108.0)
    assert p.pass_ms(20) == pytest.approx(p.base_ms + 19 * p.verify_ms)  # never seen: the line
    sure = [0.7, 0.5, 0.2, 0.1, 0.1, 0.05, 0.05]
    # 2 drafts: (1 + 1.2) / 108 = 0.0204 tokens per ms; 3: 2.4 / 140 = 0.0171; 6: 2.65 / 152 = 0.0174
    assert p.select(sure) == 2
    assert p.select([0.7], pending=3) == 1  # 1.7 / 140 against 1 / 108: a pass that carries more
    assert p.select([0.9, 0.9, 0.9, 0.9, 0.9]) == 5  # sure enough to pay for the step
    assert p.select([0.01]) == 0 and KPolicy().select(sure) == len(sure)  # nothing measured yet: all
    # the drafter promised twice what was accepted: its confidences count half (and the floor doubles)
    twin = copy.deepcopy(p)
    for _ in range(30):
        p.update(2, 1, 104.0, positions=3, promised=2.0)
        twin.update(2, 1, 104.0, positions=3)
    assert p.trust == pytest.approx(0.5, abs=0.02) and twin.trust == 1.0
    assert p.plan(3.0, confident=True)[1] == pytest.approx(2 * twin.plan(3.0, confident=True)[1], rel=0.05)


def test_ask_json_reports_speculation(tiny_llama):
    got = ask_in_process(PROMPT, "--model", str(tiny_llama), "--local-peers", "1", "--max-new-tokens", "20",
                         "--draft", str(tiny_llama), "--k", "4",
                         "--in-flight", "1")  # (each round's drafts, as drafted)
    s = got["stats"]
    assert got["token_ids"] == reference_ids(tiny_llama, PROMPT, 20)
    assert s["tokens_per_round"] > 3 and s["acceptance"] == 1.0
    r = s["per_round"][1]
    assert r["k"] == 4 and set(r) >= {"draft_ms", "network_ms", "verify_ms", "peers", "hidden_draft_ms"}
