"""One contiguous range of a model's decoder layers (loaded by peers/compute/loading.py), run with transformers'
own decoder layers and rotary embedding, on a KV arena of our own (peers/compute/kv.py) whose masks are computed on
the device, so short passes can replay as CUDA graphs (peers/compute/graphs.py).

The first stage also holds the token embedding; the host's shard also holds the final norm and LM head.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from peers.models import families as architectures
from peers.compute import invariant, kv, packed
from peers.base import tree_layout
from peers.compute.cpu_linear import use_columns
from peers.compute.graphs import Graphs, pad, shape
from peers.compute.loading import Kept, load_config, load_parts
from peers.base.errors import ModelError
from peers.base.limits import CONVERSATIONS, MAX_CONTEXT, cache_positions
from peers.base.span import Span
from peers.compute.kv import RoomError, SessionCache
from peers.compute.memory import module_bytes
from peers.base.dtypes import DTYPES


class Shard:
    def __init__(self, model_dir: Path, span: Span, *, embed: bool, head: bool,
                 dtype: str = "float32", quant: str = "none", device: str = "cpu", graphs: bool = True,
                 padded: bool = False, context: int | None = None, conversations: int = CONVERSATIONS,
                 kept: Kept | None = None):
        """graphs: capture CUDA graphs of short passes where the device is a GPU. padded: run short passes as
        the graphs do (padded to their bucket, over the whole room) even where nothing is captured, which is
        how a CPU checks that path. context, conversations: the KV arena's rows (peers/compute/kv.py), as planned;
        context None: the model's own limit, capped at MAX_CONTEXT. kept: the previous shard's parts (Shard.keep),
        used where they were loaded the same way."""
        self.config = config = load_config(model_dir)
        if config.num_hidden_layers != span.n_layers:
            raise ModelError(f"model has {config.num_hidden_layers} layers, plan says {span.n_layers}")
        self.span, self.device, self.dtype = span, torch.device(device), DTYPES[dtype]
        self.hidden_size = config.hidden_size
        self.kv_heads = config.num_key_value_heads or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.family = architectures.family(config.model_type)
        self.layer_types = self.family.layer_types(config)
        self.quant = quant
        parts = load_parts(model_dir, config, span, embed=embed, head=head, dtype=self.dtype, dtype_name=dtype,
                           quant=quant, device=self.device, kept=kept)
        self.layers, self.embed, self.norm, self.lm_head = parts.layers, parts.embed, parts.norm, parts.lm_head
        self.loaded_as = parts.loaded_as
        self.rotary = self.family.rotary(config, parts.inner, self.device, self._kinds())
        use_columns(self.layers, self.lm_head)  # on a CPU, the head's few rows at the memory's full speed
        if self.embed is not None:
            self.family.prepare_embedding(config, self.embed, self.device)
        del parts
        # a CPU pass's rows computed as one-token passes would (peers/compute/invariant.py): an answer then never
        # depends on the passes it went through; transformers' sdpa only (an eager family keeps its own)
        self.invariant = self.device.type == "cpu" and config.sfchat_attention == "sdpa"
        capture = graphs and self.device.type == "cuda"
        self.graphs = Graphs(self.device, capture) if capture or padded else None
        self.context = context or min(getattr(config, "max_position_embeddings", 0) or MAX_CONTEXT, MAX_CONTEXT)
        self.arena = kv.Arena(span.size, conversations, self.kv_heads, self.head_dim, cache_positions(self.context),
                              self.dtype, self.device, zeroed=self.graphs is not None)

    def close(self) -> None:
        """(a re-plan) Its graphs go; the arena goes with the shard."""
        if self.graphs is not None:
            self.graphs.close()

    def bytes(self) -> int:
        """What its layers and KV arena hold."""
        return sum(map(module_bytes, self.layers)) + self.arena.bytes

    def held(self) -> dict[int, torch.nn.Module]:
        """Its layers by their index in the model."""
        return dict(zip(range(self.span.start, self.span.end), self.layers))

    def keep(self, span: Span, embed: bool, head: bool) -> Kept:
        """The parts a next shard of `span` (with the embedding, the head) can use; the rest goes with this one."""
        layers = {i: layer for i, layer in self.held().items() if span.start <= i < span.end}
        return Kept(self.loaded_as, layers, self.embed if embed else None, *((self.norm, self.lm_head) if head
                                                                             else (None, None)))

    def modules(self) -> list[torch.nn.Module]:
        return [m for m in (self.layers, self.embed, self.norm, self.lm_head) if m is not None]

    def new_session(self) -> SessionCache:
        """A conversation's cache on this shard: it takes a row of the arena at its first pass."""
        return SessionCache()

    @torch.inference_mode()
    def forward(self, passes: list[tuple]) -> list[torch.Tensor]:
        """One pass of B conversations: each (cache, committed, x, parents[, keep]) runs x (ids [1,T] on the first
        stage, else hidden [1,T,H]) at positions committed..committed+T-1 on the first `committed` positions its
        cache holds: setting that length is the ring's only rollback rule. `parents`: the last len(parents)
        positions are a tree of drafts (peers/speculation/tree.py), each at its depth and seeing its ancestors. Returns each
        one's hidden states [1, T, H]. Up to 16 conversations of up to 32 positions are padded to a graph's shape
        (peers/compute/graphs.py) where graphs run; anything else runs eagerly, the positions of all packed in one
        sequence (peers/compute/packed.py).

        keep (None: as a 4-tuple): the pass builds on m positions of a pass still in flight (not yet committed):
        their cache columns (ascending, in [committed, length)) first move, in order, to columns
        committed..committed+m-1, and x's rows follow at committed+m..; `parents` is then the full tree over the
        m kept and T new rows (tree_layout.full_parents: entry i in [-1, i), -1 the last committed position), each row
        at position committed - 1 + its depth, seeing the committed prefix, its ancestors and itself. A batch
        with any keep runs eagerly (a graph's meta has no room for kept columns)."""
        passes = [tuple(p) if len(p) == 5 else (*p, None) for p in passes]
        for s, committed, x, parents, keep in passes:
            if keep is not None:
                tree_layout.check_parents(parents, len(keep) + x.shape[1])
        key = None
        if self.padding and all(keep is None for *_, keep in passes):
            key = shape(len(passes), max(x.shape[1] for _, _, x, _, _ in passes))
        if key and any(committed + key[1] > self.arena.room for _, committed, _, _, _ in passes):
            key = None  # a conversation at its room's end: padding would write past it, so this pass runs eagerly
        self._lay_out([(s, committed, keep, x.shape[1]) for s, committed, x, _, keep in passes])
        hs = self._padded([p[:4] for p in passes], key) if key else self._eager(passes)
        for s, committed, x, _, keep in passes:
            s.length = committed + len(keep or ()) + x.shape[1]
        return hs

    @torch.inference_mode()
    def skip(self, cache: SessionCache, committed: int, keep: list[int] | None, n: int) -> None:
        """A pass this member does not compute (the host cancelled it): the conversation's columns laid out as
        forward would leave them (kept ones moved, n more after them that nobody will attend to), so every
        stage's columns stay where the host expects them whether it computed the pass or not."""
        self._lay_out([(cache, committed, keep, n)])
        cache.length = committed + len(keep or ()) + n

    def _lay_out(self, items: list[tuple[SessionCache, int, list[int] | None, int]]) -> None:
        """Before a pass of (cache, committed, keep, n) each: everything checked first (nothing moves for a bad
        one), then each one's row placed, its length set to `committed` and its kept columns moved after it."""
        for s, committed, keep, n in items:
            if committed > s.length:
                raise ValueError(f"frame says {committed} positions are committed but this peer holds {s.length}")
            kv.check_keep(keep, committed, s.length)
            if committed + len(keep or ()) + n > self.arena.room:
                raise RoomError(f"the conversation has outgrown its room: {committed + len(keep or ()) + n:,} "
                                f"positions, and this member keeps {self.context:,} per conversation (--max-context)")
        self.arena.place([s for s, _, _, _ in items])
        now = time.monotonic()
        for s, committed, keep, _ in items:
            s.length, s.last_used = committed, now
            if keep and keep != list(range(committed, committed + len(keep))):  # (in place already: nothing to do)
                at = torch.tensor(keep, device=self.device)
                for cache in (self.arena.keys, self.arena.values):
                    row = cache[:, s.row]  # [layers, kv_heads, room, head_dim]: gathered first, as a column may
                    row[:, :, committed : committed + len(keep)] = row.index_select(2, at)  # land on one kept later
            s.length += len(keep or ())

    def fits(self, committed: int, n: int) -> bool:
        """Whether a pass of n positions after `committed` fits a conversation's room."""
        return committed + n <= self.arena.room

    @property
    def padding(self) -> bool:
        return self.graphs is not None and not self.graphs.failed

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.device) if self.embed is not None else x.to(self.device, self.dtype)

    def _eager(self, passes) -> list[torch.Tensor]:
        """Exactly the passes' positions, over the columns their masks need (no work on columns nobody sees)."""
        bounds, start = [], 0
        for _, _, x, _, _ in passes:
            bounds.append((start, start + x.shape[1]))
            start += x.shape[1]
        x = torch.cat([self._input(x) for _, _, x, _, _ in passes], dim=1)
        h = self.embed(x) if self.embed is not None else x
        if self.span.size:
            rows, indices, views, metas, plans = [], [], [], [], []
            for s, committed, x_i, parents, keep in passes:
                t, m = x_i.shape[1], len(keep or ())
                full = parents if keep is not None else tree_layout.full_parents(t, parents or [])
                rows.append(s.row)
                indices.append(committed + m + torch.arange(t, device=self.device))
                metas.append(self._meta(committed, m, t, full))
                if self.invariant:
                    plans.append(invariant.groups(committed, m, full))
                    self.arena.clear_tail(s.row, committed + m + t, invariant.KEY_STEP)
                else:
                    views.append(self._views(committed, m + t))
            pos = torch.cat([m[1] for m in metas], dim=1)
            if self.invariant:  # each row's keys are its positions 0..p: no mask to build
                masks = {kind: packed.Packed([None] * len(passes), bounds) for kind in self._kinds()}
            else:
                masks = {kind: packed.Packed([self._mask(*m, v[layer], kind) for m, v in zip(metas, views)], bounds)
                         for kind, layer in self._kinds().items()}
            writer = packed.PackedWriter(self.arena, rows, self.span.start, indices, views or None, bounds,
                                         plans or None)
            h = self._layers(h, masks, pos, writer)
        return [h[:, a:b] for a, b in bounds]

    def _meta(self, committed: int, m: int, t: int, full: list[int]) -> tuple[torch.Tensor, ...]:
        """(device) An eager pass's mask inputs, moved in one copy: committed [1], the T rows' positions [1, T],
        which of the m + T pass columns each row sees [1, T, m + T], and those columns' positions [1, m + T]."""
        w = m + t
        span_pos = tree_layout.positions(committed, w, full)[0]
        sees = tree_layout.ancestors(w, full)[m:]
        flat = torch.cat([torch.tensor([committed]), span_pos, sees.flatten().long()]).to(self.device)
        span_pos = flat[1 : 1 + w][None]
        return flat[:1], span_pos[:, m:], flat[1 + w :].view(1, t, w).bool(), span_pos

    def _padded(self, passes, key: tuple[int, int]) -> list[torch.Tensor]:
        """The passes padded to B x T rows and positions (what a graph replays) over their rows' whole room."""
        b, t = key
        xs = [pad(x, t) for _, _, x, _ in passes]
        metas = [kv.meta(c, x.shape[1], p, t) for _, c, x, p in passes]
        rows = [s.row for s, _, _, _ in passes]
        empty = b - len(passes)  # places no conversation takes: a pass of one position in the scratch row
        xs += [torch.zeros_like(xs[0])] * empty
        metas += [kv.meta(0, 1, None, t)] * empty
        rows += [self.arena.scratch] * empty
        x = torch.cat(xs)
        if self.embed is None:
            x = x.to(self.dtype)
        h = self.graphs.run(self._step, key, x, torch.stack(metas), torch.tensor(rows))
        return [h[i : i + 1, : x_i.shape[1]] for i, (_, _, x_i, _) in enumerate(passes)]

    def _step(self, x: torch.Tensor, meta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """(device) The layers over a padded pass, everything computed from x, meta and rows (a graph's inputs)."""
        t = x.shape[1]
        committed, pos, sees = kv.unpack(meta, t)
        h = self.embed(x) if self.embed is not None else x
        if not self.span.size:
            return h
        view = (0, self.arena.room)
        masks = {kind: self._mask(committed, pos, sees, None, view, kind) for kind in self._kinds()}
        columns = committed[:, None] + torch.arange(t, device=self.device)
        return self._layers(h, masks, pos, kv.ArenaWriter(self.arena, self.span.start, rows, columns))

    def _layers(self, h, masks, pos, cache) -> torch.Tensor:
        ropes = self.rotary(h, pos)
        for i, layer in zip(range(self.span.start, self.span.end), self.layers):
            kind = self.layer_types[i]
            h = layer(h, attention_mask=masks[kind], position_embeddings=ropes[kind], position_ids=pos,
                      cache=cache, use_cache=True)
        return h

    def _views(self, committed: int, t: int) -> dict[int, tuple[int, int]]:
        """Each layer's cache columns in an eager pass: up to the pass's end, from the window's start for a
        sliding layer (its earliest row is at position `committed`)."""
        window = self._window("sliding_attention") or 0
        lo = {"full_attention": 0, "sliding_attention": max(0, committed - window + 1)}
        return {i: (lo[self.layer_types[i]], committed + t) for i in range(self.span.start, self.span.end)}

    def _mask(self, committed, pos, sees, span_pos, view: tuple[int, int], kind: str) -> torch.Tensor:
        mask = kv.visible(committed, pos, sees, *view, self._window(kind), span_pos)
        if self.config.sfchat_attention == "eager":  # eager attention adds its mask to the scores
            return torch.zeros(mask.shape, dtype=self.dtype, device=self.device).masked_fill(
                ~mask, torch.finfo(self.dtype).min)
        return mask

    def _window(self, kind: str) -> int | None:
        return getattr(self.config, "sliding_window", None) if kind == "sliding_attention" else None

    def _kinds(self) -> dict[str, int]:
        """Each kind of attention among this shard's layers -> the first layer of that kind."""
        kinds: dict[str, int] = {}
        for i in range(self.span.start, self.span.end):
            kinds.setdefault(self.layer_types[i], i)
        return kinds

    @torch.inference_mode()
    def finish(self, passes: list[tuple[torch.Tensor, int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each conversation's final normalised hidden states at every position (what a feature draft reads) and
        its logits at the last n: for (hidden [T, H], n) each; the norm and the LM head (the largest matrix of
        all) run once over all of them."""
        feats = self.norm(torch.cat([h for h, _ in passes]).to(self.device, self.dtype))
        parts = torch.split(feats, [h.shape[0] for h, _ in passes])
        last = torch.cat([p[-n:] for p, (_, n) in zip(parts, passes)])
        logits = self.family.logits(self.config, self.lm_head(last)).float()
        return list(zip(parts, torch.split(logits, [n for _, n in passes])))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [1, T, vocab] at every position of hidden states [1, T, H]."""
        return self.finish([(h[0], h.shape[-2])])[0][1][None]
