"""The host's own stage: its layers (the first span, with the embedding) before a pass goes round, and the final
norm and LM head after it comes back, each run on the process's device runtime (peers/runtime.py) from one of
trio's worker threads, one at a time, finished on the device before it is timed: trio's thread never waits for
the device."""
from __future__ import annotations

import torch
import trio

from . import device, tensors
from .runtime import RUNTIME
from .threads import call_with_threads


class HostStage:
    def __init__(self, planner, device_name: str):
        self.planner, self.device = planner, device_name
        self.compute = trio.CapacityLimiter(1)
        self.threads = torch.get_num_threads()  # for the shard's compute, whatever a draft's thread has set

    async def _call(self, fn, *args):
        return await trio.to_thread.run_sync(call_with_threads, self.threads, RUNTIME.call, self.device, fn, *args,
                                             limiter=self.compute)

    async def first(self, passes: list, pack: bool):
        """Each conversation's hidden states after the host's layers, and (pack) the frame's copy of all of them
        on the CPU."""
        return await self._call(self._first, passes, pack)

    def _first(self, passes: list, pack: bool):
        hs = self.planner.shard.forward(passes)
        out = tensors.host_bytes(torch.cat(hs, dim=1)) if pack else (None, None)
        device.finish(self.device)
        return hs, out

    async def head(self, passes: list[tuple[torch.Tensor, int]]) -> list:
        """Features, logits and each logits row's argmax (the target's greedy choice, taken where the logits
        are: only those ids come to the CPU) of each conversation's (hidden states [T, H], n_logits), the head
        run once over all of them."""
        return await self._call(self._head, passes)

    def _head(self, passes: list) -> list:
        shard = self.planner.shard
        outs = shard.finish([(h.to(self.device, non_blocking=True), n) for h, n in passes])
        best = [logits.argmax(-1) for _, logits in outs]
        if shard.device.type != "cpu":
            best = [torch.empty(b.shape, dtype=b.dtype, pin_memory=True).copy_(b, non_blocking=True) for b in best]
        device.finish(self.device)
        return [(feats, logits, b.tolist()) for (feats, logits), b in zip(outs, best)]
