"""The static KV cache (peers/compute/kv.py) and the padded passes CUDA graphs replay (peers/compute/graphs.py), on the CPU: every
architecture answers exactly like plain transformers through rollbacks, trees of drafts, a replay on a fresh
cache and chunked prefill, both eagerly and padded to the graph buckets; a rollback only sets a length."""
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM

from peers.compute.graphs import bucket
from peers.base.limits import GRAPH_BUCKETS, cache_positions
from peers.compute.kv import RoomError
from peers.compute.shard import Shard, Span
from peers.speculation.tree import on_chain, verify_greedy
from tiny import ARCHS, make_model, one

PROMPT = [5, 17, 42, 99, 7, 3, 120, 64, 11, 250, 33, 8, 19, 140, 77, 2, 91, 60, 45, 23, 200, 13, 9, 31, 4, 55,
          181, 66, 70, 101, 16, 27, 38, 49, 150, 12, 222, 6, 88, 111] * 4  # a replay longer than a chunk
NEW = 32
CHUNK = GRAPH_BUCKETS[-1] + 1  # longer passes are cut into chunks of this many positions: one past every bucket
# drafts per round as (length, how many of them are right); "tree": the right tokens hide under a wrong first
# guess; "replay": the member lost everything and the whole conversation goes round again
ROUNDS = [(0, 0), (1, 1), (0, 0), (3, 1), (50, 2), (7, 7), (15, 2), "tree", (100, 1), (20, 0), (2, 2), "replay",
          (31, 5), (4, 0), "tree", (1, 0), (8, 3)]


def greedy(model_dir, new: int, prompt: list[int] = PROMPT) -> list[int]:
    """Plain transformers generate, greedy, not stopping at the end-of-text token."""
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ref.generation_config.eos_token_id = None
    with torch.inference_mode():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False)
    return out[0, len(prompt):].tolist()


def chunks(n: int, tail: int) -> list[tuple[int, int]]:
    """[start, end) pieces of at most CHUNK positions; the last keeps the drafts and the position before them."""
    cuts = [c for c in range(0, n, CHUNK) if c == 0 or c <= n - tail]
    return list(zip(cuts, cuts[1:] + [n]))


def run_rounds(shard: Shard, want: list[int]) -> tuple[list[int], set[int]]:
    """Generate like the ring does (rollback = the next pass's committed length), drafting from the answer:
    (the tokens produced, how many passes of each length)."""
    s, tokens, held, lengths, i = shard.new_session(), list(PROMPT), 0, Counter(), 0
    while len(tokens) < len(PROMPT) + len(want):
        plan = ROUNDS[i % len(ROUNDS)]
        i += 1
        truth = want[len(tokens) - len(PROMPT):] + [0] * GRAPH_BUCKETS[-1]
        wrong = [(t + 1) % 300 for t in truth]
        if plan == "replay":
            s, held = shard.new_session(), 0
            plan = (2, 1)
        if plan == "tree":  # node 0 is wrong; the truth is nodes 1 and 2 under the root: the path leaves the chain
            drafts, parents = [wrong[0], truth[0], truth[1]], [-1, -1, 1]
        else:
            k, right = plan
            drafts, parents = truth[:right] + wrong[right:k], None
        ids = tokens[held:] + drafts
        pieces = chunks(len(ids), len(drafts) + 1)
        for a, b in pieces:
            last = b == len(ids)
            h = one(shard, s, held + a, torch.tensor([ids[a:b]]), parents if last else None)
            lengths[b - a] += 1
        logits = shard.logits(h)[0, -(len(drafts) + 1):]
        path, nxt = verify_greedy(logits.argmax(-1).tolist(), drafts, parents or list(range(-1, len(drafts) - 1)))
        held = len(tokens) + on_chain(path)  # what every stage keeps: the chain's accepted nodes are in place
        tokens += [drafts[p] for p in path] + [nxt]
    return tokens[len(PROMPT):len(PROMPT) + len(want)], lengths


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_architecture_is_exact_eagerly_and_padded(arch, tmp_path):
    model = make_model(tmp_path / arch, arch, layers=3, seed=5)
    want = greedy(model, NEW)
    for padded in (False, True):
        shard = Shard(model, Span(0, 3, 3), embed=True, head=True, padded=padded)
        got, lengths = run_rounds(shard, want)
        assert got == want, padded
    assert CHUNK in lengths.elements()  # a chunk one past the largest bucket: eager, among the padded passes
    # what the padded passes were actually padded to: one (1, bucket) per pass of up to the largest bucket
    assert shard.graphs.padded == Counter((1, bucket(n)) for n in lengths.elements() if bucket(n))
    assert {t for _, t in shard.graphs.padded} == set(GRAPH_BUCKETS)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_pass_padded_to_its_bucket_equals_the_pass_itself(arch, tmp_path):
    model = make_model(tmp_path / arch, arch, layers=2, seed=6)
    exact = Shard(model, Span(0, 2, 2), embed=True, head=True)
    padded = Shard(model, Span(0, 2, 2), embed=True, head=True, padded=True)
    prefix = torch.tensor([PROMPT[:20]])
    for t in [1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32]:
        x = torch.tensor([(PROMPT * 2)[20:20 + t]])
        outs = []
        for shard in (exact, padded):
            s = shard.new_session()
            one(shard, s, 0, prefix)
            outs.append(one(shard, s, 20, x))
        assert outs[1].shape == outs[0].shape == (1, t, exact.hidden_size)
        torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


def test_a_rollback_sets_a_length_and_the_arena_never_moves(tiny_llama):
    shard = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, padded=True, context=64)
    keys = shard.arena.keys
    s = shard.new_session()
    one(shard, s, 0, torch.tensor([PROMPT[:10]]))
    assert s.length == 10 and s.row is not None
    one(shard, s, 10, torch.tensor([PROMPT[10:15]]))
    one(shard, s, 12, torch.tensor([[1, 2]]))  # three positions rolled back: nothing moves
    assert s.length == 14
    with pytest.raises(ValueError, match="committed"):
        one(shard, s, 15, torch.tensor([[1]]))
    one(shard, s, 14, torch.tensor([PROMPT[:30]]))  # a long pass: eager, and still in the same arena
    assert shard.arena.keys is keys and shard.arena.keys.shape[3] == cache_positions(64)


def test_a_full_room_refuses_in_one_line_and_a_padded_run_past_256_positions_is_exact(tiny_llama):
    """A small --max-context: a pass past a conversation's room is refused (its row untouched), and a run
    of 300 positions, padded as graphs run, answers as transformers does."""
    shard = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, padded=True, context=300,
                  conversations=2)
    room = shard.arena.room
    s = shard.new_session()
    one(shard, s, 0, torch.tensor([PROMPT]))
    with pytest.raises(RoomError, match="outgrown its room.*--max-context"):
        one(shard, s, len(PROMPT), torch.tensor([[7] * (room - len(PROMPT) + 1)]))
    assert s.length == len(PROMPT) and shard.arena.room == room
    want = greedy(tiny_llama, 300 - len(PROMPT))
    got, lengths = run_rounds(shard, want)
    assert got == want and len(PROMPT) + len(want) > 256
