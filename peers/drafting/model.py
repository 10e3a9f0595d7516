"""A stand-alone draft model of the target's family, run by the same pass engine as the ring (peers/shard.py): the
small model's full span with its embedding and head, in the host's dtype, its keys and values in an arena of its
own, its passes on the process's device runtime (peers/runtime.py) at the look-ahead lane's priority, its short
passes replayed as CUDA graphs like the ring's. Nothing is compiled.

`step(passes)` is the draft's one forward: B conversations' (cache, committed, ids) in one pass, the logits at each
one's last position. A chain of drafts (propose) or a tree of them is a loop of steps on top of it.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ..kv import SessionCache
from ..plan import CONVERSATIONS, Span
from ..runtime import DRAFT, RUNTIME
from ..sampling import draw, pad_vocab, position_generator
from ..tensors import DTYPE_NAMES
from .base import Drafter, common_prefix


class DraftModel:
    """The draft's weights and arena, shared by every conversation's drafter (ModelDrafter.fork)."""

    def __init__(self, model_dir: Path, device: str, dtype: torch.dtype, conversations: int):
        from ..shard import Shard, load_config

        n = load_config(model_dir).num_hidden_layers
        self.shard = Shard(Path(model_dir), Span(0, n, n), embed=True, head=True, dtype=DTYPE_NAMES[dtype],
                           device=device, conversations=conversations)
        self.vocab = self.shard.embed.num_embeddings

    @property
    def bytes(self) -> int:
        """Its weights and its arena (counted in the host's plan)."""
        params = {id(p): p for m in self.shard.modules() for p in m.parameters()}.values()
        return sum(p.numel() * p.element_size() for p in params) + self.shard.arena.bytes

    def step(self, passes: list[tuple[SessionCache, int, list[int]]]) -> list[torch.Tensor]:
        """(device runtime) One forward of B conversations: each (cache, committed, ids) feeds ids after the
        first `committed` positions its cache keeps; the float32 logits at each one's last position."""
        # an id only the target has (its padded rows) has no embedding here: the draft reads it as id 0
        xs = [torch.tensor([[t if t < self.vocab else 0 for t in ids]]) for _, _, ids in passes]
        hs = self.shard.forward([(s, c, x, None) for (s, c, _), x in zip(passes, xs)])
        return [logits[-1] for _, logits in self.shard.finish([(h[0], 1) for h in hs])]


class ModelDrafter(Drafter):
    """A small causal LM that follows the context by longest common prefix: a rejected branch is rolled back by
    the engine's rule (a shorter `committed`), and after a fully accepted round the last drafted token is
    processed too."""

    def __init__(self, model_dir: Path | None, target_vocab: int, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, name: str | None = None, conversations: int = CONVERSATIONS,
                 model: DraftModel | None = None):
        self.model = model or DraftModel(model_dir, device, dtype, conversations)
        self.name = name or Path(model_dir).name
        self.device = device
        self.target_vocab = target_vocab
        self.draft_vocab = self.model.vocab
        self.cache = self.model.shard.new_session()
        self.seen: list[int] = []  # tokens whose keys and values are in self.cache
        self.next_logits: torch.Tensor | None = None  # logits after the last token of self.seen

    @property
    def bytes(self) -> int:
        return self.model.bytes

    def fork(self) -> Drafter:
        """Another conversation's drafter: the same weights and arena, a row of its own."""
        return ModelDrafter(None, self.target_vocab, device=self.device, name=self.name, model=self.model)

    def reset(self) -> None:
        self.seen, self.next_logits = [], None

    def _feed(self, tokens: list[int]) -> None:
        (self.next_logits,) = self.model.step([(self.cache, len(self.seen), tokens)])
        self.seen += tokens

    def _sync(self, context: list[int]) -> None:
        if self.cache.evicted or self.cache.length < len(self.seen):  # its row went to another conversation
            self.seen = self.seen[: self.cache.length]
        common = common_prefix(context, self.seen)
        if common == len(context):  # context is a prefix of what we saw: recompute its last position
            common -= 1
        self.seen = self.seen[:common]
        self._feed(context[common:])

    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        return RUNTIME.call(self.device, self._propose, context, n, params, stop, lane=DRAFT)

    @torch.inference_mode()
    def _propose(self, context, n, params, stop):
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


def check_same_tokenizer(target_tok, draft_dir: Path) -> None:
    from transformers import AutoTokenizer

    from ..errors import ModelError

    draft_tok = AutoTokenizer.from_pretrained(draft_dir)
    probe = "Hello, world! 1234 def f(x): return x**2 — ünïcödé 你好"
    if target_tok.get_vocab() != draft_tok.get_vocab() or target_tok.encode(probe) != draft_tok.encode(probe):
        raise ModelError(f"the draft {draft_dir.name} does not use the target's tokenizer; pick a draft of the same family")
