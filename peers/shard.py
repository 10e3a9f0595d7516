"""One contiguous range of a model's decoder layers, loaded alone from safetensors and run with
transformers' own decoder layers and rotary embedding, on a static KV cache of our own (peers/kv.py) whose masks
are computed on the device, so short passes can replay as CUDA graphs (peers/graphs.py).

The first stage also holds the token embedding; the host's shard also holds the final norm and LM head.
"""
from __future__ import annotations

import time
import weakref
from functools import partial
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from . import architectures, kv, packed
from . import quant as quantization
from .checkpoint import Stored, locations, weight_files
from .cpu_linear import use_columns
from .graphs import Graphs, bucket
from .memory import release_freed
from .errors import ModelError
from .plan import Span
from .kv import SessionCache
from .reader import read, read_rows
from .tensors import DTYPES

SPARE_SLOTS = 1  # finished conversations' caches kept with their graphs for the next (memory the plan does not count)


def load_config(model_dir: Path):
    """The model's config, refused in one line if sfchat cannot split its architecture."""
    config = AutoConfig.from_pretrained(model_dir)
    family = architectures.family(config.model_type)
    if getattr(config, "quantization_config", None):
        del config.quantization_config
    config._attn_implementation = family.attention
    return config


def rollback_cache(config) -> DynamicCache:
    """A cache that can be trimmed back by the last pass's positions. A sliding-window layer keeps only its last
    window - 1 states unless told to keep a pass's worth more until the next trim (which every pass does)."""
    cache = DynamicCache(config=config)
    for layer in cache.layers:
        if hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()
    return cache


