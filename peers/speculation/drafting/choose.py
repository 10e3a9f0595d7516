"""Which drafter a --draft spec names, and the default for a target."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from peers.models import source as models
from peers.base.errors import ModelError
from peers.speculation.drafting.base import Drafter
from peers.speculation.drafting.feature import load as load_feature_draft
from peers.speculation.drafting.feature_net import is_distilled
from peers.speculation.drafting.model import ModelDrafter, check_same_tokenizer
from peers.speculation.drafting.ngram import NgramDrafter
from peers.speculation.drafting.shipped import shipped_draft
from peers.speculation.drafting.siblings import sibling_draft

SIMULATED = "simulated:"  # bench only (simulated.py)


def make_drafter(spec: str | None, target_dir: Path, target_vocab: int, tokenizer, device: str = "cpu",
                 say=print, dtype: torch.dtype = torch.float32, hub_id: str | None = None,
                 room: int | None = None, embedding: torch.Tensor | None = None) -> Drafter:
    """`none`, `ngram`, or a model (same names as --model), run in `dtype`. No spec: the best drafter known for
    the target: the shipped draft of the embedded default, the sibling of a hub model `hub_id` (peers/speculation/drafting/
    siblings.py) if it can be had and its weights fit in `room` bytes, else ngram. `embedding`: the host's token
    embedding, which a feature draft shares."""
    if spec in (None, "", "auto"):
        # the draft distilled for the embedded default and shipped with the package, if there is one
        if (shipped := shipped_draft(target_dir)) is not None:
            return load_feature_draft(shipped, target_dir, tokenizer, target_vocab, device=device,
                                      name=f"{models.DEFAULT_MODEL}-draft", dtype=dtype, embedding=embedding)
        if (sibling := sibling_draft(hub_id)) is not None:
            try:
                return sibling_drafter(sibling, target_vocab, tokenizer, device, say, dtype, room)
            except ModelError as e:
                say(f"draft: ngram, since {e} (choose one with --draft MODEL, or --draft ngram to skip this)")
        spec = "ngram"
    if spec == "none":
        return Drafter()
    if spec == "ngram":
        return NgramDrafter()
    if spec.startswith(SIMULATED):
        raise ModelError(f"--draft {spec} is for `sfchat bench` only")
    draft_dir = models.resolve(spec, say=say)
    if is_distilled(draft_dir):  # made by `sfchat distill` for one target, whose tensors it shares
        return load_feature_draft(draft_dir, target_dir, tokenizer, target_vocab, device=device, name=spec,
                                  dtype=dtype, embedding=embedding)
    check_same_tokenizer(tokenizer, draft_dir)
    from peers.models.checkpoint import tensor_shapes

    check_room(spec, tensor_shapes(draft_dir), dtype, room)
    return ModelDrafter(draft_dir, target_vocab, device=device, dtype=dtype, name=spec)


def check_room(name: str, shapes: dict[str, list[int]], dtype: torch.dtype, room: int | None) -> None:
    """A draft's weights in `dtype` must fit in `room` bytes (what the host has free beside its own layers)."""
    need = sum(math.prod(s) for s in shapes.values()) * dtype.itemsize
    if room is not None and need > room:
        raise ModelError(f"{name} needs {need / 2**30:.1f} GB and the host has {room / 2**30:.1f} GB free")


def sibling_drafter(repo_id: str, target_vocab: int, tokenizer, device: str, say, dtype: torch.dtype,
                    room: int | None) -> ModelDrafter:
    """The sibling draft, fetched like the target (Hugging Face cache, offline mode, progress); its weights must
    fit in `room` (what the host has free once its span is loaded) before any of them is fetched."""
    source = models.open_source(repo_id, say=say)
    check_room(repo_id, source.tensor_shapes(), dtype, room)
    draft_dir = source.fetch_all()
    check_same_tokenizer(tokenizer, draft_dir)
    return ModelDrafter(draft_dir, target_vocab, device=device, dtype=dtype, name=repo_id)
