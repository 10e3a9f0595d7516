"""--quant int8|nf4: swap a shard's nn.Linear layers for bitsandbytes ones after its weights are loaded.

bitsandbytes quantizes a weight when its parameter is moved to the device, so each Linear is rebuilt around
its loaded weight and moved there. The embedding, norms and LM head stay in the shard's dtype.
"""
from __future__ import annotations

import torch


def quantize_linears(module: torch.nn.Module, kind: str, device: torch.device) -> None:
    import bitsandbytes as bnb

    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            w = child.weight.data
            if kind == "int8":
                q = bnb.nn.Linear8bitLt(child.in_features, child.out_features, bias=child.bias is not None,
                                        has_fp16_weights=False)
                q.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
            elif kind == "nf4":
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=w.dtype, quant_type="nf4")
                q.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4")
            else:
                raise ValueError(f"unknown quantization {kind!r}")
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(module, name, q.to(device))
        else:
            quantize_linears(child, kind, device)
