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
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from peers.compute import packed
from peers.models.checkpoint import weight_files as _weight_files

VOCAB_FILE = "draft_vocab.json"  # [target id of head row 0, of row 1, ...]
META_FILE = "distill.json"  # the recipe, the counts reached, the target's identity, measured agreement
SHARED = ("embed.weight", "head.weight")  # taken from the target, never stored with the draft


def tokenizer_fingerprint(tok) -> str:
    return hashlib.sha256(json.dumps(sorted(tok.get_vocab().items())).encode()).hexdigest()


@dataclass
class FeatureStep:
    """One forward of the draft for one conversation: inputs (f_t, x_{t+1}) after what its cache holds; without a
    mask and positions, causal after the cache."""

    cache: object
    ids: list[int]
    feats: torch.Tensor  # [T, H]
    mask: torch.Tensor | None = None  # [1, 1, T, cached + T], True: may attend
    positions: torch.Tensor | None = None  # [1, T]
    heads: int = 1  # the last rows whose head logits are wanted


class FeatureDraft(torch.nn.Module):
    def __init__(self, cfg, n_rows: int, target_vocab: int, embedding: torch.Tensor | None = None):
        """embedding: the target's own (the host's shard's), shared rather than copied."""
        from transformers import AutoModel

        super().__init__()
        h = cfg.hidden_size
        self.embed = (torch.nn.Embedding(target_vocab, h) if embedding is None
                      else torch.nn.Embedding.from_pretrained(embedding, freeze=True))
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

    def forward_many(self, steps: list[FeatureStep]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Several conversations' Steps as one pass (peers/compute/packed.py): each one's predicted features [T, H] and the
        head's logits over its last `heads` rows. The matrices, the head (the draft's largest) among them, run once
        over every step's positions; attention stays within each conversation. Only for a packable body."""
        device = self.fc.weight.device
        bounds, masks, positions, start = [], [], [], 0
        for s in steps:
            t, cached = len(s.ids), s.cache.get_seq_length()
            bounds.append((start, start + t))
            start += t
            pos = s.positions if s.positions is not None else torch.arange(cached, cached + t)[None]
            positions.append(pos.to(device))
            if s.mask is None and t == 1:  # a chain's next token sees all its cache: no mask (as transformers)
                masks.append(None)
                continue
            causal = s.mask if s.mask is not None else torch.ones(t, cached + t, dtype=torch.bool).tril(cached)
            masks.append(causal.reshape(1, 1, t, cached + t).to(device))
        ids = torch.tensor([[i for s in steps for i in s.ids]], device=device)
        feats = torch.cat([s.feats for s in steps])[None].to(self.fc.weight.dtype)
        x = self.fc(torch.cat([self.embed(ids), feats], -1))
        pos = torch.cat(positions, dim=1)
        rope = self.body.rotary_emb(x, pos)
        mask, cache = packed.Packed(masks, bounds), packed.Caches([s.cache for s in steps], bounds)
        for layer in self.body.layers:
            x = layer(x, attention_mask=mask, position_embeddings=rope, position_ids=pos, cache=cache, use_cache=True)
        x = self.body.norm(x)[0]
        rows = torch.cat([torch.arange(b - s.heads, b) for s, (_, b) in zip(steps, bounds)]).to(device)
        logits = torch.split(self.head(x[rows]), [s.heads for s in steps])
        return [(x[a:b], lg) for (a, b), lg in zip(bounds, logits)]

    def packable(self) -> bool:
        """forward_many gives what forward gives: plain full attention through sdpa, one rotary embedding."""
        from peers.models.families import FAMILIES, Family

        c = self.body.config
        f = FAMILIES.get(c.model_type)
        return (type(f) is Family and getattr(c, "sfchat_attention", c._attn_implementation) == "sdpa"
                and all(kind == "full_attention" for kind in f.layer_types(c)))


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


def build(target_dir: Path, cfg, ids: list[int], state: dict[str, torch.Tensor],
          embedding: torch.Tensor | None = None) -> FeatureDraft:
    """The draft: `state` (fc, layers, norm) plus the target's embedding (`embedding`, shared, where the host
    has it loaded; else read) and the head rows `ids`."""
    shared = embedding if embedding is not None else target_tensors(
        target_dir, {"embed": "model.embed_tokens.weight"})["embed"]
    model = FeatureDraft(cfg, len(ids), shared.shape[0], embedding)
    rest = {**state, SHARED[1]: target_head(target_dir)[torch.tensor(ids)]}
    model.load_state_dict(rest if embedding is not None else {**rest, SHARED[0]: shared}, strict=embedding is None)
    return model


def is_distilled(d: Path) -> bool:
    d = Path(d)
    return all((d / f).is_file() for f in (VOCAB_FILE, META_FILE, "config.json", "model.safetensors"))


def read_meta(d: Path) -> dict:
    return json.loads((Path(d) / META_FILE).read_text())
