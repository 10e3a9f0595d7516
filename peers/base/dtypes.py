"""Dtype names and what they mean: on the wire and in --dtype (DTYPES), in a checkpoint's header (STORED), and in
bytes per value (DTYPE_BYTES). The torch tables load torch on first use, so this module stays free of it."""
from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_WIRE = ("float32", "float16", "bfloat16", "int64")
_STORED = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
           "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def __getattr__(name: str):
    if name not in ("DTYPES", "DTYPE_NAMES", "STORED"):  # import asks for __path__ and others: no torch for them
        raise AttributeError(name)
    import torch
    if name == "DTYPES":  # a dtype name on the wire or in --dtype -> torch's dtype
        value = {n: getattr(torch, n) for n in _WIRE}
    elif name == "DTYPE_NAMES":
        value = {v: k for k, v in __getattr__("DTYPES").items()}
    else:  # a safetensors header's dtype -> torch's dtype
        value = {k: getattr(torch, v) for k, v in _STORED.items()}
    globals()[name] = value
    return value
