"""Trees of drafts (peers/speculation/tree.py): every node gets exactly the logits of a plain forward over its own path, the
caches keep the main chain, greedy verification walks the tree, malformed parents are refused, and answers
through a real peer process stay identical to transformers wherever in the tree the target's tokens are."""
import pytest
import torch
import trio
from transformers import AutoModelForCausalLM

from helpers import new_chat, reference_ids, running_ring
from peers.wire import codec as wire
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams
from peers.compute.shard import Shard, Span
from peers.speculation.tree import Draft, depth_first, on_chain, verify_greedy
from peers.base.tree_layout import check_parents
from peers.wire.schema import forward_frame
from tiny import one

PROMPT = "the quick brown fox jumps over the lazy dog"
# node: 0 1 2 3 4 5 6 (the main chain is 0, 1, 2)
TREE = dict(tokens=[11, 12, 13, 21, 22, 31, 32], parents=[-1, 0, 1, 0, 3, -1, 5])


@pytest.mark.parametrize("arch", ["llama", "sliding"])
def test_every_node_gets_the_logits_of_its_own_path(arch, tiny_llama, sliding_qwen2):
    model_dir = tiny_llama if arch == "llama" else sliding_qwen2
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    n = ref.config.num_hidden_layers
    shard = Shard(model_dir, Span(0, n, n), embed=True, head=True)
    s = shard.new_session()
    context = [5, 17, 42, 99, 7, 3, 250, 11, 60, 8]
    one(shard, s, 0, torch.tensor([context[:6]]))  # the ring already holds 6; the pass brings 4 more + the tree
    tokens, parents = TREE["tokens"], TREE["parents"]
    logits = shard.logits(one(shard, s, 6, torch.tensor([context[6:] + tokens]), parents))[0]

    def plain(ids):
        with torch.no_grad():
            return ref(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(logits[3], plain(context), atol=1e-4, rtol=1e-4)
    for i in range(len(tokens)):
        torch.testing.assert_close(logits[4 + i], plain(context + Draft(tokens, parents).path(i)), atol=1e-4, rtol=1e-4)
    # the target took 11, 12 (on the main chain), then its own token: the next pass keeps them and goes on
    nxt = shard.logits(one(shard, s, len(context) + 2, torch.tensor([[77]])))[0, -1]
    torch.testing.assert_close(nxt, plain(context + [11, 12, 77]), atol=1e-4, rtol=1e-4)


def test_greedy_verification_walks_down_the_tree():
    tokens, parents = TREE["tokens"], TREE["parents"]
    # the target's argmax after the root, node 0, 1, ..., 6
    assert verify_greedy([11, 12, 13, 9, 0, 0, 0, 0], tokens, parents) == ([0, 1, 2], 9)
    assert verify_greedy([11, 21, 0, 0, 22, 5, 0, 0], tokens, parents) == ([0, 3, 4], 5)
    assert verify_greedy([31, 0, 0, 0, 0, 0, 32, 6], tokens, parents) == ([5, 6], 6)
    assert verify_greedy([40, 0, 0, 0, 0, 0, 0, 0], tokens, parents) == ([], 40)
    assert on_chain([0, 1, 2]) == 3 and on_chain([0, 3, 4]) == 1 and on_chain([5, 6]) == 0
    assert Draft(tokens, parents).chain == 3


def test_a_tree_made_level_by_level_is_laid_out_depth_first_with_the_main_chain_leading():
    # level by level: a, b under the root; c, d under a; e under b; f under c
    tokens, parents, sure = [1, 2, 3, 4, 5, 6], [-1, -1, 0, 0, 1, 2], [0.6, 0.3, 0.4, 0.1, 0.2, 0.3]
    d, _ = depth_first(tokens, parents, sure, {0: 3, 1: 5, 2: 6, 5: 9})
    assert d.tokens == [1, 3, 6, 4, 2, 5] and d.parents == [-1, 0, 1, 0, -1, 4]
    assert d.sure == [0.6, 0.4, 0.3, 0.1, 0.3, 0.2] and d.chain == 3 and d.guess == 9
    assert [d.path(i) for i in (2, 5)] == [[1, 3, 6], [2, 5]]


def test_the_likeliest_nodes_keep_their_ancestors_and_a_cut_main_chain_gives_the_guess():
    d = Draft(TREE["tokens"], TREE["parents"], [0.9, 0.5, 0.2, 0.3, 0.1, 0.08, 0.05], guess=14)
    top = d.likeliest(4)  # 0.9, 0.5, 0.3, 0.2: nodes 0, 1, 3, 2
    assert (top.tokens, top.parents, top.chain, top.guess) == ([11, 12, 13, 21], [-1, 0, 1, 0], 3, 14)
    cut = d.likeliest(3)  # the main chain loses node 2: its token is now the guess
    assert (cut.tokens, cut.parents, cut.chain, cut.guess) == ([11, 12, 21], [-1, 0, 0], 2, 13)
    assert d.likeliest(0).tokens == [] and d.likeliest(0).guess == 11
    assert d.likeliest(7).tokens == d.tokens


@pytest.mark.parametrize("parents", [[0, 0, 0, 0], [-2, 0, 1, 2], [-1, 1, 1, 2], [-1, 0, 0, 5], [-1, 0, 0], "-1",
                                     [-1, True, 0, 0], None])
def test_malformed_parents_are_refused(parents):
    with pytest.raises(ValueError):
        check_parents(parents, 4)
    frame = {"t": "fwd", "sid": "s", "seq": 0, "epoch": 1, "committed": 0, "n_logits": 5, "trace": [],
             "x": {"dtype": "float32", "shape": [1, 6, 8]}, "raw": bytearray(6 * 8 * 4), "parents": parents}
    with pytest.raises(wire.WireError, match="fwd: "):
        forward_frame(frame, 8)
    assert forward_frame({**frame, "parents": [-1, 0, 0, 2]}, 8).shape == (1, 6, 8)
    with pytest.raises(wire.WireError, match="more drafts than positions"):
        forward_frame({**frame, "n_logits": 8, "parents": [-1] * 7}, 8)


class OracleTrees(Drafter):
    """Knows the answer (`truth`, the whole conversation) and hides it in the tree at a different place each
    round: on the main chain, under a wrong first guess, deep off the chain, nowhere, and a full chain whose guess
    at the next token is right (a look-ahead then starts the next round)."""

    name, confident, trees = "oracle", True, True

    def __init__(self, truth: list[int]):
        self.truth, self.asked = truth, 0  # asked: by a round itself, not by a look-ahead

    def propose_tree(self, context, floor, depth, max_nodes, stop=None, params=None):
        t = self.truth[len(context):] + [0] * 4
        wrong = [(x + 1) % 300 for x in t]
        self.asked += stop is None
        shape = self.asked % 5 if stop is None else 4  # a look-ahead's tree is always a good one
        if shape == 0:
            return Draft([t[0], t[1], wrong[2]], [-1, 0, 1], [0.9, 0.8, 0.7])
        if shape == 1:
            return Draft([wrong[0], wrong[1], t[0], t[1], wrong[2]], [-1, 0, -1, 2, 3], [0.9, 0.8, 0.5, 0.4, 0.3])
        if shape == 2:
            return Draft([t[0], wrong[1], t[1], t[2]], [-1, 0, 0, 2], [0.9, 0.8, 0.5, 0.4])
        if shape == 3:
            return Draft([wrong[0]], [-1], [0.9], guess=t[0])
        return Draft([t[0], t[1]], [-1, 0], [0.9, 0.8], guess=t[2])


class TreePolicy(KPolicy):
    def plan(self, draft_ms, confident=False):
        return 6, 0.2


def test_answers_are_exact_wherever_the_tree_holds_the_target_s_tokens(tiny_llama):
    want = reference_ids(tiny_llama, PROMPT, 40)

    async def main():
        async with running_ring(tiny_llama, 1) as (host, _):
            chat = new_chat(host)
            prompt_ids = chat.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}],
                                                            add_generation_prompt=True, tokenize=True)
            prompt_ids = list(prompt_ids["input_ids"] if not isinstance(prompt_ids, list) else prompt_ids)
            oracle = OracleTrees(prompt_ids + want)
            _, r = await chat.reply(PROMPT, drafter=oracle, params=SamplingParams(), policy=TreePolicy(in_flight=1),
                                    max_new_tokens=40)  # (one round at a time: each round's tree as drafted)
            return r, oracle
    r, oracle = trio.run(main)
    assert r.token_ids == want
    accepted = [rd["accepted"] for rd in r.rounds]
    assert {0, 2, 3} <= set(accepted)  # nothing, two on the chain or off it, three off the chain
    # after a full chain whose guess came true, the next round took the tree the look-ahead drafted meanwhile
    assert oracle.asked < len(r.rounds)


