"""A static draft (what CUDA graphs need) computes every step on the one graph thread of the process, whichever of
trio's worker threads asks and however many drafters come and go (pytorch#123177: before torch 2.13 a second
thread fails inside cudagraph_trees). Past its static cache it goes on eagerly; a served conversation borrows it."""
import logging
import threading

import torch

from peers.drafting import ModelDrafter
from peers.drafting.model import Lent
from peers.sampling import SamplingParams

GREEDY = SamplingParams()


def from_a_thread(fn, *a):
    """fn(*a) on a thread of its own, as trio.to_thread would."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn(*a)))
    t.start()
    t.join()
    return out["r"]


def test_drafters_one_after_another_step_on_one_thread_that_outlives_them(tiny_llama):
    eager = ModelDrafter(tiny_llama, 300)
    seen = set()
    for n in range(2):  # a drafter, closed, then another (a /draft switch)
        d = ModelDrafter(tiny_llama, 300, static=True, max_len=256)
        d.model.register_forward_pre_hook(lambda *a: seen.add(threading.current_thread()))
        for i in range(3):
            ctx = [5, 17, 42, 99 + i + n]
            assert from_a_thread(d.propose, ctx, 4, GREEDY)[0] == eager.propose(ctx, 4, GREEDY)[0]
        from_a_thread(d.reset)
        d.close()
    assert len(seen) == 1 and next(iter(seen)).name.startswith("draft-graph"), seen
    assert next(iter(seen)).is_alive()  # never shut down while the process lives


def test_past_the_static_cache_the_draft_goes_on_eagerly(tiny_llama, caplog):
    eager, d = ModelDrafter(tiny_llama, 300), ModelDrafter(tiny_llama, 300, static=True, max_len=16)
    ctx = [(7 * i) % 250 + 3 for i in range(12)]
    with caplog.at_level(logging.WARNING, logger="peers.drafting"):
        for context in (ctx, ctx + [4, 5, 6, 7, 8], ctx + list(range(20, 40)), ctx[:10]):
            assert d.propose(context, 5, GREEDY)[0] == eager.propose(context, 5, GREEDY)[0]
    said = [r for r in caplog.records if "static cache" in r.getMessage()]
    assert len(said) == 1 and not d.static  # said once; eager from then on


def test_a_served_conversation_borrows_the_static_draft(tiny_llama):
    d = ModelDrafter(tiny_llama, 300, static=True, max_len=256)
    first, beside = d.fork(), d.fork()
    assert isinstance(first, Lent) and first.name == d.name  # the graphs' drafter itself, one answer at a time
    assert isinstance(beside, ModelDrafter) and not beside.static and beside.model is d.model
    ctx = [5, 17, 42, 99]
    assert first.propose(ctx, 4, GREEDY)[0] == beside.propose(ctx, 4, GREEDY)[0]
    assert first.tokens_made == d.tokens_made == 4
    first.close()
    assert isinstance(d.fork(), Lent)  # given back: the next answer borrows it


def test_the_draft_runs_in_the_dtype_it_is_given(tiny_llama):
    from peers.chat import load_tokenizer
    from peers.drafting import make_drafter

    d = make_drafter(str(tiny_llama), tiny_llama, 300, load_tokenizer(tiny_llama), dtype=torch.bfloat16)
    assert {p.dtype for p in d.model.parameters()} == {torch.bfloat16}
    assert d.bytes == sum(p.numel() * 2 for p in d.model.parameters())


def test_a_draft_that_does_not_fit_beside_the_host_is_refused_in_one_line(tiny_llama):
    import pytest

    from peers.chat import load_tokenizer
    from peers.drafting import make_drafter
    from peers.models import ModelError

    with pytest.raises(ModelError, match="needs 0.0 GB and the host has 0.0 GB free"):
        make_drafter(str(tiny_llama), tiny_llama, 300, load_tokenizer(tiny_llama), room=1000)
