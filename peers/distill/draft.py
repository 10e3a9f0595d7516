"""The draft: a few of the target's own decoder layers (copied as initialisation) between the target's embedding
and a reduced LM head.

The head keeps only the rows of the target tokens written most often (as EAGLE-3 / FR-Spec do: on a small draft
the head is most of the cost, and rare tokens are rarely accepted anyway). The input embedding stays whole:
reading rare context tokens as one shared row cost far more agreement than the smaller head did. Embedding
and head rows are frozen copies of the target's, so a draft directory stores only its layers and final norm
(a few MB) and takes the rest from its target's files when loaded; distill.json records which target.
Verification is unchanged: the draft proposes target ids, and its q is zero outside its head's rows.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..drafters import ModelDrafter
from ..fingerprint import config_fingerprint
from ..models import DEFAULT_MODEL, ModelError
from ..shard import _weight_files, load_config

VOCAB_FILE = "draft_vocab.json"  # [target id of head row 0, of row 1, ...]
META_FILE = "distill.json"  # the recipe, the counts reached, the target's identity, measured agreement
SHARED = ("model.embed_tokens.weight", "lm_head.weight")  # taken from the target, never stored with the draft


def tokenizer_fingerprint(tok) -> str:
    return hashlib.sha256(json.dumps(sorted(tok.get_vocab().items())).encode()).hexdigest()


def choose_vocab(counts: torch.Tensor, size: int, always: set[int]) -> list[int]:
    """The `size` most written target ids (ties by id), the `always` ids (end of turn) first."""
    order = sorted(range(len(counts)), key=lambda i: (-int(counts[i]), i))
    rest = [i for i in order if i not in always]
    return sorted(always) + rest[: max(size - len(always), 0)]


def layer_choice(n_target: int, n_draft: int) -> list[int]:
    """Evenly spaced target layers, the first and the last included: what the draft starts from."""
    if n_draft == 1:
        return [0]
    return [round(i * (n_target - 1) / (n_draft - 1)) for i in range(n_draft)]


def draft_config(target_dir: Path, n_layers: int):
    cfg = copy.deepcopy(load_config(target_dir))
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in layer_choice(cfg.num_hidden_layers, n_layers)]
    if hasattr(cfg, "max_window_layers"):
        cfg.max_window_layers = n_layers
    cfg.num_hidden_layers, cfg.tie_word_embeddings = n_layers, False  # its head is its own (fewer rows)
    return cfg


def _target_tensors(target_dir: Path, names: dict[str, str]) -> dict[str, torch.Tensor]:
    """{our name: target tensor name} -> {our name: tensor}, read from the target's safetensors only."""
    files = _weight_files(Path(target_dir))
    out = {}
    for ours, theirs in names.items():
        with safe_open(files[theirs], framework="pt") as f:
            out[ours] = f.get_tensor(theirs).float()
    return out


def build(target_dir: Path, cfg, ids: list[int], state: dict[str, torch.Tensor]):
    """The draft model: `state` (its layers and norm) plus the target's embedding and the head rows `ids`."""
    from transformers import AutoModelForCausalLM

    head = "lm_head.weight" if "lm_head.weight" in _weight_files(Path(target_dir)) else SHARED[0]  # tied: the embedding
    shared = _target_tensors(target_dir, {SHARED[0]: SHARED[0], "head": head})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.lm_head = torch.nn.Linear(cfg.hidden_size, len(ids), bias=False)
    model.load_state_dict({**state, SHARED[0]: shared[SHARED[0]], SHARED[1]: shared["head"][torch.tensor(ids)]})
    model.get_input_embeddings().requires_grad_(False)
    model.lm_head.requires_grad_(False)
    return model