def test_a_sampled_answer_through_trees_is_the_one_the_target_samples_alone(tiny_llama):
    """A deterministic tree in a sampled round: at each node the target draws its token (seeded by the position)
    and goes on down where a child holds it. So the answer is exactly the one it samples with no draft, while
    the trees (holding those tokens on and off their main chains) save rounds. Without trees (--no-trees) the
    same drafter drafts no tree at all."""
    async def main():
        async with running_ring(tiny_llama, 1) as (host, _):
            alone = new_chat(host)
            _, plain = await alone.reply(PROMPT, drafter=Drafter(), params=SamplingParams(0.9, seed=3),
                                         policy=KPolicy(), max_new_tokens=40)
            oracle = OracleTrees(alone.tokens)
            _, treed = await new_chat(host).reply(PROMPT, drafter=oracle, params=SamplingParams(0.9, seed=3),
                                                  policy=TreePolicy(), max_new_tokens=40)
            _, chains = await new_chat(host).reply(PROMPT, drafter=OracleTrees(alone.tokens),
                                                   params=SamplingParams(0.9, seed=3),
                                                   policy=TreePolicy(trees=False), max_new_tokens=40)
            return plain, treed, chains
    plain, treed, chains = trio.run(main)
    assert treed.token_ids == plain.token_ids == chains.token_ids
    assert {2, 3} <= {rd["accepted"] for rd in treed.rounds} and len(treed.rounds) < len(plain.rounds)
    assert treed.stats.trees > 0 and chains.stats.trees == 0
