"""A re-plan's shard keeps what the previous one loaded (peers/compute/loading.py, Kept): the layers both spans hold,
the embedding and head, are the same modules, nothing of them is read again, and the new shard equals one
loaded from scratch."""
import torch

import peers.compute.loading as loading_module
from peers.base.span import Span
from peers.compute.shard import Shard


def params(s: Shard) -> dict:
    return {k: v for m in s.modules() for k, v in m.state_dict().items()} | {
        f"{i}.{k}": v for i, layer in enumerate(s.layers) for k, v in layer.state_dict().items()}


def test_a_grown_span_keeps_its_layers_and_head_and_reads_only_the_new_layer(tiny_llama, monkeypatch):
    old = Shard(tiny_llama, Span(0, 2, 4), embed=True, head=True, quant="int8")
    asked = []
    real = loading_module.locations
    monkeypatch.setattr(loading_module, "locations", lambda d, names: asked.extend(names) or real(d, names))
    new = Shard(tiny_llama, Span(0, 3, 4), embed=True, head=True, quant="int8",
                kept=old.keep(Span(0, 3, 4), embed=True, head=True))
    assert asked and all(n.startswith("model.layers.2.") for n in asked)
    assert new.layers[0] is old.layers[0] and new.layers[1] is old.layers[1]
    assert new.embed is old.embed and new.lm_head is old.lm_head and new.norm is old.norm
    fresh = Shard(tiny_llama, Span(0, 3, 4), embed=True, head=True, quant="int8")
    a, b = params(new), params(fresh)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_parts_loaded_another_way_are_not_kept(tiny_llama):
    old = Shard(tiny_llama, Span(0, 2, 4), embed=True, head=True, quant="int8")
    new = Shard(tiny_llama, Span(0, 2, 4), embed=True, head=True, quant="none",
                kept=old.keep(Span(0, 2, 4), embed=True, head=True))
    assert new.layers[0] is not old.layers[0] and new.embed is not old.embed
