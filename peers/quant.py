"""--quant int8|nf4: a shard's nn.Linear layers become bitsandbytes ones, each weight quantized as it is read.

The layers are swapped while the model is still on the meta device (no memory); then every matrix read from the
checkpoint is wrapped on the CPU and moved to the device, and bitsandbytes quantizes a weight in that move (from
the CPU to any device, the GPU included: a weight already on the GPU would never be quantized). So a member holds
at most one matrix in full precision beyond what it has quantized. The embedding, norms and LM head stay in the
shard's dtype.
"""
from __future__ import annotations

import torch

KINDS = ("int8", "nf4")


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


def quantize(module: torch.nn.Module, w: torch.Tensor, device: torch.device) -> None:
    """Quantize the full-precision matrix `w` (on the CPU) into `module`'s weight on `device`."""
    import bitsandbytes as bnb

    if w.device.type != "cpu":
        raise ValueError("a weight is quantized on its way from the CPU")
    if isinstance(module, bnb.nn.Linear8bitLt):
        p = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    else:
        p = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4")
    module.weight = p.to(device)  # the move quantizes
