"""Layers a re-plan takes from a process stay with it as spares (peers/compute/spares.py): the plan that hands them
back reads nothing, and the shard it makes equals one loaded from scratch."""
import torch
import trio

import peers.compute.loading as loading_module
from peers.base.span import Span
from peers.compute.shard import Shard
from peers.compute.memory import module_bytes
from peers.compute.spares import Spares


def replan(shard: Shard, spares: Spares, span: Span, quant: str = "int4") -> Shard:
    kept = spares.trade(shard.keep(span, embed=True, head=True), shard.held(), span)
    return Shard(shard.loaded_as[0], span, embed=True, head=True, quant=quant, kept=kept)


def test_layers_handed_back_come_from_the_spares_and_nothing_is_read(tiny_llama, monkeypatch):
    spares = Spares("cpu")
    whole = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant="int4")
    third = whole.layers[3]
    half = replan(whole, spares, Span(0, 2, 4))  # a member came back: layers 2-3 are its again
    assert set(spares.layers) == {2, 3} and spares.bytes == sum(map(module_bytes, whole.layers[2:]))
    asked = []
    real = loading_module.locations
    monkeypatch.setattr(loading_module, "locations", lambda d, names: asked.extend(names) or real(d, names))
    again = replan(half, spares, Span(0, 4, 4))  # and lost again: layers 2-3 back here
    assert not asked, asked
    assert again.layers[3] is third and not spares.layers
    fresh = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant="int4")
    x = torch.randint(0, 100, (1, 5))
    a, b = again.new_session(), fresh.new_session()
    assert torch.equal(again.forward([(a, 0, x, None)])[0], fresh.forward([(b, 0, x, None)])[0])


def test_spares_of_another_quantization_are_not_used(tiny_llama):
    spares = Spares("cpu")
    half = replan(Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant="int4"), spares, Span(0, 2, 4))
    again = replan(half, spares, Span(0, 4, 4), quant="int8")
    assert again.layers[2] is not None and not spares.layers
    assert all(type(m).__name__ != "Int4Linear" for m in again.layers[2].modules())


def test_spares_are_no_more_layers_than_the_process_holds(tiny_llama):
    spares = Spares("cpu")
    replan(Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant="int4"), spares, Span(0, 1, 4))
    assert set(spares.layers) == {1}


def test_nothing_is_kept_on_a_gpu_past_the_offer_or_past_its_share_of_memory(tiny_llama, monkeypatch):
    gpu = Spares("cuda:0")
    replan(Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant="int4"), gpu, Span(0, 2, 4))
    assert not gpu.layers
    whole = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant="int4")
    one = module_bytes(whole.layers[3])
    offered = Spares("cpu", room=lambda: one)  # --offer-gb leaves room for one layer beyond the plan
    replan(whole, offered, Span(0, 2, 4))
    assert set(offered.layers) == {2}
    monkeypatch.setattr("peers.compute.spares.free_bytes", lambda device: 0)
    tight = Spares("cpu")
    replan(Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant="int4"), tight, Span(0, 2, 4))
    assert not tight.layers and tight.bytes == 0


def test_layers_warmed_up_beforehand_make_the_same_shard_and_are_not_read_again(tiny_llama, monkeypatch):
    """A member gone silent: what a plan without it would give this process is loaded as spares first."""
    spares = Spares("cpu")
    half = Shard(tiny_llama, Span(0, 2, 4), embed=True, head=True, quant="int4")
    trio.run(spares.warm, Span(0, 4, 4), half.held(), half.loaded_as, half.config)
    assert set(spares.layers) == {2, 3}
    asked = []
    real = loading_module.locations
    monkeypatch.setattr(loading_module, "locations", lambda d, names: asked.extend(names) or real(d, names))
    whole = replan(half, spares, Span(0, 4, 4))
    assert not asked, asked
    fresh = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant="int4")
    x = torch.randint(0, 100, (1, 5))
    a, b = whole.new_session(), fresh.new_session()
    assert torch.equal(whole.forward([(a, 0, x, None)])[0], fresh.forward([(b, 0, x, None)])[0])
