"""Loading a shard's parts: the module tree built on the meta device (no memory), its linears swapped for
quantized ones, then only the tensors of its span read from safetensors (each matrix quantized as it is read, one
full-precision tensor at a time), or taken over from the shard before it on the same process (Kept).

The first stage also holds the token embedding; the host's also the final norm and LM head.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from peers.base.errors import ModelError
from peers.base.span import Span
from peers.compute import cpu_quant, packed, quant as quantization
from peers.compute.memory import release_freed
from peers.models import families as architectures
from peers.models.checkpoint import Stored, locations, weight_files
from peers.models.gguf_grid import stored_grid
from peers.models.reader import read, read_rows


def load_config(model_dir: Path):
    """The model's config, refused in one line if sfchat cannot split its architecture."""
    config = AutoConfig.from_pretrained(model_dir)
    family = architectures.family(config.model_type)
    if getattr(config, "quantization_config", None):
        del config.quantization_config
    config._attn_implementation = family.attention
    return config


@dataclass
class Kept:
    """What a shard hands the next one on the same process: its loaded layers by index, its embedding and head,
    and what they were loaded as. A re-plan that moves a span's ends then reads and quantizes only the layers the
    new span lacks (a member lost: the others take its layers on in about the time their own would take)."""

    loaded_as: tuple  # (model_dir, dtype, quant, device)
    layers: dict[int, torch.nn.Module]
    embed: torch.nn.Module | None = None
    norm: torch.nn.Module | None = None
    lm_head: torch.nn.Module | None = None


@dataclass
class Parts:
    """A span's loaded modules (embed, norm and head None where the shard holds none), and the model's inner
    module tree they came from (its rotary embedding is built from it)."""

    layers: torch.nn.ModuleList
    embed: torch.nn.Module | None
    norm: torch.nn.Module | None
    lm_head: torch.nn.Module | None
    inner: torch.nn.Module
    loaded_as: tuple

    def modules(self) -> list[torch.nn.Module]:
        return [m for m in (self.layers, self.embed, self.norm, self.lm_head) if m is not None]


def load_parts(model_dir: Path, config, span: Span, *, embed: bool, head: bool, dtype: torch.dtype, dtype_name: str,
               quant: str, device: torch.device, kept: Kept | None = None) -> Parts:
    """The parts of `span` on `device`, `kept` ones reused where they were loaded the same way."""
    with torch.device("meta"):
        full = AutoModelForCausalLM.from_config(config)
    inner = full.model
    packed.route(config)  # attention through peers/compute/packed.py: several conversations can share a pass
    parts = Parts(torch.nn.ModuleList(inner.layers[span.start : span.end]), inner.embed_tokens if embed else None,
                  inner.norm if head else None, full.lm_head if head else None, inner,
                  (Path(model_dir), dtype_name, quant, str(device)))
    # swapped on the meta device, each matrix quantized as it is read: torch's int4/int8 kernels on a CPU
    # (the head too: the largest matrix of all), bitsandbytes for nf4 and on CUDA (peers/compute/quant.py)
    on_cpu = device.type == "cpu" and quant in cpu_quant.KINDS
    quantizer = cpu_quant if on_cpu else quantization
    if on_cpu:
        cpu_quant.swap_linears(parts.layers, quant)
        # the head in int8 whatever the kind: a GGUF's embedding is mostly 6 or 8 bits, and 4 cost 3% perplexity
        parts.lm_head = cpu_quant.swapped(parts.lm_head, "int8")
    elif quant != "none":
        if quant not in quantization.KINDS:
            raise ModelError(f"--quant {quant} runs on a CPU only; on CUDA use --quant nf4 or int8")
        quantization.swap_linears(parts.layers, quant, dtype)
    reused = _reuse(parts, span, kept if kept is not None and kept.loaded_as == parts.loaded_as else None)
    _read(parts, model_dir, span, reused, dtype, quant, quantizer, device)
    return parts


