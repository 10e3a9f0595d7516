"""--quant int4|int8 on a CPU: weights kept quantized and multiplied by torch's own CPU kernels.

int4: groups of GROUP weights along a row, each w = (q - 8) * scale + zero with q in 0..15 (the layout of
torch.ops.aten._weight_int4pack_mm_for_cpu, checked against the dequantized matrix by tests/ring/test_cpu_quant.py);
scale and zero from the group's min and max, so a GGUF Q4_1 block (w = d * q + m, q spanning 0..15) comes back
on its own grid. int8: one scale per output row (absmax / 127), torch.ops.aten._weight_int8pack_mm.

Both kernels take bfloat16 activations (fed float32 they fall back to a path ten times slower), so a layer
computes in bfloat16 whatever the shard's dtype and hands back its input's dtype. Like peers/compute/quant.py,
layers are swapped on the meta device and each matrix is read and quantized a chunk of rows at a time: rows are
quantized and packed independently, so the peak while loading stays one chunk above the quantized size.
"""
from __future__ import annotations

import os

import torch

from peers.models.reader import read, read_rows

KINDS = ("int4", "int8")
GROUP = 32
ROWS = 16  # the int4 kernel takes matrices of a multiple of 16 rows
BLOCK = 64  # and packs them in blocks of 64 rows: a chunk (not the last) is whole blocks, or its rows land wrong
CHUNK_BYTES = 8 << 20  # full-precision rows read and quantized at a time (as float32)
COMPUTE = torch.bfloat16


def pick_quant(name: str, device: str, embedded_default: bool) -> str:
    """`auto` on the host: int4 on a CPU for the embedded default (a Q4_1 GGUF, whose blocks come back on their
    own grid), none for other models and on a GPU. SFCHAT_CPU_QUANT overrides what auto takes on a CPU (the
    test suite pins none); any other name as given."""
    if name != "auto":
        return name
    if str(device).startswith("cuda"):
        return "none"
    return os.environ.get("SFCHAT_CPU_QUANT") or ("int4" if embedded_default else "none")


def follow(own: str, device: str, host: str) -> str:
    """A member's `auto`: the host's kind where both run it on a CPU, else none."""
    if own != "auto":
        return own
    return host if not str(device).startswith("cuda") and host in KINDS else "none"


class Int4Linear(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int, group: int = GROUP):
        super().__init__()
        if in_features % group:
            raise ValueError(f"int4 needs a row length that is a multiple of {group}, not {in_features}")
        self.in_features, self.out_features, self.group = in_features, out_features, group
        # the weight's shape stands for the checkpoint's [out, in] (the loader checks it); filled by quantize()
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device="meta"), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(COMPUTE)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group, self.scales_zeros)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class Int8Linear(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device="meta"), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(COMPUTE)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def swap_linears(module: torch.nn.Module, kind: str) -> None:
    """Replace every bias-free nn.Linear under `module` (on the meta device) by an empty layer of `kind`."""
    if kind not in KINDS:
        raise ValueError(f"--quant {kind} is not a CPU kind (on a CPU: {', '.join(KINDS)})")
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear) and child.bias is None:
            fits = child.in_features % GROUP == 0 and child.out_features % ROWS == 0
            cls = Int4Linear if kind == "int4" and fits else Int8Linear  # (else int8: the closest that fits)
            setattr(module, name, cls(child.in_features, child.out_features))
        else:
            swap_linears(child, kind)


def swapped(root: torch.nn.Module | None, kind: str) -> torch.nn.Module | None:
    """`root` itself swapped when it is an nn.Linear (the LM head), else its children."""
    if root is None:
        return None
    if isinstance(root, torch.nn.Linear) and root.bias is None:
        holder = torch.nn.Module()
        holder.m = root
        swap_linears(holder, kind)
        return holder.m
    swap_linears(root, kind)
    return root


def quantize_model(model: torch.nn.Module, kind: str, grid: dict) -> None:
    """(bench's one-process row) a loaded transformers model on the ring's CPU kernels: each bias-free linear
    swapped for `kind`'s layer as a shard's, filled from the GGUF's grid where it has one, else from its own float
    weight; the head in int8."""
    for name, module in list(model.named_modules()):
        if not (isinstance(module, torch.nn.Linear) and module.bias is None):
            continue
        w = module.weight.detach().float()
        new = swapped(torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta"),
                      "int8" if name == "lm_head" else kind)
        if isinstance(new, Int4Linear) and f"{name}.weight" in grid:
            take_grid(new, grid[f"{name}.weight"])
        else:
            quantize(new, lambda a, b: w[a:b], tuple(w.shape))
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, new.eval())


