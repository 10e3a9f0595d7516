"""The feature draft's network and its directory: an EAGLE-style head that reads the target's own final hidden state.

At position t the draft reads the target's feature f_t (its final, normalised hidden state, which the host holds
after every ring pass) together with the embedding of the next token x_{t+1}, fuses them (fc: 2H -> H), runs a
decoder layer of its own (with its own KV cache over earlier positions) and predicts f_{t+1}; the target's LM
head over that prediction proposes x_{t+2}. Further drafts feed the draft's predicted feature back in place of
the target's. The target's feature already carries nearly all of what decides the next token, so one layer
agrees with the target far more often than a small stand-alone model of the same cost.

The head keeps only the rows of the target tokens written most often (as EAGLE-3 / FR-Spec do: on a small draft
the head is most of the cost, and rare tokens are rarely accepted anyway). Embedding and head rows are frozen
copies of the target's, so a draft directory stores only its fc, layer and norm (a few MB) and takes the rest
from its target's files when loaded; distill.json records which target. Verification is unchanged: the draft
proposes target ids, and its q is zero outside its head's rows.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

from ..checkpoint import weight_files as _weight_files

VOCAB_FILE = "draft_vocab.json"  # [target id of head row 0, of row 1, ...]
META_FILE = "distill.json"  # the recipe, the counts reached, the target's identity, measured agreement
SHARED = ("embed.weight", "head.weight")  # taken from the target, never stored with the draft


def tokenizer_fingerprint(tok) -> str:
    return hashlib.sha256(json.dumps(sorted(tok.get_vocab().items())).encode()).hexdigest()


class FeatureDraft(torch.nn.Module):
    def __init__(self, cfg, n_rows: int, target_vocab: int):
        from transformers import AutoModel

        super().__init__()
        h = cfg.hidden_size
        self.embed = torch.nn.Embedding(target_vocab, h)
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.body = AutoModel.from_config(cfg, dtype=torch.float32)
        self.head = torch.nn.Linear(h, n_rows, bias=False)
        self.embed.requires_grad_(False)
        self.head.requires_grad_(False)

    def forward(self, next_ids: torch.Tensor, feats: torch.Tensor, cache=None, attention_mask=None,
                position_ids=None) -> torch.Tensor:
        """next_ids [B, T] (x_{t+1}), feats [B, T, H] (f_t) -> predicted features [B, T, H] (f_{t+1})."""
        x = self.fc(torch.cat([self.embed(next_ids), feats.to(self.fc.weight.dtype)], -1))
        return self.body(inputs_embeds=x, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                         use_cache=cache is not None).last_hidden_state


def target_tensors(target_dir: Path, names: dict[str, str]) -> dict[str, torch.Tensor]:
    """{our name: target tensor name} -> {our name: tensor}, read from the target's safetensors only."""
    files = _weight_files(Path(target_dir))
    out = {}
    for ours, theirs in names.items():
        with safe_open(files[theirs], framework="pt") as f:
            out[ours] = f.get_tensor(theirs).float()
    return out


def target_head(target_dir: Path) -> torch.Tensor:
    """The target's LM head matrix [vocab, H] (a tied head is its embedding)."""
    name = "lm_head.weight" if "lm_head.weight" in _weight_files(Path(target_dir)) else "model.embed_tokens.weight"
    return target_tensors(target_dir, {"head": name})["head"]


def build(target_dir: Path, cfg, ids: list[int], state: dict[str, torch.Tensor]) -> FeatureDraft:
    """The draft: `state` (fc, layers, norm) plus the target's embedding and the head rows `ids`."""
    shared = target_tensors(target_dir, {"embed": "model.embed_tokens.weight"})["embed"]
    model = FeatureDraft(cfg, len(ids), shared.shape[0])
    model.load_state_dict({**state, SHARED[0]: shared, SHARED[1]: target_head(target_dir)[torch.tensor(ids)]})
    return model


def is_distilled(d: Path) -> bool:
    d = Path(d)
    return all((d / f).is_file() for f in (VOCAB_FILE, META_FILE, "config.json", "model.safetensors"))


def read_meta(d: Path) -> dict:
    return json.loads((Path(d) / META_FILE).read_text())
