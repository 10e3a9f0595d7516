"""On an NVIDIA GPU (scripts/gpu_check; skipped elsewhere): the ring is exact against transformers on the same
GPU in float32 and bfloat16, with CUDA graphs and without; a graph's replay equals the eager pass on every bucket
and in every architecture; quantized spans are stored quantized on the device; compiled drafts come and go
proposing what the eager draft does."""
import pytest
import torch
import trio
from transformers import AutoModelForCausalLM

from helpers import running_ring
from peers.plan import GRAPH_BUCKETS
from peers.shard import Shard, Span
from tiny import ARCHS, make_model

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ring_on_the_gpu_equals_transformers_there(dtype, graphs, tiny_llama):
    prompt, new = [5, 17, 42, 99, 7, 3, 120, 64], 16

    async def ring() -> list[int]:
        with trio.fail_after(90):  # a stuck ring fails here, with what its peer said, rather than hanging
            return await greedy_on_the_ring()

    async def greedy_on_the_ring() -> list[int]:
        extra = ["--device", "cuda", "--dtype", dtype] + ([] if graphs else ["--no-graphs"])
        async with running_ring(tiny_llama, 1, extra=extra, device="cuda", dtype=dtype, graphs=graphs) as (host, _):
            assert host.ring and host.ring[0].device.startswith("cuda")
            rs, tokens = host.new_session("gpu"), list(prompt)
            for _ in range(new):
                logits, _ = await host.forward(rs, tokens, [])
                tokens.append(int(logits[-1].argmax()))
                rs.set_position(len(tokens) - 1, len(tokens))
            return tokens[len(prompt):]

    got = trio.run(ring)
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=getattr(torch, dtype)).to("cuda").eval()
    with torch.inference_mode():
        want = ref.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=new, do_sample=False)
    assert got == want[0, len(prompt):].tolist()


@pytest.mark.parametrize("quant,stored", [("int8", torch.int8), ("nf4", torch.uint8)])
def test_quantized_span_is_quantized_on_the_gpu(quant, stored, tmp_path):
    # matrices wide enough that the allocator's rounding and NF4's per-block scales are small beside them
    model = make_model(tmp_path, "llama", layers=2, hidden=512)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    s = Shard(model, Span(0, 2, 2), embed=False, head=False, dtype="bfloat16", quant=quant, device="cuda")
    linears = [m for m in s.layers.modules() if hasattr(m, "weight") and getattr(m.weight, "ndim", 0) == 2]
    assert linears and all(m.weight.dtype == stored and m.weight.is_cuda for m in linears)
    full = sum(m.in_features * m.out_features * 2 for m in linears)  # the same matrices in bfloat16
    held = torch.cuda.memory_allocated() - before
    assert held < (0.7 if quant == "int8" else 0.5) * full, (held, full)
    x = torch.randn(1, 5, s.hidden_size)
    assert torch.isfinite(s.forward(s.new_session(), 0, x).float()).all()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_graph_replay_equals_the_eager_pass_on_every_bucket(arch, tmp_path):
    model = make_model(tmp_path / arch, arch, layers=2, seed=4)
    graphed = Shard(model, Span(0, 2, 2), embed=True, head=True, device="cuda")
    eager = Shard(model, Span(0, 2, 2), embed=True, head=True, device="cuda", graphs=False)
    assert graphed.graphs is not None and eager.graphs is None
    ids = [(7 * i + 3) % 250 for i in range(120)]

    def passes(shard, s):
        """A prefill (eager: longer than any bucket), then passes of every length up to 32, each keeping only
        its first position (the rest rolled back), and a tree."""
        out, at = [shard.forward(s, 0, torch.tensor([ids[:40]]))], 40
        for t in list(range(1, 33)) + [1, 2]:
            out.append(shard.forward(s, at, torch.tensor([ids[at:at + t]])))
            at += 1
        out.append(shard.forward(s, at, torch.tensor([ids[at:at + 5]]), [-1, 0, 1, -1]))
        return out

    slot = None
    for conversation in range(2):  # the second reuses the first's slot and its graphs
        s_graphed = graphed.new_session()
        if slot is not None:
            assert s_graphed.slot is slot
        slot = s_graphed.slot
        for a, b in zip(passes(graphed, s_graphed), passes(eager, eager.new_session())):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert not graphed.graphs.failed and set(slot.graphs) == set(GRAPH_BUCKETS)
        del s_graphed


def test_graph_drafts_one_after_another_propose_as_the_eager_draft(tiny_llama):
    """What crashed on torch < 2.13: a compiled draft, closed, then another (a bench row each), then a /draft
    switch, every proposal asked from a new thread (as trio's workers do); each equals the eager draft's, and a
    chat longer than the static cache goes on eagerly."""
    import threading

    from peers.chat import load_tokenizer
    from peers.drafting import ModelDrafter, make_drafter
    from peers.sampling import SamplingParams

    def on_a_thread(fn, *a):
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", fn(*a)))
        t.start()
        t.join()
        return out["r"]

    greedy = SamplingParams()  # float32: compiled and eager kernels then agree to far below any logit gap here
    eager = ModelDrafter(tiny_llama, 300, device="cuda", static=False)
    contexts = [[5, 17, 42, 99 + i] + list(range(30, 30 + 3 * i)) for i in range(6)]
    tok = load_tokenizer(tiny_llama)
    drafters = [lambda: ModelDrafter(tiny_llama, 300, device="cuda", max_len=64)] * 2 + [
        lambda: make_drafter(str(tiny_llama), tiny_llama, 300, tok, device="cuda")]
    for make in drafters:
        d = on_a_thread(make)
        assert d.static and d.step is not d.model  # compiled, CUDA graphs
        for ctx in contexts + [list(range(3, 90))]:  # the last one is past the 64-position static cache
            assert on_a_thread(d.propose, ctx, 4, greedy)[0] == eager.propose(ctx, 4, greedy)[0], ctx
        on_a_thread(d.close)
