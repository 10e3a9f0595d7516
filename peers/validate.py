"""Schema checks for ring messages: anything off is a WireError, answered with an error and a closed link."""
from __future__ import annotations

import torch

from . import tensors, tree, wire

MAX_TOKENS_PER_FRAME = 8192


def need(msg: dict, key: str, kind: type | tuple, lo: int | None = None):
    v = msg.get(key)
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise wire.WireError(f"{msg.get('t')}: field {key!r} must be {getattr(kind, '__name__', kind)}")
    if lo is not None and v < lo:
        raise wire.WireError(f"{msg.get('t')}: field {key!r} must be >= {lo}")
    return v


def forward_frame(msg: dict, hidden_size: int) -> torch.Tensor:
    """Check a 'fwd' frame and return its hidden states [1, T, H]."""
    need(msg, "sid", str)
    need(msg, "seq", int, 0)
    need(msg, "epoch", int, 0)
    need(msg, "committed", int, 0)
    need(msg, "n_logits", int, 0)
    if not isinstance(msg.get("trace"), list) or len(msg["trace"]) > 64:
        raise wire.WireError("fwd: 'trace' must be a short list")
    x = tensors.unpack_tensor(msg.get("x"))
    ok = x.is_floating_point() and x.dim() == 3 and x.shape[2] == hidden_size
    if not ok or x.shape[0] != 1 or not 0 < x.shape[1] <= MAX_TOKENS_PER_FRAME:
        raise wire.WireError(f"fwd: tensor of {x.dtype} {list(x.shape)} does not fit this stage (hidden {hidden_size})")
    if "parents" in msg:  # a tree of drafts: one parent per draft, and at least the root before them
        try:
            tree.check_parents(msg["parents"], msg["n_logits"] - 1)
        except ValueError as e:
            raise wire.WireError(f"fwd: {e}") from None
        if msg["n_logits"] > x.shape[1]:
            raise wire.WireError("fwd: more drafts than positions")
    return x


def progress(msg: dict) -> dict | None:
    """A member's 'progress' message: the file it fetches and the bytes done of all it needs; None once done."""
    if not msg.get("active"):
        return None
    total, done = need(msg, "total", int, 0), need(msg, "done", int, 0)
    return {"file": str(msg.get("file", ""))[:200], "done": min(done, total), "total": total}