def _reuse(parts: Parts, span: Span, kept: Kept | None) -> set[int]:
    """Put the kept parts in place of the meta-device ones; the ids of the modules reused (not read again)."""
    reused = []
    for i, layer in (kept.layers.items() if kept is not None else ()):
        if span.start <= i < span.end:
            parts.layers[i - span.start] = layer
            reused.append(layer)
    if kept is not None and parts.embed is not None and kept.embed is not None:
        parts.embed = kept.embed
        reused.append(parts.embed)
    if kept is not None and parts.lm_head is not None and kept.lm_head is not None:
        parts.norm, parts.lm_head = kept.norm, kept.lm_head
        reused += [parts.norm, parts.lm_head]
    return {id(m) for m in reused}


def _wanted(parts: Parts, span: Span, reused: set[int]) -> dict[str, tuple[torch.nn.Module, str]]:
    """checkpoint tensor name -> (module, parameter name in that module)"""
    want = {}
    for i, layer in zip(range(span.start, span.end), parts.layers):
        for n, _ in layer.named_parameters() if id(layer) not in reused else ():
            want[f"model.layers.{i}.{n}"] = (layer, n)
    if parts.embed is not None and id(parts.embed) not in reused:
        want["model.embed_tokens.weight"] = (parts.embed, "weight")
    if parts.norm is not None and id(parts.norm) not in reused:
        want["model.norm.weight"] = (parts.norm, "weight")
    return want


def _read(parts: Parts, model_dir: Path, span: Span, reused: set[int], dtype: torch.dtype, quant: str, quantizer,
          device: torch.device) -> None:
    files = weight_files(model_dir)  # every tensor's file, from the index (only this shard's need be here)
    want = _wanted(parts, span, reused)
    if parts.lm_head is not None and id(parts.lm_head) not in reused:
        # a tied head is not stored: it *is* the embedding matrix (leaving it unset gives garbage text)
        head_key = "lm_head.weight" if "lm_head.weight" in files else "model.embed_tokens.weight"
        if head_key not in files:
            raise ModelError("the checkpoint has neither lm_head.weight nor embed_tokens to tie it to")
        want_head = {head_key: (parts.lm_head, "weight")}
    else:
        want_head = {}
    missing = [k for k in want if k not in files]
    if missing:
        raise ModelError(f"checkpoint lacks {len(missing)} tensors of this shard, e.g. {missing[0]}")
    stored = locations(model_dir, list(want) + list(want_head))
    grid = stored_grid(model_dir) if quantizer is cpu_quant else {}  # a GGUF's 4-bit matrices, as they were
    for k in list(want) + [k for k in want_head if k not in want]:
        st, moved = stored[k], None  # a tied head shares the embedding's tensor on the device
        for module, leaf in [_slot(*t, st) for t in (want.get(k), want_head.get(k)) if t is not None]:
            if isinstance(module, cpu_quant.Int4Linear) and k in grid:
                cpu_quant.take_grid(module, grid[k])
                continue
            if quant != "none" and quantizer.is_quantized(module, leaf):  # read and quantized by rows
                full_precision = torch.float32 if quantizer is cpu_quant else dtype
                quantizer.quantize(module, partial(read_rows, st, dtype=full_precision), st.shape, device)
                continue
            moved = read(st, dtype).to(device) if moved is None else moved
            setattr(module, leaf, torch.nn.Parameter(moved, requires_grad=False))
        del moved  # one tensor in full precision at a time
        if quant != "none":
            release_freed()
    for m in parts.modules():
        m.eval().requires_grad_(False)
    release_freed()  # the full-precision copies read on the way


def _slot(module: torch.nn.Module, name: str, st: Stored) -> tuple[torch.nn.Module, str]:
    """The module and attribute that module.name names, once the stored tensor's shape is the one it expects."""
    *path, leaf = name.split(".")
    for p in path:
        module = getattr(module, p)
    old = getattr(module, leaf)
    if tuple(old.shape) != tuple(st.shape):
        raise ModelError(f"tensor {name} has shape {tuple(st.shape)}, the model expects {tuple(old.shape)}")
    return module, leaf
