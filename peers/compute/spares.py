"""Layers a re-plan took from this process, kept loaded where memory allows: the plan that hands them back (a lost
member's layers taken on again, or its return undone) reads and quantizes nothing, and a loss costs its detection
and the replays, not a load.

A member gone silent is usually lost 2.5 s later; meanwhile the ring waits on it, and the others' cores are free.
So the host has each of them warm up: load as spares, beforehand, the layers a plan without that member would give
it (peers/plan/planner.py). A member heard again leaves the spares for another time.

Only on a CPU, no more than the layers the process holds itself, within a quarter of the RAM available and within
what it offers the ring (--offer-gb) beyond its plan: there memory is rarely what bounds a stage. A GPU's memory is the plan's to fill
(weights, then the KV arena), so nothing is kept there."""
from __future__ import annotations

import torch
import trio

from peers.base.dtypes import DTYPES
from peers.base.span import Span
from peers.compute.loading import Kept, load_parts
from peers.compute.memory import free_bytes, module_bytes

SHARE = 4  # spares take at most 1/SHARE of the memory available


class Spares:
    def __init__(self, device: str, room=lambda: None):
        """room(): the bytes the process's offer leaves beyond its plan, or None where it offers what is free."""
        self.on, self.room = str(device) == "cpu", room
        self.loaded_as: tuple | None = None
        self.layers: dict[int, torch.nn.Module] = {}
        self.bytes = 0
        self.lock = trio.Lock()  # held while warming up: a re-plan waits for it, then takes what it loaded

    async def settled(self) -> None:
        """Until a warm-up under way is done."""
        async with self.lock:
            pass

    async def warm(self, span: Span, held: dict[int, torch.nn.Module], loaded_as: tuple, config) -> None:
        """Load as spares, in a worker thread, the layers of `span` this process neither holds (`held`, loaded as
        `loaded_as`) nor keeps already."""
        if not self.on:
            return
        async with self.lock:
            if loaded_as != self.loaded_as:
                self.layers, self.bytes, self.loaded_as = {}, 0, loaded_as
            have = {**held, **self.layers}
            missing = [i for i in range(span.start, span.end) if i not in have]
            if not missing:
                return
            part = Span(missing[0], missing[-1] + 1, span.n_layers)
            model_dir, dtype_name, quant, device = loaded_as
            parts = await trio.to_thread.run_sync(lambda: load_parts(
                model_dir, config, part, embed=False, head=False, dtype=DTYPES[dtype_name], dtype_name=dtype_name,
                quant=quant, device=torch.device(device), kept=Kept(loaded_as, have)))
            for i, layer in zip(range(part.start, part.end), parts.layers):
                if i not in have:
                    self.layers[i] = layer
            self._trim(span.size)

    def trade(self, kept: Kept | None, old: dict[int, torch.nn.Module], span: Span) -> Kept | None:
        """A re-plan to `span`: the old span's layers `old` that it drops become spares (memory allowing), and
        the spares in `span` go to the next shard through `kept` (None: nothing is kept, the spares neither)."""
        if not self.on or kept is None:
            self.layers, self.bytes = {}, 0
            return kept
        if kept.loaded_as != self.loaded_as:  # another dtype or quantization: nothing kept is of use
            self.layers, self.bytes, self.loaded_as = {}, 0, kept.loaded_as
        for i, layer in old.items():
            if not span.start <= i < span.end and i not in kept.layers:
                self.layers[i] = layer
        for i in [i for i in self.layers if span.start <= i < span.end]:
            kept.layers.setdefault(i, self.layers.pop(i))
        self._trim(span.size)
        return kept

    def _trim(self, own: int) -> None:
        """No more layers than the `own` the process holds, within 1/SHARE of the memory available (counting what
        the spares hold) and the room the offer leaves: the last layers go first."""
        for i in sorted(self.layers, reverse=True)[:max(len(self.layers) - own, 0)]:
            del self.layers[i]
        sizes = {i: module_bytes(layer) for i, layer in self.layers.items()}
        budget = (free_bytes("cpu") + sum(sizes.values())) // SHARE
        if (room := self.room()) is not None:
            budget = min(budget, max(room, 0))
        for i in sorted(sizes, reverse=True):
            if sum(sizes.values()) <= budget:
                break
            del self.layers[i], sizes[i]
        self.bytes = sum(sizes.values())
