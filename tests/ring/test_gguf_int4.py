"""The embedded default (a Q4_1 GGUF) on a CPU: its 4-bit matrices go into the int4 kernel's layout from their
own grid, never read as float32, and a ring of them answers what one process does."""
from functools import partial

import torch

from peers.compute import loading
from peers.compute.shard import Shard, Span
from peers.models.gguf_grid import stored_grid
from peers.models.reader import read


def test_the_embedded_default_s_matrices_load_from_their_grid_with_no_float_read(smollm2, monkeypatch):
    grid = stored_grid(smollm2)
    assert len(grid) == 30 * 7  # every Q4_1 matrix of the file (its embedding is Q8_0: widened)
    float_reads = []

    def spy(real, st, *a, **kw):
        float_reads.append((st.path.name, st.shape))
        return real(st, *a, **kw)

    monkeypatch.setattr(loading, "read", partial(spy, loading.read))
    monkeypatch.setattr(loading, "read_rows", partial(spy, loading.read_rows))
    s = Shard(smollm2, Span(0, 3, 30), embed=False, head=False, quant="int4")
    assert float_reads and all(len(shape) == 1 for _, shape in float_reads), float_reads  # the norms only
    q = s.layers[2].self_attn.q_proj
    step = read(grid["model.layers.2.self_attn.q_proj.weight"][2], torch.bfloat16)
    assert torch.equal(q.scales_zeros[..., 0].t(), step)  # scale = the block's own d


def test_a_ring_of_the_embedded_default_in_int4_answers_what_one_process_does(smollm2):
    import trio

    from helpers import greedy_reply, running_ring

    async def reply(n_peers: int):
        flags = ["--quant", "int4", "--dtype", "bfloat16"]
        async with running_ring(smollm2, n_peers, extra=flags, quant="int4", dtype="bfloat16") as (host, _):
            logits, _ = await host.forward(host.new_session("check"), [1, 504, 3458, 314, 260, 1345], [])
            return await greedy_reply(host, "Name three colours.", 16), logits, host.members_info()

    ring, ring_logits, members = trio.run(reply, 2)
    alone, alone_logits, _ = trio.run(reply, 0)
    assert len(members) == 3 and all(m["quant"] == "int4" for m in members)
    assert ring == alone and len(ring) == 16
    assert torch.equal(ring_logits, alone_logits)
