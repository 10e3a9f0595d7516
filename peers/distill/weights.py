"""Making a feature draft (peers/speculation/drafting/feature_net.py): the head's vocabulary, the initial weights, saving."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from peers.speculation.drafting.feature_net import META_FILE, SHARED, VOCAB_FILE, FeatureDraft, target_tensors, build
from peers.models.checkpoint import weight_files as _weight_files
from peers.compute.loading import load_config


def choose_vocab(counts: torch.Tensor, size: int, always: set[int]) -> list[int]:
    """The `size` most written target ids (ties by id), the `always` ids (end of turn) first."""
    order = sorted(range(len(counts)), key=lambda i: (-int(counts[i]), i))
    rest = [i for i in order if i not in always]
    return sorted(always) + rest[: max(size - len(always), 0)]


def body_config(target_dir: Path, n_layers: int):
    """The target's config cut to the draft's layers; its token embedding is unused (it gets inputs_embeds)."""
    cfg = copy.deepcopy(load_config(target_dir))
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[-n_layers:]
    if hasattr(cfg, "max_window_layers"):
        cfg.max_window_layers = n_layers
    cfg.num_hidden_layers, cfg.vocab_size = n_layers, 1
    cfg.pad_token_id = cfg.bos_token_id = cfg.eos_token_id = None
    return cfg


def init_draft(target_dir: Path, ids: list[int], n_layers: int, seed: int) -> FeatureDraft:
    """A fresh draft: a seeded fc, the target's last layers and its final norm (the features' own scale)."""
    cfg = body_config(target_dir, n_layers)
    n_target = load_config(target_dir).num_hidden_layers
    names = {"body.norm.weight": "model.norm.weight"}
    files = _weight_files(Path(target_dir))
    for j, i in enumerate(range(n_target - n_layers, n_target)):
        names.update({k.replace(f"model.layers.{i}.", f"body.layers.{j}.", 1): k
                      for k in files if k.startswith(f"model.layers.{i}.")})
    torch.manual_seed(seed)
    fresh = FeatureDraft(cfg, len(ids), 1)
    state = {k: v for k, v in fresh.state_dict().items() if k not in SHARED}
    state.update(target_tensors(target_dir, names))
    return build(target_dir, cfg, ids, state)


def own_state(model: FeatureDraft) -> dict[str, torch.Tensor]:
    """What training changes and a draft directory stores: everything but the shared embedding and head."""
    return {k: v for k, v in model.state_dict().items() if k not in SHARED}


def save_draft(model: FeatureDraft, ids: list[int], out: Path, meta: dict) -> None:
    """Write the draft's own tensors (bfloat16: half the bytes), its config, its head's ids, its recipe."""
    out.mkdir(parents=True, exist_ok=True)
    model.body.config.save_pretrained(out)
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in own_state(model).items()}
    save_file(tensors, out / "model.safetensors.tmp")
    os.replace(out / "model.safetensors.tmp", out / "model.safetensors")
    for name, text in ((VOCAB_FILE, json.dumps(ids)), (META_FILE, json.dumps(meta, indent=1))):
        (out / (name + ".tmp")).write_text(text + "\n")
        os.replace(out / (name + ".tmp"), out / name)
