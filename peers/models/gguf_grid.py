"""A GGUF's 4-bit matrices kept on their own grid, so a CPU's int4 kernel takes them as they are, with no float32
copy: written once, when the GGUF is converted, beside the float32 weights transformers reads for everything else.

Q4_0, Q4_1 and Q4_K store each group of 32 weights of a row as w = offset + step * q, q in 0..15 (Q4_0: offset
-8d, step d; Q4_1: offset m, step d; Q4_K: each sub-block's own scale and min). gguf's own dequantizer gives
offset and step: decode the same blocks with every code 0, then with every code 1. The codes then come back from
the weights transformers dequantized, exactly: q = (w - offset) / step, checked before anything is written.
torch's int4 layout is w = (q - 8) * scale + zero: scale = step, zero = offset + 8 * step (peers/compute/cpu_quant.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from peers.models.checkpoint import Stored, file_locations

GRID_FILE = "int4-grid.st"  # safetensors inside; not *.safetensors, so transformers and weight_files never read it
GROUP = 32
# GGUF type -> (bytes per block of 32 or 256 weights, where its 4-bit codes start in the block)
CODES_AT = {"Q4_0": (18, 2), "Q4_1": (20, 4), "Q4_K": (144, 16)}


def grid_of(data: np.ndarray, qtype) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(codes uint8 [rows, cols], offset and step float32 [rows, cols/32]) of one tensor's raw blocks `data`
    ([rows, bytes]) of gguf type `qtype`, or None where its weights are not all on that grid."""
    from gguf import dequantize

    size, at = CODES_AT[qtype.name]
    blocks = data.reshape(data.shape[0], -1, size)
    zeros, ones = blocks.copy(), blocks.copy()
    zeros[..., at:], ones[..., at:] = 0x00, 0x11  # every code 0; every code 1 (two codes a byte)
    w = dequantize(data, qtype)
    offset = dequantize(zeros.reshape(data.shape), qtype)
    step = dequantize(ones.reshape(data.shape), qtype) - offset
    rows, cols = w.shape
    offset, step = (np.ascontiguousarray(a.reshape(rows, cols // GROUP, GROUP)[..., 0]) for a in (offset, step))
    nonzero = np.where(step != 0, step, 1)[..., None]  # (Q4_0's d is negative where a block's largest is)
    with np.errstate(invalid="ignore"):  # (a block that is no number fails the check below)
        codes = np.rint((w.reshape(rows, cols // GROUP, GROUP) - offset[..., None]) / nonzero)
        codes = np.clip(codes, 0, 15).astype(np.uint8).reshape(rows, cols)
    if not np.array_equal(on_grid(codes, offset, step), w):
        return None
    return codes, offset, step


def on_grid(codes: np.ndarray, offset: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The float32 weights offset + step * q, as gguf dequantizes them."""
    rows, cols = codes.shape
    q = codes.reshape(rows, cols // GROUP, GROUP).astype(np.float32)
    return (offset[..., None] + step[..., None] * q).astype(np.float32).reshape(rows, cols)


def write_grid(gguf: Path, model, dest: Path) -> int:
    """Write GRID_FILE into `dest` for every 4-bit matrix of `gguf` that `model` (transformers' load of it, in
    float32) holds exactly on its grid; the count written. Rows move as transformers' own tensor processor moves
    them (llama's q and k): applied to the codes, offsets and steps alike."""
    from gguf import GGUFReader
    from safetensors.numpy import save_file
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, LlamaTensorProcessor,
                                                          TensorProcessor, get_gguf_hf_weights_map,
                                                          load_gguf_checkpoint)

    reader = GGUFReader(gguf)
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=False)
    arch = reader.fields["general.architecture"].contents()
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed.get("config", {}))
    if type(processor) not in (TensorProcessor, LlamaTensorProcessor):  # those only permute rows, or nothing
        names = {}
    else:
        names = get_gguf_hf_weights_map(model, processor)
    state = model.state_dict()
    out = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        hf = names.get(t.name)
        if kind not in CODES_AT or hf is None or hf not in state or len(t.shape) != 2:
            continue
        grid = grid_of(t.data, t.tensor_type)
        if grid is None:
            continue
        codes, offset, step = (processor.process(weights=a, name=t.name).weights for a in grid)
        if not np.array_equal(on_grid(codes, offset, step), state[hf].float().numpy()):
            continue  # transformers moved it some other way: it stays widened
        out[f"{hf}.codes"] = np.ascontiguousarray(codes[:, 0::2] | (codes[:, 1::2] << 4))
        out[f"{hf}.offset"], out[f"{hf}.step"] = np.ascontiguousarray(offset), np.ascontiguousarray(step)
    save_file(out, dest / GRID_FILE, metadata={"format": "sfchat-int4-grid"})  # (empty: none on a grid)
    return len(out) // 3


def stored_grid(model_dir: Path) -> dict[str, tuple[Stored, Stored, Stored]]:
    """checkpoint tensor name -> where its (codes, offset, step) lie in the model's GRID_FILE; {} without one."""
    path = Path(model_dir) / GRID_FILE
    if not path.is_file():
        return {}
    at, out = file_locations(path), {}
    for k in at:
        if k.endswith(".codes"):
            name = k.removesuffix(".codes")
            out[name] = (at[k], at[f"{name}.offset"], at[f"{name}.step"])
    return out
