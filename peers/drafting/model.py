"""A stand-alone draft model of the target's family, with its own KV cache."""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ..cpu_linear import use_columns
from ..sampling import draw, pad_vocab, position_generator
from .base import Drafter, common_prefix
from .model_tree import draft_tree

log = logging.getLogger("peers.drafting")
STATIC_LEN = 4096  # positions in a static draft cache; past them the draft goes on eagerly

_graph_thread: ThreadPoolExecutor | None = None
_graph_lock = threading.Lock()


def graph_thread() -> ThreadPoolExecutor:
    """The one thread of this process that compiles, captures, replays and resets draft graphs. Never shut down:
    before torch 2.13 CUDA-graph trees keep their state on the thread that first used them (pytorch#123177), so
    a second thread (a new drafter's, after a /draft switch) fails an assertion in cudagraph_trees."""
    global _graph_thread
    with _graph_lock:
        if _graph_thread is None:
            _graph_thread = ThreadPoolExecutor(1, thread_name_prefix="draft-graph", initializer=_own_graph_state)
        return _graph_thread


def _own_graph_state() -> None:
    """On the graph thread, first: import CUDA-graph trees here, so that this thread owns their state. Where they
    were imported on another thread already (torch < 2.13 then sets their state up for that thread alone), set
    it up for this one as the import does."""
    if not torch.cuda.is_available():
        return
    from collections import defaultdict

    from torch._inductor import cudagraph_trees as trees

    if hasattr(trees, "_initialize_tls") or hasattr(trees.local, "tree_manager_containers") \
            or torch._C._is_key_in_tls("tree_manager_containers"):
        return  # torch 2.13+ sets each thread up itself, or this thread has it
    trees.local.tree_manager_containers = {}
    trees.local.tree_manager_locks = defaultdict(threading.Lock)
    torch._C._stash_obj_in_tls("tree_manager_containers", trees.local.tree_manager_containers)
    torch._C._stash_obj_in_tls("tree_manager_locks", trees.local.tree_manager_locks)


