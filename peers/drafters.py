"""Drafters propose the next tokens cheaply on the host; the ring then verifies them in one pass.

One interface: propose(context, n, params, stop) -> (tokens, q), q being the probabilities each token was
drawn from ([n, vocab]) or None when the proposal is deterministic (greedy or lookup: q is one-hot).
A sampled draft token at position i uses a generator seeded by (seed, i), so a seeded run is reproducible
however many tokens were drafted ahead while a round was on the wire.
"""
from __future__ import annotations

import copy
import threading
import time
from pathlib import Path

import torch

from .sampling import SamplingParams, draw, pad_vocab, position_generator


def common_prefix(a: list, b: list, limit: int | None = None) -> int:
    """How many leading items a and b share (at most `limit`). Called every round on the whole conversation: the
    usual case, all equal, is one list comparison in C; only a difference is searched item by item."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


class Drafter:
    name = "none"
    ms_per_token = 0.0  # measured cost of one drafted token more (moving average)
    tokens_made, ms_spent = 0, 0.0  # every token proposed and the time it took, for measurements
    confident = False  # True: propose() honours floor and reports self.confidence
    trees = False  # True: it also has propose_tree (greedy drafts as a tree, peers/tree.py)
    confidence: tuple[float, ...] | list[float] = ()

    def propose(self, context: list[int], n: int, params: SamplingParams, stop: threading.Event | None = None,
                floor: float = 0.0, prior: float = 1.0) -> tuple[list[int], torch.Tensor | None]:
        """Up to n tokens. A confident drafter also sets self.confidence: for each token, its chance (by its own
        reckoning) that the target accepts it and every draft before it, times `prior` (the chance of the drafts
        this call continues); it stops after the first token whose chance falls below `floor`."""
        return [], None

    def fork(self) -> "Drafter":
        """A drafter for another conversation running at the same time: the same weights, its own state."""
        return copy.copy(self)

    def observe(self, start: int, ids: list[int], feats: torch.Tensor) -> None:
        """After a ring pass: the tokens at positions start.. and the target's final hidden states there (for
        drafts that read them; some of those tokens may be drafts the target went on to reject)."""

    def _measure(self, seconds: float, n: int, fixed: float = 0.0) -> None:
        """A call made n tokens in `seconds`, `fixed` of which it pays whatever n is (catching up on the context):
        ms_per_token is what one token more costs, the policy's draft_ms."""
        if n:
            ms = (seconds - fixed) * 1e3 / n
            self.ms_per_token = ms if not self.ms_per_token else 0.8 * self.ms_per_token + 0.2 * ms
            self.tokens_made += n
            self.ms_spent += seconds * 1e3


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the context's last few tokens, propose what followed."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        t0 = time.perf_counter()
        out = lookup(context, n, self.max_ngram, self.min_ngram)
        self._measure(time.perf_counter() - t0, max(len(out), 1))
        return out, None


def lookup(context: list[int], n: int, max_ngram: int = 3, min_ngram: int = 2) -> list[int]:
    if n <= 0:
        return []
    for size in range(max_ngram, min_ngram - 1, -1):
        if len(context) <= size:
            continue
        tail = context[-size:]
        for start in range(len(context) - size - 1, -1, -1):
            if context[start : start + size] == tail:
                follow = context[start + size : start + size + n]
                if follow:
                    return follow
    return []


def followers(context: list[int], max_ngram: int = 3, min_ngram: int = 2):
    """lookup's first token for any tail at once: one pass over the context indexes what followed each n-gram's
    latest occurrence; returns tail -> that token, or None. (For a tree of drafts: one index for every node.)"""
    index = {}
    for size in range(min_ngram, max_ngram + 1):
        for start in range(len(context) - size):
            index[tuple(context[start : start + size])] = context[start + size]

    def follow(tail: list[int]) -> int | None:
        for size in range(max_ngram, min_ngram - 1, -1):
            if len(tail) >= size and (t := index.get(tuple(tail[-size:]))) is not None:
                return t
        return None
    return follow


