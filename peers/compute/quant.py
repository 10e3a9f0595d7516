"""--quant int8|nf4: a shard's nn.Linear layers become bitsandbytes ones, each weight quantized as it is read.

The layers are swapped while the model is still on the meta device (no memory); then every matrix is read from
the checkpoint a chunk of rows at a time, each chunk moved to the device and quantized there (the GPU included)
and freed before the next is read. Both kinds quantize independent pieces in row-major order (nf4: blocks of
64 values; int8: rows), so a chunk of whole blocks gives exactly the bytes bitsandbytes gives the whole matrix.
A member so holds at most one chunk in full precision beyond what it has quantized, whatever the timing: its
peak while loading is bounded by construction. The embedding, norms and LM head stay in the shard's dtype.
"""
from __future__ import annotations

import torch

KINDS = ("int8", "nf4")
CHUNK_BYTES = 8 << 20  # full-precision rows read and quantized at a time (as float32)


def swap_linears(module: torch.nn.Module, kind: str, dtype: torch.dtype) -> None:
    """Replace every nn.Linear under `module` (on the meta device) by an empty bitsandbytes layer of `kind`."""
    import bitsandbytes as bnb

    if kind not in KINDS:
        raise ValueError(f"unknown quantization {kind!r}")
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            bias = child.bias is not None
            with torch.device("meta"):
                if kind == "int8":
                    q = bnb.nn.Linear8bitLt(child.in_features, child.out_features, bias=bias, has_fp16_weights=False)
                else:
                    q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=bias, compute_dtype=dtype,
                                          quant_type="nf4")
            setattr(module, name, q)
        else:
            swap_linears(child, kind, dtype)


def is_quantized(module: torch.nn.Module, leaf: str) -> bool:
    """Whether `module.leaf` is a weight that quantize() must fill."""
    import bitsandbytes as bnb

    return leaf == "weight" and isinstance(module, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit))


def quantize(module: torch.nn.Module, read_rows, shape: tuple[int, int], device: torch.device) -> None:
    """Fill `module`'s weight on `device` with the [rows, cols] matrix that read_rows(start, end) gives (on the
    CPU, in full precision) a chunk at a time."""
    import bitsandbytes as bnb

    rows, cols = shape
    if isinstance(module, bnb.nn.Linear4bit):
        block = module.weight.blocksize
        step = max(1, CHUNK_BYTES // 4 // cols // block) * block  # whole blocks per chunk, whatever cols
        _nf4(module, read_rows, rows, cols, step, device)
    else:
        _int8(module, read_rows, rows, cols, max(1, CHUNK_BYTES // 4 // cols), device)


def chunks(rows: int, step: int):
    return ((a, min(a + step, rows)) for a in range(0, rows, step))


def _nf4(module, read_rows, rows: int, cols: int, step: int, device: torch.device) -> None:
    """bitsandbytes' Params4bit quantization (bnb.functional.quantize_4bit), chunk by chunk: the 4-bit codes and
    each block's absmax, then the absmax of the whole matrix compressed once as it does."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import QuantState, get_4bit_type, quantize_blockwise

    w, n = module.weight, rows * cols
    if w.quant_storage != torch.uint8:
        raise ValueError("nf4 weights are stored as bytes")
    packed = torch.empty((n + 1) // 2, 1, dtype=torch.uint8, device=device)
    absmax = torch.empty(-(-n // w.blocksize), dtype=torch.float32, device=device)
    for a, b in chunks(rows, step):
        x = read_rows(a, b).to(device)
        dtype = x.dtype
        q, st = bnb.functional.quantize_4bit(x, blocksize=w.blocksize, quant_type=w.quant_type)
        packed[a * cols // 2 : a * cols // 2 + len(q)] = q
        absmax[a * cols // w.blocksize : a * cols // w.blocksize + len(st.absmax)] = st.absmax
        del x, q, st  # before the next chunk is read
    code = get_4bit_type(w.quant_type, device=device)
    shape = torch.Size([rows, cols])
    if w.compress_statistics:
        offset = absmax.mean()
        qabsmax, state2 = quantize_blockwise(absmax - offset, blocksize=256)
        state = QuantState(absmax=qabsmax, shape=shape, dtype=dtype, blocksize=w.blocksize, code=code,
                           quant_type=w.quant_type, offset=offset, state2=state2)
    else:
        state = QuantState(absmax=absmax, shape=shape, dtype=dtype, blocksize=w.blocksize, code=code,
                           quant_type=w.quant_type)
    module.weight = bnb.nn.Params4bit(packed, requires_grad=False, quant_state=state, blocksize=w.blocksize,
                                      compress_statistics=w.compress_statistics, quant_type=w.quant_type,
                                      quant_storage=w.quant_storage, module=module, bnb_quantized=True)
    module.quant_state = state


def _int8(module, read_rows, rows: int, cols: int, step: int, device: torch.device) -> None:
    """bitsandbytes' Int8Params quantization (int8_vectorwise_quant of the float16 matrix), rows at a time."""
    import bitsandbytes as bnb

    cb = torch.empty(rows, cols, dtype=torch.int8, device=device)
    scb = torch.empty(rows, dtype=torch.float32, device=device)
    for a, b in chunks(rows, step):
        x = read_rows(a, b).to(device=device, dtype=torch.float16)
        cb[a:b], scb[a:b], _ = bnb.functional.int8_vectorwise_quant(x)
        del x
    module.weight = bnb.nn.Int8Params(cb, requires_grad=False, has_fp16_weights=False, CB=cb, SCB=scb)
