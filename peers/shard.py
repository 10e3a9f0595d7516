"""One contiguous range of a model's decoder layers, loaded alone from safetensors and run with
transformers' own decoder layers, rotary embedding, masks and cache.

The first stage also holds the token embedding; the host's shard also holds the final norm and LM head.
"""
from __future__ import annotations

import time
from functools import partial
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from . import architectures, tree
from . import quant as quantization
from .checkpoint import Stored, locations
from .memory import release_freed
from .models import ModelError
from .plan import Span
from .reader import read, read_rows
from .tensors import DTYPES

@dataclass
class SessionCache:
    """One conversation's KV cache for this shard's layers, and how many positions it holds."""

    cache: DynamicCache
    length: int = 0
    last_used: float = field(default_factory=time.monotonic)


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
                 dtype: str = "float32", quant: str = "none", device: str = "cpu"):
        self.config = config = load_config(model_dir)
        if config.num_hidden_layers != span.n_layers:
            raise ModelError(f"model has {config.num_hidden_layers} layers, plan says {span.n_layers}")
        self.span, self.device, self.dtype = span, torch.device(device), DTYPES[dtype]
        self.hidden_size = config.hidden_size
        # the module tree is built on the meta device (no memory), then only our tensors are read and assigned
        with torch.device("meta"):
            full = AutoModelForCausalLM.from_config(config)
        inner = full.model
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
        if self.embed is not None:
            self.family.prepare_embedding(config, self.embed, self.device)
        del full, inner

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
        stored = locations(model_dir)
        want = self._wanted()
        if self.lm_head is not None:
            # a tied head is not stored: it *is* the embedding matrix (leaving it unset gives garbage text)
            head_key = "lm_head.weight" if "lm_head.weight" in stored else "model.embed_tokens.weight"
            if head_key not in stored:
                raise ModelError("the checkpoint has neither lm_head.weight nor embed_tokens to tie it to")
            want_head = {head_key: (self.lm_head, "weight")}
        else:
            want_head = {}
        missing = [k for k in want if k not in stored]
        if missing:
            raise ModelError(f"checkpoint lacks {len(missing)} tensors of this shard, e.g. {missing[0]}")
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
        return SessionCache(rollback_cache(self.config))

    @torch.inference_mode()
    def forward(self, s: SessionCache, committed: int, x: torch.Tensor,
                parents: list[int] | None = None) -> torch.Tensor:
        """Trim the cache to `committed` positions, then run x (ids [1,T] on the first stage, else hidden [1,T,H])
        at positions committed..committed+T-1. The trim is the ring's only rollback rule. `parents`: the last
        len(parents) positions are a tree of drafts (peers/tree.py), each at its depth and seeing its ancestors."""
        if committed > s.length:
            raise ValueError(f"frame says {committed} positions are committed but this peer holds {s.length}")
        if s.length:  # negative: drop the uncommitted tail (0: a sliding window's surplus); only our layers hold any
            for layer in s.cache.layers[self.span.start : self.span.end]:
                layer.crop(committed - s.length)
        s.length = committed
        s.last_used = time.monotonic()
        h = self.embed(x.to(self.device)) if self.embed is not None else x.to(self.device, self.dtype)
        t = h.shape[1]
        if self.span.size:
            if parents is None:
                pos = torch.arange(committed, committed + t, device=self.device).unsqueeze(0)
                masks = self._masks(h, s.cache, pos)
            else:
                pos = tree.positions(committed, t, parents).to(self.device)
                masks = self._tree_masks(s.cache, committed, t, parents)
            ropes = self.rotary(h, pos)
            for i, layer in zip(range(self.span.start, self.span.end), self.layers):
                kind = self.layer_types[i]
                h = layer(h, attention_mask=masks[kind], position_embeddings=ropes[kind],
                          position_ids=pos, cache=s.cache, use_cache=True)
        s.length = committed + t
        return h

    def _kinds(self) -> dict[str, int]:
        """Each kind of attention among this shard's layers -> the first layer of that kind (whose cache says
        which columns a mask needs: a sliding window's keeps only its last window - 1)."""
        kinds: dict[str, int] = {}
        for i in range(self.span.start, self.span.end):
            kinds.setdefault(self.layer_types[i], i)
        return kinds

    def _masks(self, h, cache, pos) -> dict:
        make = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
        return {kind: make[kind](config=self.config, inputs_embeds=h, attention_mask=None, cache=cache,
                                 position_ids=pos, layer_idx=layer) for kind, layer in self._kinds().items()}

    def _tree_masks(self, cache, committed: int, t: int, parents: list[int]) -> dict:
        masks = {}
        for kind, layer in self._kinds().items():
            window = self.config.sliding_window if kind == "sliding_attention" else None
            full = tree.attention_mask(committed, t, parents, window, self.device)
            length, offset = cache.get_mask_sizes(t, layer)
            masks[kind] = full[..., offset : offset + length]
            if self.config._attn_implementation == "eager":  # eager attention adds its mask to the scores
                masks[kind] = torch.zeros_like(masks[kind], dtype=self.dtype).masked_fill(
                    ~masks[kind], torch.finfo(self.dtype).min)
        return masks

    @torch.inference_mode()
    def finish(self, h: torch.Tensor, n_logits: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The final normalised hidden states at every position (what a feature draft reads) and the logits at
        the last n_logits."""
        feats = self.norm(h.to(self.device, self.dtype))
        return feats, self.family.logits(self.config, self.lm_head(feats[..., -n_logits:, :])).float()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.finish(h, h.shape[-2])[1]
