"""The feature drafter: drafts chains and trees from the target's own final hidden states (feature_net.py)."""
from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import DynamicCache

from peers.compute import packed
from peers.speculation import tree
from peers.compute.cpu_linear import use_columns
from peers.models.fingerprint import config_fingerprint
from peers.base.errors import ModelError
from peers.speculation.sampling import SamplingParams, draw, position_generator
from peers.compute.loading import load_config
from peers.compute.runtime import DRAFT, RUNTIME
from peers.compute.runtime import torch_threads
from peers.speculation.tree import BRANCHES, Draft
from peers.speculation.tree_sampling import coupled_children
from peers.speculation.drafting.base import Drafter, common_prefix
from peers.speculation.drafting.feature_context import FeatureContext
from peers.speculation.drafting.feature_net import VOCAB_FILE, FeatureStep, build, read_meta, tokenizer_fingerprint
from peers.speculation.drafting.grow import grow
from peers.speculation.drafting.ngram import followers, lookup
from peers.speculation.drafting.together import Together

COPY_WEIGHT = 0.4  # the share of a copied token in the draft's distribution (why: see FeatureDrafter)
SHARPEN = 0.85  # the draft's logits over this (a temperature) make its greedy confidences calibrated (see _probs)
MAX_UNSEEN = 16  # positions the draft will read without the target's feature (its own guesses stand in)



def rollback_cache(config) -> DynamicCache:
    """A cache that can be trimmed back by the last pass's positions. A sliding-window layer keeps only its last
    window - 1 states unless told to keep a pass's worth more until the next trim (which every pass does)."""
    cache = DynamicCache(config=config)
    for layer in cache.layers:
        if hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()
    return cache


