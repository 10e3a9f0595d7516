"""A member's speed: milliseconds per decoder layer, timed on this process's own device, dtype, quantization and
threads before it offers itself, so the host can place layers by speed (peers/plan/placement.py).

The member does not know the model yet (the host names it in the assignment), so it times a reference layer of a
fixed shape (peers/base/limits.py: REFERENCE_LAYER; random weights): its attention's and MLP's matrices and an
attention over a short context, at the pass sizes the ring uses. The host scales the figure by the model's layer
size. SFCHAT_TEST_MS_PER_LAYER fixes the figure (tests: a deterministic plan): a number, or NAME=MS,… by the
member's name ("host" for the host).
"""
from __future__ import annotations

import logging
import os
import statistics
import time

import torch
import torch.nn.functional as F

from peers.base.dtypes import DTYPES
from peers.base.limits import REFERENCE_LAYER, SPEED_POSITIONS
from peers.compute import cpu_quant, quant as quantization

log = logging.getLogger("sfchat.speed")
CONTEXT = 256  # positions of cache each timed pass attends to
BURSTS, PASSES = 6, 3  # short bursts of a few passes at each size, spread over the timing (figure())
GAP_S = 0.12  # between bursts: the timing spans about a second, not one lucky moment
BUDGET_S = 1.0  # a device slow enough to take longer times fewer bursts


class ReferenceLayer(torch.nn.Module):
    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int):
        super().__init__()
        d = hidden // heads
        self.heads, self.kv_heads, self.d = heads, kv_heads, d
        self.q, self.o = torch.nn.Linear(hidden, hidden, bias=False), torch.nn.Linear(hidden, hidden, bias=False)
        self.k, self.v = (torch.nn.Linear(hidden, kv_heads * d, bias=False) for _ in range(2))
        self.gate, self.up = (torch.nn.Linear(hidden, intermediate, bias=False) for _ in range(2))
        self.down = torch.nn.Linear(intermediate, hidden, bias=False)
        self.norm1, self.norm2 = torch.nn.RMSNorm(hidden), torch.nn.RMSNorm(hidden)

    def forward(self, x: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.norm1(x)
        q = self.q(h).view(1, t, self.heads, self.d).transpose(1, 2)
        k = torch.cat([cache_k, self.k(h).view(1, t, self.kv_heads, self.d).transpose(1, 2)], 2)
        v = torch.cat([cache_v, self.v(h).view(1, t, self.kv_heads, self.d).transpose(1, 2)], 2)
        rep = self.heads // self.kv_heads
        a = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))
        x = x + self.o(a.transpose(1, 2).reshape(1, t, -1))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _layer(device: str, dtype: str, quant: str) -> ReferenceLayer:
    r = REFERENCE_LAYER
    layer = ReferenceLayer(r["hidden"], r["intermediate"], r["heads"], r["kv_heads"])
    if quant == "auto":  # a member's, before it knows the model: it will follow the host's, which for the
        quant = cpu_quant.pick_quant("auto", device, embedded_default=True)  # embedded default is int4 on a CPU
    if quant == "none":
        return layer.to(device=device, dtype=DTYPES[dtype])
    weights = {n: m.weight.detach().clone() for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
    on_cpu = not str(device).startswith("cuda") and quant in cpu_quant.KINDS  # as the shard picks its kernels
    if on_cpu:
        cpu_quant.swap_linears(layer, quant)
    else:
        quantization.swap_linears(layer, quant, DTYPES[dtype])
    for name, w in weights.items():
        (cpu_quant if on_cpu else quantization).quantize(layer.get_submodule(name), lambda a, b, w=w: w[a:b],
                                                         tuple(w.shape), torch.device(device))
    for norm in (layer.norm1, layer.norm2):
        norm.to(device=device, dtype=DTYPES[dtype])
    return layer


def fixed(who: str) -> float | None:
    """The figure SFCHAT_TEST_MS_PER_LAYER fixes for `who`, if any."""
    text = os.environ.get("SFCHAT_TEST_MS_PER_LAYER", "")
    if "=" not in text:
        return float(text) if text else None
    named = dict(item.split("=", 1) for item in text.split(","))
    return float(named[who]) if who in named else None


def ms_per_layer(device: str, dtype: str, quant: str = "none") -> dict[int, float]:
    """ms per pass through the reference layer, by positions in the pass: short bursts spread over about a second
    (figure())."""
    torch.manual_seed(0)
    layer = _layer(device, dtype, quant)
    r, dt = REFERENCE_LAYER, DTYPES[dtype]
    d = r["hidden"] // r["heads"]
    cache = torch.randn(1, r["kv_heads"], CONTEXT, d, device=device, dtype=dt)
    xs = {p: torch.randn(1, p, r["hidden"], device=device, dtype=dt) for p in SPEED_POSITIONS}
    bursts: dict[int, list[list[float]]] = {p: [] for p in SPEED_POSITIONS}
    with torch.inference_mode():
        for x in xs.values():
            layer(x, cache, cache)  # warm up
        start = time.perf_counter()
        for _ in range(BURSTS):
            for p, x in xs.items():
                times = []
                for _ in range(PASSES):
                    t0 = time.perf_counter()
                    layer(x, cache, cache)
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    times.append((time.perf_counter() - t0) * 1e3)
                bursts[p].append(times)
            if time.perf_counter() - start > BUDGET_S:  # a slow device: fewer bursts
                break
            time.sleep(GAP_S)
    return {p: figure(b) for p, b in bursts.items()}


def figure(bursts: list[list[float]]) -> float:
    """The median of the bursts' least passes. A burst's least pass leaves out a moment's hiccup; the median over
    bursts spread in time counts load that lasts: a process whose threads share their cores with another program
    is that slow for as long as it does, and a lone burst on a core that happened to be free is not its speed."""
    return statistics.median(min(b) for b in bursts)


def measure(device: str, dtype: str, quant: str = "none", who: str = "this member") -> float:
    """The ms per reference layer the plan weighs (a speculative round's pass), said in one line."""
    t0 = time.perf_counter()
    ms = fixed(who)
    by = {p: ms for p in SPEED_POSITIONS} if ms is not None else ms_per_layer(device, dtype, quant)
    log.info("%s: %s per reference layer on %s %s%s, %d threads (%.1f s)", who,
             ", ".join(f"{v:.2f} ms at {p}" for p, v in by.items()), device, dtype,
             f" {quant}" if quant != "none" else "", torch.get_num_threads(), time.perf_counter() - t0)
    return by[SPEED_POSITIONS[1]]
