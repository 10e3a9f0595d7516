"""The decoder families sfchat can split, and what each does around transformers' own decoder layers.

A shard runs embed -> layers -> norm -> head like the family's model forward; everything a family does
differently from Llama lives in its adapter here, so peers/compute/shard.py stays one generic loop:
- Llama 3.x (rope scaling lives in the rotary module), Qwen2/2.5, Qwen3 (q/k norms inside the layer), Mistral
  and Phi-3 (one sliding window for every layer, when the config sets one): nothing but the defaults.
- Gemma 2: attention logits soft-capped (sdpa cannot, so eager attention, as transformers itself picks), final
  logits soft-capped, embeddings scaled by sqrt(hidden) (a buffer the meta build leaves empty), norms with 1 + w
  (inside the norm module).
- Gemma 3 (text): as Gemma 2, plus a rotary embedding of its own per layer type (local layers use another base).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import get_layer_types_and_kwargs

from peers.base.errors import ModelError


class Family:
    """Llama and every family whose forward is embed -> one rotary for all layers -> layers -> norm -> head."""

    attention = "sdpa"  # what transformers picks for the family by default: the reference we must equal

    def __init__(self, label: str):
        self.label = label

    def layer_types(self, config) -> list[str]:
        """Each layer's kind of attention, as transformers' cache infers it (a config-wide sliding window
        makes every layer sliding)."""
        return list(get_layer_types_and_kwargs(config)[0])

    def prepare_embedding(self, config, embed: torch.nn.Module, device) -> None:
        """Fill what the meta build left unset in the embedding, once it is loaded."""

    def rotary(self, config, inner, device, kinds):
        """A function (hidden, positions) -> {kind of layer: (cos, sin)} for the kinds this shard holds."""
        rope = type(inner.rotary_emb)(config=config).to(device)
        return lambda h, pos: dict.fromkeys(kinds, rope(h, pos))

    def logits(self, config, logits: torch.Tensor) -> torch.Tensor:
        return logits


class Gemma(Family):
    attention = "eager"  # Gemma 2 soft-caps attention logits, which sdpa cannot

    def prepare_embedding(self, config, embed, device) -> None:
        # Gemma's embedding multiplies by sqrt(hidden_size) through a non-persistent buffer
        embed.embed_scale = torch.tensor(config.hidden_size**0.5, device=device)

    def logits(self, config, logits):
        # final soft-cap: cap * tanh(logits / cap), as Gemma*ForCausalLM does after the head
        cap = config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


class Gemma3(Gemma):
    attention = "sdpa"  # no attention soft-cap by default: transformers picks sdpa

    def rotary(self, config, inner, device, kinds):
        # local (sliding) layers use their own rope base: one (cos, sin) per kind of layer
        rope = type(inner.rotary_emb)(config=config).to(device)
        return lambda h, pos: {k: rope(h, pos, k) for k in kinds}


FAMILIES = {
    "llama": Family("Llama"),
    "qwen2": Family("Qwen2"),
    "qwen3": Family("Qwen3"),
    "mistral": Family("Mistral"),
    "phi3": Family("Phi-3"),
    "gemma2": Gemma("Gemma 2"),
    "gemma3_text": Gemma3("Gemma 3 (text)"),
}


def supported() -> str:
    return ", ".join(f.label for f in FAMILIES.values())


def family(model_type: str | None) -> Family:
    """The adapter for a config's model_type, or a one-line error naming what is supported."""
    f = FAMILIES.get(model_type or "")
    if f is None:
        raise ModelError(f"sfchat cannot split {model_type or 'this'} models; it runs {supported()}")
    return f
