"""A stand-alone draft model of the target's family, run by the same pass engine as the ring (peers/compute/shard.py): the
small model's full span with its embedding and head, in the host's dtype, its keys and values in an arena of its
own, its passes on the process's device runtime (peers/compute/runtime.py) at the look-ahead lane's priority, its short
passes replayed as CUDA graphs like the ring's. Nothing is compiled.

`DraftModel.forward(steps)` is the draft's one forward: B conversations' Steps (cache, committed, ids) in one pass,
the logits at each one's last position. A chain of drafts (chain_steps) is a generator of steps on top of it, which
peers/speculation/drafting/together.py advances in lockstep with the other conversations' drafting. A tree of drafts
(peers/speculation/drafting/model_tree.py) runs each level as one tree pass of the engine over the tree so far.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from peers.compute.kv import SessionCache
from peers.base.limits import CONVERSATIONS
from peers.base.span import Span
from peers.compute.runtime import DRAFT, RUNTIME
from peers.speculation.sampling import SamplingParams, draw, pad_vocab, position_generator
from peers.base.dtypes import DTYPE_NAMES
from peers.speculation.tree import Draft
from peers.speculation.drafting.base import Drafter, common_prefix
from peers.speculation.drafting.model_tree import draft_tree
from peers.speculation.drafting.together import Together


@dataclass
class ModelStep:
    """One conversation's part of a draft forward: ids after the first `committed` positions of its cache."""

    cache: SessionCache
    committed: int
    ids: list[int]


class DraftModel:
    """The draft's weights and arena, shared by every conversation's drafter (ModelDrafter.fork), and the run
    that drafts the conversations drafting at the same time together (peers/speculation/drafting/together.py)."""

    def __init__(self, model_dir: Path, device: str, dtype: torch.dtype, conversations: int):
        from peers.compute.loading import load_config
        from peers.compute.shard import Shard

        n = load_config(model_dir).num_hidden_layers
        self.device = device
        self.shard = Shard(Path(model_dir), Span(0, n, n), embed=True, head=True, dtype=DTYPE_NAMES[dtype],
                           device=device, conversations=conversations)
        self.vocab = self.shard.embed.num_embeddings
        self.together = Together(self.forward, threads=torch.get_num_threads(), device=device)

    @property
    def bytes(self) -> int:
        """Its weights and its arena (counted in the host's plan)."""
        params = {id(p): p for m in self.shard.modules() for p in m.parameters()}.values()
        return sum(p.numel() * p.element_size() for p in params) + self.shard.arena.bytes

    def forward(self, steps: list[ModelStep]) -> list[torch.Tensor]:
        """The draft's one forward: B conversations' steps in one pass on the device runtime, at the look-ahead
        lane's priority; the float32 logits at each one's last position."""
        return RUNTIME.call(self.device, self._forward, steps, lane=DRAFT)

    @torch.inference_mode()
    def _forward(self, steps: list[ModelStep]) -> list[torch.Tensor]:
        # an id only the target has (its padded rows) has no embedding here: the draft reads it as id 0
        xs = [torch.tensor([[t if t < self.vocab else 0 for t in s.ids]]) for s in steps]
        hs = self.shard.forward([(s.cache, s.committed, x, None) for s, x in zip(steps, xs)])
        return [logits[-1] for _, logits in self.shard.finish([(h[0], 1) for h in hs])]

    def forward_tree(self, step: ModelStep, parents: list[int], n: int) -> torch.Tensor:
        """A tree pass: step.ids are tree nodes after its committed context (parents as peers/speculation/tree.py's, -1 the
        context's last token), each seeing the context and its own ancestors; the float32 logits [n, vocab]
        after each of the last n nodes."""
        return RUNTIME.call(self.device, self._forward_tree, step, parents, n, lane=DRAFT)

    @torch.inference_mode()
    def _forward_tree(self, step: ModelStep, parents: list[int], n: int) -> torch.Tensor:
        x = torch.tensor([[t if t < self.vocab else 0 for t in step.ids]])
        (h,) = self.shard.forward([(step.cache, step.committed, x, parents)])
        return self.shard.finish([(h[0], n)])[0][1]