class Shard:
    def __init__(self, model_dir: Path, span: Span, *, embed: bool, head: bool,
                 dtype: str = "float32", quant: str = "none", device: str = "cpu", graphs: bool = True,
                 padded: bool = False):
        """graphs: capture CUDA graphs of short passes where the device is a GPU. padded: run short passes as
        the graphs do (padded to their bucket, over the whole cache) even where nothing is captured, which is
        how a CPU checks that path."""
        self.config = config = load_config(model_dir)
        if config.num_hidden_layers != span.n_layers:
            raise ModelError(f"model has {config.num_hidden_layers} layers, plan says {span.n_layers}")
        self.span, self.device, self.dtype = span, torch.device(device), DTYPES[dtype]
        self.hidden_size = config.hidden_size
        self.kv_heads = config.num_key_value_heads or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # the module tree is built on the meta device (no memory), then only our tensors are read and assigned
        with torch.device("meta"):
            full = AutoModelForCausalLM.from_config(config)
        inner = full.model
        packed.route(config)  # attention through peers/packed.py: several conversations can share a pass
        self.layers = torch.nn.ModuleList(inner.layers[span.start : span.end])
        self.embed = inner.embed_tokens if embed else None
        self.norm = inner.norm if head else None
        self.lm_head = full.lm_head if head else None
        self.family = architectures.family(config.model_type)
        self.layer_types = self.family.layer_types(config)
        self.rotary = self.family.rotary(config, inner, self.device, self._kinds())
        self.quant = quant
        if quant != "none":  # swapped on the meta device, each matrix quantized as it is read (peers/quant.py)
            quantization.swap_linears(self.layers, quant, self.dtype)
        self._load(model_dir)
        use_columns(self.layers, self.lm_head)  # on a CPU, the head's few rows at the memory's full speed
        if self.embed is not None:
            self.family.prepare_embedding(config, self.embed, self.device)
        del full, inner
        capture = graphs and self.device.type == "cuda"
        self.graphs = Graphs(self.device, capture) if capture or padded else None
        self.spare: list[kv.Slot] = []

    def _wanted(self) -> dict[str, tuple[torch.nn.Module, str]]:
        """checkpoint tensor name -> (module, parameter name in that module)"""
        want = {}
        for i, layer in zip(range(self.span.start, self.span.end), self.layers):
            for n, _ in layer.named_parameters():
                want[f"model.layers.{i}.{n}"] = (layer, n)
        if self.embed is not None:
            want["model.embed_tokens.weight"] = (self.embed, "weight")
        if self.norm is not None:
            want["model.norm.weight"] = (self.norm, "weight")
        return want

    def _load(self, model_dir: Path) -> None:
        files = weight_files(model_dir)  # every tensor's file, from the index (only this shard's need be here)
        want = self._wanted()
        if self.lm_head is not None:
            # a tied head is not stored: it *is* the embedding matrix (leaving it unset gives garbage text)
            head_key = "lm_head.weight" if "lm_head.weight" in files else "model.embed_tokens.weight"
            if head_key not in files:
                raise ModelError("the checkpoint has neither lm_head.weight nor embed_tokens to tie it to")
            want_head = {head_key: (self.lm_head, "weight")}
        else:
            want_head = {}
        missing = [k for k in want if k not in files]
        if missing:
            raise ModelError(f"checkpoint lacks {len(missing)} tensors of this shard, e.g. {missing[0]}")
        stored = locations(model_dir, list(want) + list(want_head))
        for k in list(want) + [k for k in want_head if k not in want]:
            st, moved = stored[k], None  # a tied head shares the embedding's tensor on the device
            for module, leaf in [self._slot(*t, st) for t in (want.get(k), want_head.get(k)) if t is not None]:
                if self.quant != "none" and quantization.is_quantized(module, leaf):  # read and quantized by rows
                    quantization.quantize(module, partial(read_rows, st, dtype=self.dtype), st.shape, self.device)
                    continue
                moved = read(st, self.dtype).to(self.device) if moved is None else moved
                setattr(module, leaf, torch.nn.Parameter(moved, requires_grad=False))
            del moved  # one tensor in full precision at a time
            if self.quant != "none":
                release_freed()
        for m in self.modules():
            m.eval().requires_grad_(False)
        release_freed()  # the full-precision copies read on the way

    def _slot(self, module: torch.nn.Module, name: str, st: Stored) -> tuple[torch.nn.Module, str]:
        """The module and attribute that module.name names, once the stored tensor's shape is the one it expects."""
        *path, leaf = name.split(".")
        for p in path:
            module = getattr(module, p)
        old = getattr(module, leaf)
        if tuple(old.shape) != tuple(st.shape):
            raise ModelError(f"tensor {name} has shape {tuple(st.shape)}, the model expects {tuple(old.shape)}")
        return module, leaf

    def modules(self) -> list[torch.nn.Module]:
        return [m for m in (self.layers, self.embed, self.norm, self.lm_head) if m is not None]

    def new_session(self) -> SessionCache:
        """A conversation's cache on this shard: a slot with graphs a finished conversation left, or a new one."""
        slot = self.spare.pop() if self.spare else kv.Slot(self.span.size, self.kv_heads, self.head_dim, self.dtype,
                                                           self.device)
        s = SessionCache(slot)
        weakref.finalize(s, kv.recycle, weakref.ref(self), slot, SPARE_SLOTS)
        return s

    @torch.inference_mode()
    def forward(self, s: SessionCache, committed: int, x: torch.Tensor,
                parents: list[int] | None = None) -> torch.Tensor:
        """Run x (ids [1,T] on the first stage, else hidden [1,T,H]) at positions committed..committed+T-1, on
        the first `committed` positions the cache holds: setting that length is the ring's only rollback rule.
        `parents`: the last len(parents) positions are a tree of drafts (peers/tree.py), each at its depth and
        seeing its ancestors."""
        if committed > s.length:
            raise ValueError(f"frame says {committed} positions are committed but this peer holds {s.length}")
        s.length = committed
        s.last_used = time.monotonic()
        x = x.to(self.device) if self.embed is not None else x.to(self.device, self.dtype)
        t = x.shape[1]
        b = bucket(t) if self.graphs is not None and not self.graphs.failed else None
        h = self.graphs.call(self._pass, s.slot, committed, x, parents, b) if b else self._pass(
            s.slot, committed, x, parents, None)
        s.length = committed + t
        return h

    @torch.inference_mode()
    def forward_many(self, items: list[tuple[SessionCache, int, torch.Tensor, list[int] | None]]) -> list[torch.Tensor]:
        """Several conversations' passes as one (peers/packed.py): each item is forward's (cache, committed, x,
        parents); returns each one's hidden states. Eager: the positions of all of them packed in one sequence."""
        if len(items) == 1:
            return [self.forward(*items[0])]
        for s, committed, x, _ in items:
            if committed > s.length:
                raise ValueError(f"frame says {committed} positions are committed but this peer holds {s.length}")
        bounds, start = [], 0
        for _, _, x, _ in items:
            bounds.append((start, start + x.shape[1]))
            start += x.shape[1]
        x = torch.cat([x.to(self.device) for _, _, x, _ in items], dim=1)
        if self.embed is None:
            x = x.to(self.dtype)
        h = self._step_many(items, x, bounds)
        for s, committed, x_i, _ in items:
            s.length, s.last_used = committed + x_i.shape[1], time.monotonic()
        return [h[:, a:b] for a, b in bounds]

    def _step_many(self, items, x: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        if not self.span.size:
            return h
        slots, indices, views, metas = [], [], [], []
        for s, committed, x_i, parents in items:
            t = x_i.shape[1]
            s.slot.reserve(committed + t)
            slots.append(s.slot)
            indices.append(committed + torch.arange(t, device=self.device))
            views.append(self._views(committed, t))
            metas.append(kv.unpack(kv.meta(committed, t, parents, t).to(self.device), t))
        pos = torch.cat([m[1] for m in metas], dim=1)
        masks = {kind: packed.Packed([self._mask(*m, v[layer], kind) for m, v in zip(metas, views)], bounds)
                 for kind, layer in self._kinds().items()}
        ropes = self.rotary(h, pos)
        cache = packed.Writer(slots, self.span.start, indices, views, bounds)
        for i, layer in zip(range(self.span.start, self.span.end), self.layers):
            kind = self.layer_types[i]
            h = layer(h, attention_mask=masks[kind], position_embeddings=ropes[kind], position_ids=pos,
                      cache=cache, use_cache=True)
        return h

    def _pass(self, slot: kv.Slot, committed: int, x: torch.Tensor, parents, b: int | None) -> torch.Tensor:
        """Padded to bucket b and over the slot's whole capacity (what a graph replays), or, for b None, exactly
        T positions over the columns the masks need (eager: no work on columns nobody sees)."""
        t = x.shape[1]
        slot.reserve(committed + (b or t))
        meta = kv.meta(committed, t, parents, b or t)  # on the host: a graph copies it into its own buffer
        if b is not None:
            return self.graphs.run(self._step, slot, b, x, meta)
        return self._step(slot, x, meta.to(self.device), self._views(committed, t))

    def _views(self, committed: int, t: int) -> dict[int, tuple[int, int]]:
        """Each layer's cache columns in an eager pass: up to the pass's end, from the window's start for a
        sliding layer (its earliest row is at position `committed`)."""
        window = self._window("sliding_attention") or 0
        lo = {"full_attention": 0, "sliding_attention": max(0, committed - window + 1)}
        return {i: (lo[self.layer_types[i]], committed + t) for i in range(self.span.start, self.span.end)}

    def _step(self, slot: kv.Slot, x: torch.Tensor, meta: torch.Tensor, views=None) -> torch.Tensor:
        """The layers over one pass, everything computed on the device from x and meta (peers/kv.py). views:
        each layer's cache columns; None: the whole capacity, the same shapes every time."""
        t = x.shape[1]
        committed, pos, sees = kv.unpack(meta, t)
        if views is None:
            views = dict.fromkeys(range(self.span.start, self.span.end), (0, slot.capacity))
        h = self.embed(x) if self.embed is not None else x
        if not self.span.size:
            return h
        masks = {kind: self._mask(committed, pos, sees, views[layer], kind) for kind, layer in self._kinds().items()}
        ropes = self.rotary(h, pos)
        cache = kv.Writer(slot, self.span.start, committed + torch.arange(t, device=self.device), views)
        for i, layer in zip(range(self.span.start, self.span.end), self.layers):
            kind = self.layer_types[i]
            h = layer(h, attention_mask=masks[kind], position_embeddings=ropes[kind], position_ids=pos,
                      cache=cache, use_cache=True)
        return h

    def _mask(self, committed, pos, sees, view: tuple[int, int], kind: str) -> torch.Tensor:
        mask = kv.visible(committed, pos, sees, *view, self._window(kind))
        if self.config.sfchat_attention == "eager":  # eager attention adds its mask to the scores
            return torch.zeros(mask.shape, dtype=self.dtype, device=self.device).masked_fill(
                ~mask, torch.finfo(self.dtype).min)
        return mask

    def _window(self, kind: str) -> int | None:
        return getattr(self.config, "sliding_window", None) if kind == "sliding_attention" else None

    def _kinds(self) -> dict[str, int]:
        """Each kind of attention among this shard's layers -> the first layer of that kind."""
        kinds: dict[str, int] = {}
        for i in range(self.span.start, self.span.end):
            kinds.setdefault(self.layer_types[i], i)
        return kinds

    @torch.inference_mode()
    def finish(self, h: torch.Tensor, n_logits: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The final normalised hidden states at every position (what a feature draft reads) and the logits at
        the last n_logits."""
        feats = self.norm(h.to(self.device, self.dtype))
        return feats, self.family.logits(self.config, self.lm_head(feats[..., -n_logits:, :])).float()

    @torch.inference_mode()
    def finish_many(self, passes: list[tuple[torch.Tensor, int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """finish for several conversations' hidden states [T_i, H] at once: the norm and the LM head (the largest
        matrix of all) run once over the positions of all of them."""
        feats = self.norm(torch.cat([h for h, _ in passes]).to(self.device, self.dtype))
        parts = torch.split(feats, [h.shape[0] for h, _ in passes])
        last = torch.cat([p[-n:] for p, (_, n) in zip(parts, passes)])
        logits = self.family.logits(self.config, self.lm_head(last)).float()
        return list(zip(parts, torch.split(logits, [n for _, n in passes])))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.finish(h, h.shape[-2])[1]
