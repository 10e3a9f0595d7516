"""Which drafter a --draft spec names, and the default for a target."""
from __future__ import annotations

from pathlib import Path

from .. import models
from .base import Drafter
from .feature import load as load_feature_draft
from .feature_net import is_distilled
from .model import ModelDrafter, check_same_tokenizer
from .ngram import NgramDrafter
from .shipped import shipped_draft


def make_drafter(spec: str | None, target_dir: Path, target_vocab: int, tokenizer, device: str = "cpu",
                 say=print) -> Drafter:
    """`none`, `ngram`, or a model (same names as --model). No spec: the best drafter known for the target."""
    if spec in (None, "", "auto"):
        # the draft distilled for the embedded default and shipped with the package, if there is one
        if (shipped := shipped_draft(target_dir)) is not None:
            return load_feature_draft(shipped, target_dir, tokenizer, target_vocab, device=device,
                                      name=f"{models.DEFAULT_MODEL}-draft")
        spec = "ngram"
    if spec == "none":
        return Drafter()
    if spec == "ngram":
        return NgramDrafter()
    draft_dir = models.resolve(spec, say=say)
    if is_distilled(draft_dir):  # made by `sfchat distill` for one target, whose tensors it shares
        return load_feature_draft(draft_dir, target_dir, tokenizer, target_vocab, device=device, name=spec)
    check_same_tokenizer(tokenizer, draft_dir)
    return ModelDrafter(draft_dir, target_vocab, device=device, name=spec)