def init_draft(target_dir: Path, ids: list[int], n_layers: int):
    """A fresh draft: the target's layers chosen by layer_choice, and its final norm."""
    cfg = draft_config(target_dir, n_layers)
    names = {"model.norm.weight": "model.norm.weight"}
    files = _weight_files(Path(target_dir))
    for j, i in enumerate(layer_choice(load_config(target_dir).num_hidden_layers, n_layers)):
        names.update({k.replace(f"model.layers.{i}.", f"model.layers.{j}.", 1): k
                      for k in files if k.startswith(f"model.layers.{i}.")})
    return build(target_dir, cfg, ids, _target_tensors(target_dir, names))


def own_state(model) -> dict[str, torch.Tensor]:
    """What training changes and a draft directory stores: everything but the shared embedding and head."""
    return {k: v for k, v in model.state_dict().items() if k not in SHARED}


def save_draft(model, ids: list[int], out: Path, meta: dict) -> None:
    """Write the draft's layers and norm (bfloat16: half the bytes), its config, its head's ids, its recipe."""
    out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(out)
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in own_state(model).items()}
    save_file(tensors, out / "model.safetensors.tmp")
    os.replace(out / "model.safetensors.tmp", out / "model.safetensors")
    for name, text in ((VOCAB_FILE, json.dumps(ids)), (META_FILE, json.dumps(meta, indent=1))):
        (out / (name + ".tmp")).write_text(text + "\n")
        os.replace(out / (name + ".tmp"), out / name)


def is_distilled(d: Path) -> bool:
    d = Path(d)
    return all((d / f).is_file() for f in (VOCAB_FILE, META_FILE, "config.json", "model.safetensors"))


def read_meta(d: Path) -> dict:
    return json.loads((Path(d) / META_FILE).read_text())


class DistilledDrafter(ModelDrafter):
    """ModelDrafter whose next-token logits are spread from the head's rows back over the target's vocabulary
    (-inf elsewhere): greedy proposes only kept ids, and q is exactly 0 outside them."""

    def __init__(self, draft_dir: Path, target_dir: Path, target_vocab: int, dtype: torch.dtype = torch.float32, **kw):
        ids = json.loads((Path(draft_dir) / VOCAB_FILE).read_text())
        if max(ids) >= target_vocab:
            raise ModelError(f"the draft {Path(draft_dir).name} proposes ids beyond the target's vocabulary")
        model = build(target_dir, load_config(draft_dir), ids, load_file(Path(draft_dir) / "model.safetensors"))
        super().__init__(draft_dir, target_vocab, model=model.to(dtype), dtype=dtype, **kw)
        self.to_target = torch.tensor(ids, device=self.device)

    @torch.inference_mode()
    def _feed(self, tokens: list[int]) -> None:
        super()._feed(tokens)
        full = self.next_logits.new_full((self.target_vocab,), float("-inf"))
        full[self.to_target] = self.next_logits
        self.next_logits = full


def load(draft_dir: Path, target_dir: Path, tokenizer, target_vocab: int, device: str = "cpu",
         name: str | None = None) -> DistilledDrafter:
    meta = read_meta(draft_dir)
    if meta.get("target_config") != config_fingerprint(target_dir) or \
            meta.get("tokenizer") != tokenizer_fingerprint(tokenizer):
        raise ModelError(f"the draft {Path(draft_dir).name} was distilled for another model ({meta.get('target')})")
    return DistilledDrafter(draft_dir, target_dir, target_vocab, device=device, name=name)


def drafts_dir() -> Path:
    """Shipped drafts: assets/drafts/<target name> in the source tree (SFCHAT_DRAFTS_DIR overrides)."""
    return Path(os.environ.get("SFCHAT_DRAFTS_DIR") or Path(__file__).resolve().parents[2] / "assets" / "drafts")


def shipped_draft(target_dir: Path) -> Path | None:
    """The shipped draft for the embedded default target, if there is one and it was distilled from this very
    model (same config); else None."""
    from ..locations import models_dir

    if Path(target_dir).resolve() != (models_dir() / DEFAULT_MODEL).resolve():
        return None
    d = drafts_dir() / DEFAULT_MODEL
    if not is_distilled(d):
        return None
    return d if read_meta(d).get("target_config") == config_fingerprint(target_dir) else None
