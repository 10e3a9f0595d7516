"""The draft: a few of the target's own decoder layers (copied as initialisation) over a reduced vocabulary.

It is saved as an ordinary transformers causal LM whose rows are: 0 = "any other token", then the target's most
frequent tokens (as EAGLE-3 / FR-Spec do: the LM head is most of a small draft's cost, and rare tokens are
rarely accepted anyway). draft_vocab.json maps rows back to target ids; distill.json says how it was made. Embedding and head are the target's
rows, frozen; the layers and the final norm are what training changes. Verification is unchanged: the draft
proposes target ids, and its q is zero outside its vocabulary.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import torch

from ..drafters import ModelDrafter
from ..fingerprint import config_fingerprint
from ..models import DEFAULT_MODEL, ModelError

VOCAB_FILE = "draft_vocab.json"  # [target id of row 1, of row 2, ...]
META_FILE = "distill.json"  # the recipe, the counts reached, the target's identity, measured agreement
OTHER = 0  # the row every target id outside the draft's vocabulary reads as


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


def init_draft(target, ids: list[int], n_layers: int):
    """A fresh draft made from the target model (a transformers causal LM) and the kept target ids."""
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(target.config)
    chosen = layer_choice(cfg.num_hidden_layers, n_layers)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in chosen]
    cfg.num_hidden_layers, cfg.vocab_size = n_layers, len(ids) + 1
    cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id = OTHER, None, None  # target ids mean nothing here
    if hasattr(cfg, "max_window_layers"):
        cfg.max_window_layers = n_layers
    draft = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    src, dst = target.base_model, draft.base_model
    keep = torch.tensor(ids)
    with torch.no_grad():
        for j, i in enumerate(chosen):
            dst.layers[j].load_state_dict(src.layers[i].state_dict())
        dst.norm.load_state_dict(src.norm.state_dict())
        emb = src.embed_tokens.weight.float()
        others = torch.ones(len(emb), dtype=torch.bool)
        others[keep] = False
        dst.embed_tokens.weight[1:] = emb[keep]
        dst.embed_tokens.weight[OTHER] = emb[others].mean(0) if others.any() else 0
        if not cfg.tie_word_embeddings:
            draft.lm_head.weight[1:] = target.lm_head.weight.float()[keep]
            draft.lm_head.weight[OTHER] = 0
    draft.get_input_embeddings().requires_grad_(False)
    draft.get_output_embeddings().requires_grad_(False)
    return draft.float()


def save_draft(draft, ids: list[int], out: Path, meta: dict) -> None:
    """Write the draft (bfloat16: half the bytes, no measurable change in agreement), its vocabulary, its recipe."""
    out.mkdir(parents=True, exist_ok=True)
    copy.deepcopy(draft).to(torch.bfloat16).save_pretrained(out)
    for name, text in ((VOCAB_FILE, json.dumps(ids)), (META_FILE, json.dumps(meta, indent=1))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, out / name)


def is_distilled(d: Path) -> bool:
    d = Path(d)
    return all((d / f).is_file() for f in (VOCAB_FILE, META_FILE, "config.json")) and any(d.glob("*.safetensors"))


def read_meta(d: Path) -> dict:
    return json.loads((Path(d) / META_FILE).read_text())


class DistilledDrafter(ModelDrafter):
    """ModelDrafter over draft rows: target ids are mapped to rows on the way in, and the next-token logits are
    spread back over the target's vocabulary (-inf outside the draft's: greedy picks only kept ids, q is 0 there).
    The cache still follows the context in target ids, as ModelDrafter's longest-common-prefix sync expects."""

    def __init__(self, draft_dir: Path, target_vocab: int, **kw):
        super().__init__(draft_dir, target_vocab, **kw)
        ids = torch.tensor(json.loads((Path(draft_dir) / VOCAB_FILE).read_text()))
        if int(ids.max()) >= target_vocab:
            raise ModelError(f"the draft {Path(draft_dir).name} proposes ids beyond the target's vocabulary")
        self.to_target = ids.to(self.device)
        self.to_row = torch.full((target_vocab,), OTHER, dtype=torch.long)
        self.to_row[ids] = torch.arange(1, len(ids) + 1)

    @torch.inference_mode()
    def _feed(self, tokens: list[int]) -> None:
        super()._feed(self.to_row[tokens].tolist())
        self.seen[len(self.seen) - len(tokens):] = tokens
        full = self.next_logits.new_full((self.target_vocab,), float("-inf"))
        full[self.to_target] = self.next_logits[1:]
        self.next_logits = full


def load(draft_dir: Path, tokenizer, target_vocab: int, device: str = "cpu", name: str | None = None) -> DistilledDrafter:
    meta = read_meta(draft_dir)
    if meta.get("tokenizer") != tokenizer_fingerprint(tokenizer):
        raise ModelError(f"the draft {Path(draft_dir).name} was distilled for a model with another tokenizer")
    return DistilledDrafter(draft_dir, target_vocab, device=device, name=name)


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