class ModelDrafter(Drafter):
    """A small causal LM that follows the context by longest common prefix: a rejected branch is rolled back by
    the engine's rule (a shorter `committed`), and after a fully accepted round the last drafted token is
    processed too. Its drafting is a generator of steps (chain_steps), driven alone (propose) or in lockstep with
    the other conversations' (draft)."""

    def __init__(self, model_dir: Path | None, target_vocab: int, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, name: str | None = None, conversations: int = CONVERSATIONS,
                 model: DraftModel | None = None):
        self.model = model or DraftModel(model_dir, device, dtype, conversations)
        self.name = name or Path(model_dir).name
        self.device = device
        self.target_vocab = target_vocab
        self.cache = self.model.shard.new_session()
        self.seen: list[int] = []  # tokens whose keys and values are in self.cache
        self.lock = threading.Lock()  # one drafting at a time on its cache

    @property
    def bytes(self) -> int:
        return self.model.bytes

    @property
    def together(self) -> Together:
        return self.model.together

    @property
    def room(self) -> int:
        """The positions it drafts within: its own context (max_position_embeddings, what its arena is sized by),
        which may be shorter than the target's. Past it the draft proposes nothing and the ring runs plain rounds,
        the simplest exact rule: its cache has no room much beyond it, a draft guesses poorly past the positions
        it was trained for, and drafting on a window of the latest tokens would re-read that window every round."""
        return self.model.shard.context

    def fork(self) -> Drafter:
        """Another conversation's drafter: the same weights and arena, a row of its own."""
        return ModelDrafter(None, self.target_vocab, device=self.device, name=self.name, model=self.model)

    def close(self) -> None:
        self.together.forget(self)

    def reset(self) -> None:
        self.seen = []

    def _crop(self, n: int) -> None:
        """(after a failed forward) Keep only the first n positions."""
        self.seen = self.seen[:n]
        self.cache.length = min(self.cache.length, n)

    def _run(self, step: ModelStep) -> torch.Tensor:
        return self.model.forward([step])[0]

    trees = True  # peers/speculation/drafting/model_tree.py

    def propose_tree(self, context: list[int], floor: float, depth: int, max_nodes: int,
                     stop: threading.Event | None = None, params: SamplingParams | None = None) -> Draft:
        with self.lock:
            t0 = time.perf_counter()
            d = draft_tree(self, context, floor, depth, max_nodes, stop, params or SamplingParams())
            self._measure(time.perf_counter() - t0, max(len(d.tokens), 1))
            return d

    # what a tree asks of the draft (model_tree.py)
    def sync(self, context: list[int]) -> torch.Tensor:
        """The cache follows the context; the logits after its last token."""
        logits = self._run(self._catch_up(context))
        self.seen = list(context)
        return logits

    def forward_nodes(self, tokens: list[int], parents: list[int], n: int) -> torch.Tensor:
        """Logits [n, vocab] after each of the last n of the tree's nodes so far: the whole tree runs as one tree
        pass after the context (its earlier levels again: the engine's pass sees a committed prefix and its own
        positions only). The nodes' keys and values lie past the context's length, which the next pass rolls
        back by the engine's rule."""
        return self.model.forward_tree(ModelStep(self.cache, len(self.seen), tokens), parents, n)

    def _catch_up(self, context: list[int]) -> ModelStep:
        """The step that brings its cache to `context`: the part it lacks, at least the last token (whose logits
        are wanted)."""
        if self.cache.evicted or self.cache.length < len(self.seen):  # its row went to another conversation
            self.seen = self.seen[: self.cache.length]
        common = common_prefix(context, self.seen)
        if common == len(context):  # context is a prefix of what we saw: recompute its last position
            common -= 1
        self.seen = self.seen[:common]
        return ModelStep(self.cache, common, context[common:])

    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        with self.lock:
            return self._drive(self.chain_steps(context, n, params, stop))

    async def draft(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        return await self.together.run(self, self.chain_steps(context, n, params, stop))

    def chain_steps(self, context: list[int], n: int, params, stop=None):
        """(steps) A chain of n drafts: the context's new part, then one step per draft but the last; its result
        is (tokens, q)."""
        n = min(n, self.room + 1 - len(context))  # the context and the n - 1 drafts fed back fit its room
        if n <= 0:
            return [], None
        t0 = time.perf_counter()
        logits = yield self._catch_up(context)
        self.seen = list(context)
        tokens, qs = [], []
        while True:
            if params.greedy:
                tok = int(logits.argmax())
            else:
                q = pad_vocab(params.probs(logits[None])[0], self.target_vocab)
                tok = draw(q, position_generator(params.seed, len(context) + len(tokens), stream=1))
                qs.append(q)
            tokens.append(tok)
            if len(tokens) == n or (stop is not None and stop.is_set()):
                break
            logits = yield ModelStep(self.cache, len(self.seen), [tok])
            self.seen.append(tok)
        self._measure(time.perf_counter() - t0, len(tokens))
        return tokens, (torch.stack(qs) if qs else None)


def check_same_tokenizer(target_tok, draft_dir: Path) -> None:
    from transformers import AutoTokenizer

    from peers.base.errors import ModelError

    draft_tok = AutoTokenizer.from_pretrained(draft_dir)
    probe = "Hello, world! 1234 def f(x): return x**2 — ünïcödé 你好"
    if target_tok.get_vocab() != draft_tok.get_vocab() or target_tok.encode(probe) != draft_tok.encode(probe):
        raise ModelError(f"the draft {draft_dir.name} does not use the target's tokenizer; pick a draft of the same family")
