"""A model draft runs on the ring's pass engine (peers/compute/shard.py): nothing compiled, in the dtype it is given, its
conversations' forks sharing one set of weights and one arena, each with a row of its own; through rollbacks and
padded like a graph replays, its drafts are a fresh drafter's."""
import torch

from peers.speculation.drafting import ModelDrafter
from peers.speculation.drafting.model import DraftModel
from peers.speculation.sampling import SamplingParams

GREEDY = SamplingParams()
CTX = [(7 * i) % 250 + 3 for i in range(12)]


def test_forks_share_the_weights_and_each_has_a_row(tiny_llama):
    d = ModelDrafter(tiny_llama, 300)
    forks = [d.fork() for _ in range(3)]
    assert all(f.model is d.model for f in forks)
    for i, f in enumerate(forks):
        f.propose(CTX + [i], 3, GREEDY)
    rows = {f.cache.row for f in forks} | {d.cache.row}
    assert None not in {f.cache.row for f in forks} and len(rows - {None}) == 3


def test_drafts_through_rollbacks_equal_a_fresh_drafters_eager_and_padded(tiny_llama):
    d = ModelDrafter(tiny_llama, 300)
    padded = DraftModel(tiny_llama, "cpu", torch.float32, 2)
    padded.shard = type(padded.shard)(tiny_llama, padded.shard.span, embed=True, head=True, padded=True,
                                      conversations=2)
    p = ModelDrafter(None, 300, name="padded", model=padded)
    for context in (CTX, CTX + [4, 5, 6, 7, 8], CTX + list(range(20, 40)), CTX[:10], CTX[:10] + [9]):
        want = ModelDrafter(tiny_llama, 300).propose(context, 5, GREEDY)[0]
        assert d.propose(context, 5, GREEDY)[0] == want
        assert p.propose(context, 5, GREEDY)[0] == want
    assert padded.shard.graphs.padded[(1, 1)] > 0  # its one-token steps took the graphs' padded path


def test_a_model_draft_compiles_nothing(tiny_llama, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("torch.compile was called")

    monkeypatch.setattr(torch, "compile", refuse)
    d = ModelDrafter(tiny_llama, 300)
    assert d.propose(CTX, 4, GREEDY)[0]


def test_the_draft_runs_in_the_dtype_it_is_given(tiny_llama):
    from peers.conversation.chat import load_tokenizer
    from peers.speculation.drafting import make_drafter

    d = make_drafter(str(tiny_llama), tiny_llama, 300, load_tokenizer(tiny_llama), dtype=torch.bfloat16)
    shard = d.model.shard
    params = [p for m in shard.modules() for p in m.parameters()]
    assert {p.dtype for p in params} == {torch.bfloat16} and shard.arena.keys.dtype == torch.bfloat16
    weights = sum(p.numel() * 2 for p in {id(p): p for p in params}.values())
    assert d.bytes == weights + shard.arena.bytes  # its real bytes: weights and arena


def test_conversations_drafting_at_once_share_each_forward(tiny_llama, monkeypatch, caplog):
    """Three chains of 5, 2 and 3 drafts at once: each what it drafts alone, in as many forwards as the longest
    chain has steps, its first ones carrying all three conversations; the fallback (each alone) not taken."""
    import trio

    contexts = [CTX, CTX[:7] + [201, 202], [9, 8, 7] + CTX]
    ns = [5, 2, 3]
    base = ModelDrafter(tiny_llama, 300)
    want = [ModelDrafter(tiny_llama, 300).propose(c, n, GREEDY)[0] for c, n in zip(contexts, ns)]
    sizes, forward = [], base.model._forward
    monkeypatch.setattr(base.model, "_forward", lambda steps: sizes.append(len(steps)) or forward(steps))
    forks = [base.fork() for _ in contexts]
    got = [None] * 3

    async def main():
        async def one(i):
            got[i] = (await forks[i].draft(contexts[i], ns[i], GREEDY))[0]
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)

    with caplog.at_level("WARNING", logger="peers.drafting"):
        trio.run(main)
    assert got == want
    assert sizes == [3, 3, 2, 1, 1]  # steps: the context, then a draft's each; chains leave as they end
    assert not [r for r in caplog.records if "drafts this step alone" in r.getMessage()]
