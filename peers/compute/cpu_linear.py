"""A big matrix's product over a few rows at the CPU's speed.

A float32 nn.Linear computes y = x @ W^T. On a CPU (MKL's sgemm), with a matrix bigger than the caches (the
vocabulary head above all) and a few rows (M = 1-8: one conversation's round, or a few conversations' last
positions), that product streams the weights at a fraction of the memory's bandwidth: 2 rows cost 2.5x what 1 row
costs. The same product as y^T = W @ x^T (M columns instead of M rows) streams them at full speed: 2-4 rows cost
what one row costs as x @ W^T, or less. One row goes as two equal columns (the matrix-matrix kernel beats the
matrix-vector one). Measured with `python scripts/pass_cost.py` (docs/benchmarks.md).

Smaller matrices keep F.linear: with two threads W @ x^T is faster there too, but it leans on every core at once,
and where the ring's stages share a machine's cores it lost more than it won. Same arithmetic, another summation
order: rows differ from F.linear's in their last bits, as F.linear's own rows already differ between M = 1 and
M = 4. On other devices and dtypes (bf16 on a CPU included) F.linear is kept, and on CPUs where it was measured
to lose (columns_win).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

BIG = 4 << 20  # elements: a matrix this big is past the caches
MAX_ROWS = 8  # beyond, on one thread, x @ W^T is the faster again


class ColumnsLinear(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if x.device.type != "cpu" or x.dtype != torch.float32 or not 0 < rows <= MAX_ROWS:
            return F.linear(x, w, self.bias)
        flat = x.reshape(rows, x.shape[-1])
        cols = (flat if rows > 1 else flat.repeat(2, 1)).t()  # one row: two identical columns
        y = (w @ cols).t()[:rows].reshape(*x.shape[:-1], w.shape[0])
        return y if self.bias is None else y + self.bias


def columns_win(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether W @ x^T beats F.linear on this CPU, as measured (docs/benchmarks.md): on AMD's (an EPYC) it does;
    on Intel's (a Xeon with AMX, whose sgemm streams a few rows well) F.linear is the faster, 1.8-2.4x at 1-2 rows."""
    try:
        with open(cpuinfo) as f:
            return any(ln.startswith("vendor_id") and "AuthenticAMD" in ln for ln in f)
    except OSError:
        return False


def use_columns(*modules: torch.nn.Module | None, win: bool | None = None) -> None:
    """Every plain float32 nn.Linear of at least BIG weights on a CPU in these modules computes a few rows as
    W @ x^T (not quantized ones, whose classes are nn.Linear's subclasses, nor those on a GPU), where that wins
    (`win`, by default columns_win())."""
    if not (columns_win() if win is None else win):
        return
    for root in modules:
        for m in root.modules() if root is not None else ():
            w = m.weight if type(m) is torch.nn.Linear else None
            if w is not None and w.device.type == "cpu" and w.dtype == torch.float32 and w.numel() >= BIG:
                m.__class__ = ColumnsLinear