class ModelDrafter(Drafter):
    """A small causal LM with its own KV cache. The cache follows the context by longest common prefix, so a
    rejected branch is cropped away and, after a fully accepted round, the last drafted token is processed too."""

    def __init__(self, model_dir: Path, target_vocab: int, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 name: str | None = None, static: bool | None = None, max_len: int = STATIC_LEN, model=None):
        from transformers import AutoModelForCausalLM, StaticCache

        # `model`: one already built (a distilled draft is assembled from its own and its target's tensors)
        model = model if model is not None else AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        self.model = model.to(device).eval()
        use_columns(self.model)
        self.name = name or Path(model_dir).name
        self.device = device
        self.target_vocab = target_vocab
        self.draft_vocab = self.model.get_input_embeddings().num_embeddings
        cfg = self.model.config
        self.static = str(device).startswith("cuda") if static is None else static
        # On CUDA one-token steps dominate and Python kernel launches dominate them: a static cache (fixed
        # addresses; crop just moves its length back) lets torch.compile capture each step as a CUDA graph.
        self.max_len = min(max_len, getattr(cfg, "max_position_embeddings", max_len))
        self.cache = StaticCache(config=cfg, max_cache_len=self.max_len) if self.static else self._eager_cache()
        self.step = self.model
        if self.static and str(device).startswith("cuda"):
            self.step = torch.compile(self.model, mode="reduce-overhead", fullgraph=False)
        self.lent = False  # a fork (a served conversation) drafts on this very cache and graph (see fork)
        self.seen: list[int] = []  # tokens whose keys and values are in self.cache
        self.next_logits: torch.Tensor | None = None  # logits after the last token of self.seen

    @property
    def bytes(self) -> int:
        """What its weights hold (counted in the host's plan)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def _eager_cache(self):
        from ..shard import rollback_cache

        return rollback_cache(self.model.config)

    def fork(self) -> Drafter:
        # The first conversation drafts on this drafter itself (its graphs: capturing them again per conversation
        # costs more than a short answer gains); one beside it gets an eager copy on a cache of its own.
        if self.static and not self.lent:
            self.lent = True
            return Lent(self)
        return ModelDrafter(None, self.target_vocab, device=self.device, name=self.name, static=False,
                            max_len=self.max_len, model=self.model)

    def close(self) -> None:
        if self.step is not self.model:
            # compiled code stays cached, holding the model and its graphs' memory pool, until dynamo forgets it;
            # on the graph thread, where the graphs were captured
            graph_thread().submit(self._forget_graphs).result()

    def _forget_graphs(self) -> None:
        torch._dynamo.reset()
        self.step = self.model
        if str(self.device).startswith("cuda"):
            torch.cuda.empty_cache()

    def _reset(self) -> None:
        self.cache.crop(-len(self.seen)) if self.seen else None
        self.seen, self.next_logits = [], None

    def _go_eager(self) -> None:
        """Past the static cache's end: on with an eager cache that grows, the graphs no longer used."""
        log.warning("the draft's context passed its static cache (%d positions): drafting eagerly from here",
                    self.max_len)
        self.static, self.step, self.cache = False, self.model, self._eager_cache()
        seen, self.seen = self.seen, []
        if seen:
            self._feed(seen)

    @torch.inference_mode()
    def _feed(self, tokens: list[int]) -> None:
        # an id only the target has (its padded rows) has no embedding here: the draft reads it as id 0
        if self.static and len(self.seen) + len(tokens) > self.max_len:
            self._go_eager()
        v = self.draft_vocab
        ids = torch.tensor([[t if t < v else 0 for t in tokens]], device=self.device)
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

    def _on_graph_thread(self, fn, *a):
        # a CUDA graph is captured and replayed by one thread, and trio's worker threads are many
        if self.step is self.model and not self.static:
            return fn(*a)
        return graph_thread().submit(fn, *a).result()

    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        return self._on_graph_thread(self._propose, context, n, params, stop)

    trees = True  # peers/drafting/model_tree.py

    def propose_tree(self, context, floor, depth, max_nodes, stop=None, params=None):
        return self._on_graph_thread(self._propose_tree, context, floor, depth, max_nodes, stop, params)

    @torch.inference_mode()
    def _propose_tree(self, context, floor, depth, max_nodes, stop, params):
        t0 = time.perf_counter()
        if self.static and len(context) + depth * max_nodes > self.max_len:  # (a tree's entries at most)
            self._go_eager()
        d = draft_tree(self, context, floor, depth, max_nodes, stop, params)
        self._measure(time.perf_counter() - t0, max(len(d.tokens), 1))
        return d

    # what a tree asks of the draft (model_tree.py)
    def sync(self, context: list[int]) -> torch.Tensor:
        """The cache follows the context; the logits after its last token."""
        self._sync(context)
        return self.next_logits

    def forward_nodes(self, ids: list[int], positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] after each of these tokens at these positions, each seeing what `mask` [1, 1, n,
        cache + n] lets it; their keys and values are appended to the cache (drop takes them back)."""
        v = self.draft_vocab
        if self.static:  # a static cache's keys run to its end: the columns past the entries see nothing
            mask = torch.nn.functional.pad(mask, (0, self.max_len - mask.shape[-1]))
        dtype = self.model.dtype
        additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
        out = self.model(input_ids=torch.tensor([[t if t < v else 0 for t in ids]], device=self.device),
                         position_ids=positions.to(self.device), attention_mask=additive.to(self.device),
                         cache=self.cache, use_cache=True)
        return out.logits[0].float()

    def drop(self, n: int) -> None:
        """Forget the cache's last n entries (a tree's)."""
        if n:
            self.cache.crop(-n)

    def reset(self) -> None:
        return self._on_graph_thread(self._reset)

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


class Lent:
    """A served conversation's handle on its server's static drafter: every call goes to that drafter; closing
    the handle (the answer is done) lends it to the next conversation."""

    def __init__(self, owner: ModelDrafter):
        self.owner = owner

    def __getattr__(self, name):  # name, ms_per_token, confident, …: the owner's
        return getattr(self.owner, name)

    def observe(self, start, ids, feats) -> None:
        pass

    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        return self.owner.propose(context, n, params, stop)

    def reset(self) -> None:
        return self.owner.reset()

    def fork(self) -> Drafter:
        return self.owner.fork()

    def close(self) -> None:
        self.owner.lent = False


def check_same_tokenizer(target_tok, draft_dir: Path) -> None:
    from transformers import AutoTokenizer

    from ..errors import ModelError

    draft_tok = AutoTokenizer.from_pretrained(draft_dir)
    probe = "Hello, world! 1234 def f(x): return x**2 — ünïcödé 你好"
    if target_tok.get_vocab() != draft_tok.get_vocab() or target_tok.encode(probe) != draft_tok.encode(probe):
        raise ModelError(f"the draft {draft_dir.name} does not use the target's tokenizer; pick a draft of the same family")