class FeatureDrafter(Drafter):
    """Drafts from the target's features, which the generation loop hands over after every ring pass (observe).

    Where the context repeats itself (its last 2-3 tokens occurred before), what followed them last time (prompt
    lookup) is mixed into the draft's distribution with weight COPY_WEIGHT: the mixture is
    p(x) = w [x = copy] + (1 - w) p_draft(x), so the copy wins unless the draft gives another token more than
    w / (1 - w) + p_draft(copy) of its mass. At such places the copy is right more often than the draft, and w
    is chosen so that the mixture's probabilities match how often the target agrees (where copy and draft agree,
    and for a disputed copy), which is what the confidence floor needs. The replay that measures it is
    `python scripts/draft_replay.py --prompts heldout`; its figures are in docs/benchmarks.md.

    What it has seen of the conversation, and its cache over that, is `self.seen` (feature_context.py)."""

    confident = True  # its head's top probability is a fair estimate of the target's agreement (see _next)
    trees = True  # it drafts trees: its second and third choices, where they are likely enough

    def __init__(self, draft_dir: Path, target_dir: Path, target_vocab: int, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, name: str | None = None, embedding: torch.Tensor | None = None):
        """dtype: the host's. embedding: the host's shard's token embedding, shared where it is in `dtype` on
        `device` (no copy of the target's largest matrix)."""
        ids = json.loads((Path(draft_dir) / VOCAB_FILE).read_text())
        if max(ids) >= target_vocab:
            raise ModelError(f"the draft {Path(draft_dir).name} proposes ids beyond the target's vocabulary")
        cfg = load_config(draft_dir)
        own = {k: v.float() for k, v in load_file(Path(draft_dir) / "model.safetensors").items()}
        if embedding is not None and (embedding.dtype != dtype or embedding.device != torch.device(device)):
            embedding = None
        self.model = build(target_dir, cfg, ids, own, embedding).to(device, dtype).eval()
        self.shared = {embedding.data_ptr()} if embedding is not None else set()
        use_columns(self.model)
        # conversations drafting at the same time draft in one forward (peers/speculation/drafting/together.py); the forks
        # share this
        self.together = Together(self.model.forward_many, device=device) if self.model.packable() else None
        if self.together is not None:
            packed.route(self.model.body.config)
        self.name = name or Path(draft_dir).name
        self.device, self.target_vocab = device, target_vocab
        self.to_target = torch.tensor(ids, device=device)
        self.to_row = {t: i for i, t in enumerate(ids)}
        self.new_cache = lambda: rollback_cache(cfg)
        self.hidden_size = cfg.hidden_size
        self.copy = True  # copy where the context repeats (off: the feature draft alone, to measure it)
        self._start_conversation()

    def _start_conversation(self) -> None:
        """The state that follows one conversation (everything but the weights)."""
        self.seen = FeatureContext(self.new_cache, self.hidden_size, self.device)
        self.lock = threading.Lock()  # observe (trio thread) never overlaps a proposal (worker thread)
        self.confidence: list[float] = []

    @property
    def bytes(self) -> int:
        """What its weights hold beyond what it shares with the host's shard (counted in the host's plan)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.data_ptr() not in self.shared)

    def fork(self) -> "FeatureDrafter":
        d = copy.copy(self)  # the same weights
        d._start_conversation()
        return d

    def close(self) -> None:
        if self.together is not None:
            self.together.forget(self)

    def observe(self, start: int, ids: list[int], feats: torch.Tensor) -> None:
        with self.lock:
            self.seen.observe(start, ids, feats)

    def _crop(self, n: int) -> None:  # (as the model draft's: drafting together restarts a failed draft's cache)
        self.seen.crop(n)

    async def draft(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        if self.together is None:
            return await super().draft(context, n, params, stop, floor, prior)
        return await self.together.run(self, self.chain_steps(context, n, params, stop, floor, prior))

    async def draft_tree(self, context, floor, depth, max_nodes, stop=None, params=None):
        if self.together is None:
            return await super().draft_tree(context, floor, depth, max_nodes, stop, params)
        return await self.together.run(self, self.tree_steps(context, floor, depth, max_nodes, stop,
                                                             params or SamplingParams()))

    def _feed(self, next_ids: list[int], feats: torch.Tensor, head: bool = True):
        """(steps) Extend the cache by inputs (f_t, x_{t+1}); the predicted feature after the last and (head) the
        head's logits over it."""
        out, logits = yield FeatureStep(self.seen.cache, next_ids, feats, heads=int(head))
        self.seen.cache_next += next_ids
        return out[-1], (logits[-1] if head else None)

    def _run(self, step: FeatureStep) -> tuple[torch.Tensor, torch.Tensor]:
        """One step alone: the draft's own forward, and its head over the last step.heads rows."""
        ids = torch.tensor([step.ids], device=self.device)
        out = self.model(ids, step.feats[None], cache=step.cache, attention_mask=step.mask,
                         position_ids=step.positions)[0]
        return out, self.model.head(out[len(out) - step.heads:])

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's greedy confidences over its head's rows, from the head's logits. Distillation leaves it
        under-confident (its chains are right more often than their confidences say): SHARPEN is the temperature
        that minimises the log loss of "this child is the target's token" over its top three with copies mixed
        in, after which a chain's confidences match how often it is right (calibration table:
        `python scripts/draft_replay.py --prompts heldout`, figures in docs/benchmarks.md)."""
        return torch.softmax(logits.float() / SHARPEN, -1)

    def _children(self, p: torch.Tensor, copy: int | None, n: int) -> list[tuple[int, float]]:
        """The n likeliest tokens under the draft's distribution p (its head's rows), with their probabilities,
        likeliest first. Where the text repeats itself, `copy` (what followed last time) gets COPY_WEIGHT of the
        mass and p the rest."""
        out = {}
        if copy is not None:
            row = self.to_row.get(copy)
            out[copy] = COPY_WEIGHT + (1 - COPY_WEIGHT) * (float(p[row]) if row is not None else 0.0)
            p = p * (1 - COPY_WEIGHT)
        values, rows = p.topk(min(n + 1, len(p)))
        for v, r in zip(values.tolist(), rows.tolist()):
            out.setdefault(int(self.to_target[r]), v)
        return sorted(out.items(), key=lambda kv: -kv[1])[:n]  # (stable: the copy wins a tie)

    def _next(self, logits: torch.Tensor, params: SamplingParams, position: int,
              copy: int | None) -> tuple[int, torch.Tensor | None, float]:
        """The draft token from the head's logits after a predicted feature, (when sampling) q over the target's
        vocabulary, and the draft's confidence in it: its probability under q, known before any draw (greedy:
        the top one)."""
        if params.greedy:
            tok, sure = self._children(self._probs(logits), copy, 1)[0]
            return tok, None, sure
        q = self._q(logits, params, copy)
        # the target's uniform at this position (stream 1): where q is near p the draft draws what the target will
        return draw(q, position_generator(params.seed, position, stream=1)), q, float(q.max())

    def _q(self, logits: torch.Tensor, params: SamplingParams, copy: int | None) -> torch.Tensor:
        """The sampled draft's distribution over the target's vocabulary, the copy mixed in."""
        full = logits.new_full((self.target_vocab,), float("-inf"), dtype=torch.float32)  # q is 0 off the head
        full[self.to_target] = logits.float()
        q = params.probs(full[None])[0]
        if copy is not None:
            q = (1 - COPY_WEIGHT) * q
            q[copy] += COPY_WEIGHT
        return q

    def _start(self, context: list[int]):
        """(steps) Bring the draft's cache up to the context; the predicted feature after its last token and the
        head's logits there (None: nothing verified yet, e.g. a new message, whose pass brings the features)."""
        m = len(context)
        known = self.seen.known(context)  # indices that can read the target's own feature
        if known < 1 or m - 1 - known > MAX_UNSEEN:
            return None
        # index known-1 is always recomputed: its output starts the drafts
        common = common_prefix(self.seen.cache_next, context[1:], min(self.seen.true_len, known - 1))
        self.seen.crop(common)
        g, logits = yield from self._feed(context[common + 1 : known + 1], self.seen.feats[common:known],
                                          known == m - 1)
        self.seen.true_len = known
        for t in range(known, m - 1):  # context the ring has not verified: the draft's own guesses stand in
            g, logits = yield from self._feed([context[t + 1]], g[None], t == m - 2)
        return g, logits

    @torch.inference_mode()
    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        # one thread: the draft's matrices are small, and it often runs while a ring stage computes on the same
        # cores (its look-ahead), where a second thread's barrier waits on a busy core (many times slower than one
        # thread when the cores are busy: docs/benchmarks.md).
        # torch's thread count is per OS thread, so the host's own layers keep theirs (peers/compute/runtime.py).
        return RUNTIME.call(self.device, self._alone, self.chain_steps(context, n, params, stop, floor, prior),
                            lane=DRAFT)

    def _alone(self, steps):
        with torch_threads(1), self.lock:
            return self._drive(steps)

    def chain_steps(self, context: list[int], n: int, params: SamplingParams, stop=None, floor: float = 0.0,
                    prior: float = 1.0):
        """(steps) propose's drafts: its result is (tokens, q)."""
        self.confidence = []
        t0 = time.perf_counter()
        started = (yield from self._start(context)) if n > 0 else None
        if started is None:
            return [], None
        g, logits = started
        fixed = time.perf_counter() - t0
        m = len(context)
        tokens, qs, sure = [], [], prior
        seq = list(context)  # the context and the drafts so far, grown in place: what copying searches
        while True:
            copy = lookup(seq, 1) if self.copy else []  # the text repeats itself: what followed last time
            tok, q, c = self._next(logits, params, m + len(tokens), copy[0] if copy else None)
            sure *= c
            tokens.append(tok)
            self.confidence.append(sure)
            seq.append(tok)
            if q is not None:
                qs.append(q)
            if len(tokens) == n or sure < floor or (stop is not None and stop.is_set()):
                break
            g, logits = yield from self._feed([tok], g[None])
        self._measure(time.perf_counter() - t0, len(tokens), fixed)
        return tokens, (torch.stack(qs) if qs else None)

    @torch.inference_mode()
    def propose_tree(self, context: list[int], floor: float, depth: int, max_nodes: int,
                     stop: threading.Event | None = None, params: SamplingParams = SamplingParams()) -> Draft:
        """A tree of drafts (peers/speculation/drafting/grow.py): up to BRANCHES children per node (greedy: the likeliest;
        sampled: drawn without replacement), every node whose chance with its ancestors' is at least `floor`, at
        most `depth` deep and the `max_nodes` likeliest. Each level is one step of the draft over all its nodes
        at once (their own positions, each seeing its ancestors), so a node costs far less than a chain's draft;
        the main chain's last node's first child is the guess at the token after it."""
        return RUNTIME.call(self.device, self._alone, self.tree_steps(context, floor, depth, max_nodes, stop, params),
                            lane=DRAFT)

    def tree_steps(self, context: list[int], floor: float, depth: int, max_nodes: int,
                   stop: threading.Event | None = None, params: SamplingParams = SamplingParams()):
        """(steps) propose_tree's tree: its result is the Draft."""
        t0 = time.perf_counter()
        started = (yield from self._start(context)) if depth > 0 else None
        if started is None:
            self.confidence = []
            return Draft()
        follows = followers(context) if self.copy else (lambda tail: None)  # (one pass over the context)
        fixed = time.perf_counter() - t0
        g, logits = started
        gen = None if params.greedy else position_generator(params.seed, len(context), stream=0)
        base = len(self.seen.cache_next)  # the draft's cache: index t holds (f_t, x_{t+1}); the tree's go after it
        feats, tails = {-1: g}, {-1: context[-3:]}  # tails: each node's last tokens, for copying
        at = {-1: len(context)}  # the position of each node's children

        def children(row: torch.Tensor, tail: list[int], node: int = -1):
            if gen is None:
                return self._children(self._probs(row), follows(tail), BRANCHES), None
            q = self._q(row, params, follows(tail))
            return coupled_children(q, BRANCHES, gen, params.seed, at[node]), q

        def expand(level, tokens, parents):
            for i in level:
                tails[i] = tails[parents[i]][-2:] + [tokens[i]]
                at[i] = at[parents[i]] + 1
            # the level's rows of a ring pass over the whole tree with nothing carried before it: its cache holds
            # the context's entries and the earlier levels' (peers/speculation/tree.py); each node at its depth
            first = level[0]
            mask = tree.attention_mask(base, len(tokens), parents, device=self.device)[..., first:, :]
            pos = tree.positions(base, len(tokens), parents)[:, first:].to(self.device)
            out, rows = yield FeatureStep(self.seen.cache, [tokens[i] for i in level],
                                   torch.stack([feats[parents[i]] for i in level]), mask, pos, heads=len(level))
            for j, i in enumerate(level):
                feats[i] = out[j]
            return [children(rows[j], tails[i], i) for j, i in enumerate(level)]

        d = yield from grow(children(logits, tails[-1]), expand, floor, depth, max_nodes, stop)
        self.seen.cache.crop(base - self.seen.cache.get_seq_length())  # the tree's entries go: the ring's answer decides
        self._measure(time.perf_counter() - t0, len(d.tokens), fixed)
        self.confidence = d.sure
        return d


def load(draft_dir: Path, target_dir: Path, tokenizer, target_vocab: int, device: str = "cpu",
         name: str | None = None, dtype: torch.dtype = torch.float32,
         embedding: torch.Tensor | None = None) -> FeatureDrafter:
    meta = read_meta(draft_dir)
    if meta.get("target_config") != config_fingerprint(target_dir) or \
            meta.get("tokenizer") != tokenizer_fingerprint(tokenizer):
        raise ModelError(f"the draft {Path(draft_dir).name} was distilled for another model ({meta.get('target')})")
    return FeatureDrafter(draft_dir, target_dir, target_vocab, device=device, name=name, dtype=dtype,
                          embedding=embedding)