def is_quantized(module: torch.nn.Module, leaf: str) -> bool:
    return leaf == "weight" and isinstance(module, (Int4Linear, Int8Linear))


def chunks(rows: int, step: int):
    return ((a, min(a + step, rows)) for a in range(0, rows, step))


def quantize(module: torch.nn.Module, read_rows, shape: tuple[int, int], device: torch.device | None = None) -> None:
    """Fill `module` with the [rows, cols] matrix that read_rows(start, end) gives, a chunk of rows at a time."""
    rows, cols = shape
    if isinstance(module, Int4Linear):
        sz = torch.empty(cols // module.group, rows, 2, dtype=COMPUTE)

        def codes(a: int, b: int) -> torch.Tensor:
            q, sz[:, a:b] = int4_rows(read_rows(a, b).float(), module.group)
            return q

        _hold_int4(module, codes, sz)
        return
    w = torch.empty(rows, cols, dtype=torch.int8)
    scales = torch.empty(rows, dtype=COMPUTE)
    for a, b in chunks(rows, max(1, CHUNK_BYTES // 4 // cols)):
        w[a:b], scales[a:b] = int8_rows(read_rows(a, b).float())
    module.scales = scales
    module.weight = torch.nn.Parameter(w, requires_grad=False)


def take_grid(module: Int4Linear, grid) -> None:
    """Fill an int4 layer from a GGUF's own grid (peers/models/gguf_grid.py): its codes packed a chunk of rows at
    a time, scale = step and zero = offset + 8 step, with no float copy of the matrix."""
    codes, offset, step = grid
    cols = module.in_features

    def unpacked(a: int, b: int) -> torch.Tensor:
        two = read_rows(codes, a, b, torch.uint8)  # [n, cols/2]: code 2j in the low nibble, 2j+1 in the high
        return torch.stack([two & 15, two >> 4], -1).reshape(b - a, cols).to(torch.int32)

    off, st = read(offset, torch.float32), read(step, torch.float32)  # [rows, cols/32]
    _hold_int4(module, unpacked, torch.stack([st, off + 8 * st], -1).transpose(0, 1).to(COMPUTE).contiguous())


def _hold_int4(module: Int4Linear, codes, scales_zeros: torch.Tensor) -> None:
    """Pack codes(a, b) (rows a..b-1, int32 in 0..15) into the kernel's layout a chunk of rows at a time (whole
    blocks of 64 rows); the layer then holds them and their scales and zeros, and no weight."""
    rows, cols = module.out_features, module.in_features
    packed = torch.empty(rows, cols // 2, dtype=torch.uint8)
    for a, b in chunks(rows, max(1, CHUNK_BYTES // 4 // cols // BLOCK) * BLOCK):
        packed[a:b] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes(a, b), 1)
    module.packed, module.scales_zeros = packed, scales_zeros
    del module.weight  # the int4 layer's weight was only its shape
    module.register_buffer("weight", None, persistent=False)


def int4_rows(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [n, k] -> (codes int32 [n, k] in 0..15, scale/zero [k/group, n, 2] in bfloat16), each group
    spanning its own min..max; the codes are rounded against the bfloat16 scale and zero the kernel will use."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).to(COMPUTE)
    zero = (lo + 8 * scale.float()).to(COMPUTE)
    s, z = scale.float()[..., None], zero.float()[..., None]
    s = torch.where(s > 0, s, torch.inf)  # a flat group: every code 8 (its value is the zero)
    q = g.sub(z).div_(s).add_(8).round_().clamp_(0, 15)  # in place: a load quantizes millions of weights
    return q.to(torch.int32).reshape(n, k), torch.stack([scale, zero], -1).transpose(0, 1)


def int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [n, k] -> (int8 [n, k], bfloat16 scale per row [n]): w = q * scale, symmetric."""
    scale = (w.abs().amax(-1) / 127).to(COMPUTE)
    s = scale.float()[:, None]
    q = w.div(torch.where(s > 0, s, torch.inf)).round_().clamp_(-127, 127)  # a zero row: codes 0
    return q.to(torch.int8), scale


def dequantize(module: torch.nn.Module) -> torch.Tensor:
    """(tests) The float32 matrix a quantized layer multiplies by."""
    if isinstance(module, Int8Linear):
        return module.weight.float() * module.scales.float()[:, None]
    k = module.in_features
    eye = torch.eye(k, dtype=COMPUTE)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, module.packed, module.group, module.scales_zeros).float().t()
