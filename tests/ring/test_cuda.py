"""On an NVIDIA GPU (scripts/gpu_check; skipped elsewhere): the ring is exact against transformers on the same
GPU in float32 and bfloat16, with CUDA graphs and without; a graph's replay equals the eager pass on every bucket
and in every architecture and batch shape; a capture that fails warns once; a long chat captures nothing new;
quantized spans are stored quantized on the device; model drafts propose there what they do on the CPU."""
import pytest
import torch
import trio
from transformers import AutoModelForCausalLM

from helpers import running_ring
from peers.base.limits import GRAPH_BUCKETS
from peers.compute.shard import Shard, Span
from tiny import ARCHS, make_model, one

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
    assert torch.isfinite(one(s, s.new_session(), 0, x).float()).all()


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
        out, at = [one(shard, s, 0, torch.tensor([ids[:40]]))], 40
        for t in list(range(1, 33)) + [1, 2]:
            out.append(one(shard, s, at, torch.tensor([ids[at:at + t]])))
            at += 1
        out.append(one(shard, s, at, torch.tensor([ids[at:at + 5]]), [-1, 0, 1, -1]))
        return out

    for conversation in range(2):  # the second conversation replays the first's graphs
        s_graphed = graphed.new_session()
        for a, b in zip(passes(graphed, s_graphed), passes(eager, eager.new_session())):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert not graphed.graphs.failed and {t for _, t in graphed.graphs.graphs} == set(GRAPH_BUCKETS)
        del s_graphed
    assert graphed.graphs.captured == len(GRAPH_BUCKETS)  # (1, T) for every T: captured once, for both


def test_packed_passes_replay_graphs_of_each_batch_shape(tmp_path):
    """B conversations of different lengths in one pass: a graph per (B bucket, T bucket), each replay equal
    to each conversation's own eager pass."""
    model = make_model(tmp_path / "llama", "llama", layers=2, seed=4)
    graphed = Shard(model, Span(0, 2, 2), embed=True, head=True, device="cuda", conversations=5)
    eager = Shard(model, Span(0, 2, 2), embed=True, head=True, device="cuda", graphs=False, conversations=5)
    prompts = [[(7 * i + j) % 250 for i in range(9 + 3 * j)] for j in range(5)]
    pairs = [(graphed.new_session(), eager.new_session()) for _ in prompts]
    for (g, e), p in zip(pairs, prompts):
        one(graphed, g, 0, torch.tensor([p]))
        one(eager, e, 0, torch.tensor([p]))
    for b in (2, 3, 5):
        items = [(len(p), torch.tensor([[5 + j] * (1 + j)]), None) for j, p in enumerate(prompts[:b])]
        got = graphed.forward([(g, c, x, q) for (g, _), (c, x, q) in zip(pairs, items)])
        want = [one(eager, e, c, x, q) for (_, e), (c, x, q) in zip(pairs, items)]
        for a, w in zip(got, want):
            torch.testing.assert_close(a, w, atol=1e-4, rtol=1e-4)
    assert {(2, 2), (4, 4), (8, 8)} <= set(graphed.graphs.graphs)


def test_a_capture_that_fails_warns_once_and_answers_as_eager(tmp_path, monkeypatch, caplog):
    import logging

    from peers.compute.runtime import RUNTIME

    model = make_model(tmp_path / "llama", "llama", layers=2, seed=4)
    graphed = Shard(model, Span(0, 2, 2), embed=True, head=True, device="cuda")
    eager = Shard(model, Span(0, 2, 2), embed=True, head=True, device="cuda", graphs=False)

    def broken(*a, **k):
        raise RuntimeError("capture refused")

    monkeypatch.setattr(RUNTIME, "capture", broken)
    ids = [(7 * i + 3) % 250 for i in range(40)]
    sg, se = graphed.new_session(), eager.new_session()
    with caplog.at_level(logging.WARNING, logger="sfchat.graphs"):
        for at in range(20, 26):
            a = one(graphed, sg, at if at > 20 else 0, torch.tensor([ids[at if at > 20 else 0:at + 1]]))
            b = one(eager, se, at if at > 20 else 0, torch.tensor([ids[at if at > 20 else 0:at + 1]]))
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    said = [r for r in caplog.records if "CUDA graphs are off" in r.getMessage()]
    assert len(said) == 1 and graphed.graphs.failed and not graphed.graphs.graphs


def test_a_long_conversation_makes_no_new_capture(tmp_path):
    """Past 600 positions (once, every 256 positions re-captured everything): the arena never moves."""
    model = make_model(tmp_path / "llama", "llama", layers=2, seed=4)
    shard = Shard(model, Span(0, 2, 2), embed=True, head=True, device="cuda", context=1024)
    s, at = shard.new_session(), 0
    one(shard, s, 0, torch.tensor([[3] * 40]))
    at = 40
    while at < 100:
        one(shard, s, at, torch.tensor([[5]]))
        at += 1
    captured, keys = shard.graphs.captured, shard.arena.keys.data_ptr()
    while at < 650:
        one(shard, s, at, torch.tensor([[5]]))
        at += 1
    assert captured >= 1 and shard.graphs.captured == captured and shard.arena.keys.data_ptr() == keys


def test_model_drafts_on_the_gpu_propose_as_on_the_cpu(tiny_llama):
    """A model draft runs on the pass engine there too (graphed, on the runtime's thread), asked from new
    threads as trio's workers do; nothing is compiled."""
    import threading

    from peers.speculation.drafting import ModelDrafter
    from peers.speculation.sampling import SamplingParams

    def on_a_thread(fn, *a):
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", fn(*a)))
        t.start()
        t.join()
        return out["r"]

    greedy = SamplingParams()
    cpu = ModelDrafter(tiny_llama, 300)
    d = on_a_thread(lambda: ModelDrafter(tiny_llama, 300, device="cuda"))
    contexts = [[5, 17, 42, 99 + i] + list(range(30, 30 + 3 * i)) for i in range(6)]
    for ctx in contexts:
        assert on_a_thread(d.propose, ctx, 4, greedy)[0] == cpu.propose(ctx, 4, greedy)[0], ctx
    assert d.model.shard.graphs.captured >= 1