class ModelDrafter(Drafter):
    """A small causal LM with its own KV cache. The cache follows the context by longest common prefix, so a
    rejected branch is cropped away and, after a fully accepted round, the last drafted token is processed too."""

    def __init__(self, model_dir: Path, target_vocab: int, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 name: str | None = None, static: bool | None = None, max_len: int = 4096, model=None):
        from transformers import AutoModelForCausalLM, StaticCache

        from .shard import rollback_cache

        # `model`: one already built (a distilled draft is assembled from its own and its target's tensors)
        model = model if model is not None else AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        self.model = model.to(device).eval()
        self.name = name or Path(model_dir).name
        self.device = device
        self.target_vocab = target_vocab
        self.draft_vocab = self.model.get_input_embeddings().num_embeddings
        cfg = self.model.config
        self.static = str(device).startswith("cuda") if static is None else static
        # On CUDA one-token steps dominate and Python kernel launches dominate them: a static cache (fixed
        # addresses; crop just moves its length back) lets torch.compile capture each step as a CUDA graph.
        self.max_len = min(max_len, getattr(cfg, "max_position_embeddings", max_len))
        self.cache = StaticCache(config=cfg, max_cache_len=self.max_len) if self.static else rollback_cache(cfg)
        self.step = self.model
        if self.static and str(device).startswith("cuda"):
            self.step = torch.compile(self.model, mode="reduce-overhead", fullgraph=False)
        self.seen: list[int] = []  # tokens whose keys and values are in self.cache
        self.next_logits: torch.Tensor | None = None  # logits after the last token of self.seen

    def fork(self) -> "ModelDrafter":
        return ModelDrafter(None, self.target_vocab, device=self.device, name=self.name, static=self.static,
                            max_len=self.max_len, model=self.model)

    def reset(self) -> None:
        self.cache.crop(-len(self.seen)) if self.seen else None
        self.seen, self.next_logits = [], None

    @torch.inference_mode()
    def _feed(self, tokens: list[int]) -> None:
        # an id only the target has (its padded rows) has no embedding here: the draft reads it as id 0
        v = self.draft_vocab
        ids = torch.tensor([[t if t < v else 0 for t in tokens]], device=self.device)
        if self.static and len(self.seen) + len(tokens) > self.max_len:
            raise ValueError(f"the draft's static cache holds {self.max_len} positions")
        run = self.step if len(tokens) == 1 else self.model  # prefills vary in shape: not worth a graph
        out = run(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1)
        self.seen += tokens
        self.next_logits = out.logits[0, -1].float()

    def _sync(self, context: list[int]) -> None:
        common = common_prefix(context, self.seen)
        if common == len(context):  # context is a prefix of what we saw: recompute its last position
            common -= 1
        if common < len(self.seen):
            self.cache.crop(common - len(self.seen))
            self.seen = self.seen[:common]
        self._feed(context[common:])

    @torch.inference_mode()
    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        if n <= 0:
            return [], None
        t0 = time.perf_counter()
        self._sync(context)
        tokens, qs = [], []
        for _ in range(n):
            logits = self.next_logits
            if params.greedy:
                tok = int(logits.argmax())
            else:
                q = pad_vocab(params.probs(logits[None])[0], self.target_vocab)
                gen = position_generator(params.seed, len(context) + len(tokens), stream=0)
                tok = draw(q, gen)
                qs.append(q)
            tokens.append(tok)
            if len(tokens) == n or (stop is not None and stop.is_set()):
                break
            self._feed([tok])
        self._measure(time.perf_counter() - t0, len(tokens))
        return tokens, (torch.stack(qs) if qs else None)


def make_drafter(spec: str | None, target_dir: Path, target_vocab: int, tokenizer, device: str = "cpu",
                 say=print) -> Drafter:
    """`none`, `ngram`, or a model (same names as --model). No spec: the best drafter known for the target."""
    from . import distill, models

    if spec in (None, "", "auto"):
        # the draft distilled for the embedded default and shipped in assets/drafts, if there is one
        if (shipped := distill.shipped_draft(target_dir)) is not None:
            return distill.load(shipped, target_dir, tokenizer, target_vocab, device=device,
                                name=f"{models.DEFAULT_MODEL}-draft")
        spec = "ngram"
    if spec == "none":
        return Drafter()
    if spec == "ngram":
        return NgramDrafter()
    draft_dir = models.resolve(spec, say=say)
    if distill.is_distilled(draft_dir):  # made by `sfchat distill` for one target, whose tensors it shares
        return distill.load(draft_dir, target_dir, tokenizer, target_vocab, device=device, name=spec)
    check_same_tokenizer(tokenizer, draft_dir)
    return ModelDrafter(draft_dir, target_vocab, device=device, name=spec)


def check_same_tokenizer(target_tok, draft_dir: Path) -> None:
    from transformers import AutoTokenizer

    from .models import ModelError

    draft_tok = AutoTokenizer.from_pretrained(draft_dir)
    probe = "Hello, world! 1234 def f(x): return x**2 — ünïcödé 你好"
    if target_tok.get_vocab() != draft_tok.get_vocab() or target_tok.encode(probe) != draft_tok.encode(probe):
        raise ModelError(f"the draft {draft_dir.name} does not use the target's tokenizer; pick a draft of the same family")
