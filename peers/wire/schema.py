"""Schema checks for ring messages: anything off is a WireError, answered with an error and a closed link."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from peers.wire import codec as wire
from peers.base import tree_layout

if TYPE_CHECKING:
    import torch
# peers.wire.tensors (torch) is imported where a frame's tensor is read: the plan and the roster check control
# messages only, and stay free of torch (tests/test_layout.py)

MAX_TOKENS_PER_FRAME = 8192


def need(msg: dict, key: str, kind: type | tuple, lo: int | None = None):
    v = msg.get(key)
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise wire.WireError(f"{msg.get('t')}: field {key!r} must be {getattr(kind, '__name__', kind)}")
    if lo is not None and v < lo:
        raise wire.WireError(f"{msg.get('t')}: field {key!r} must be >= {lo}")
    return v


def forward_frame(msg: dict, hidden_size: int) -> torch.Tensor:
    """Check a 'fwd' frame and return its hidden states [1, T, H], sharing the raw bytes they came in."""
    from peers.wire import tensors
    header(msg, hidden_size)
    return tensors.from_bytes(msg["x"], msg.get("raw"))


def landing(msg: dict, n: int, hidden_size: int | None, pin: bool = False,
            place: torch.Tensor | None = None) -> memoryview:
    """Where a data link's frame puts its n raw bytes: checked first (a frame that lies about them is refused
    before they are read), then `place` if they are a tensor of its dtype and shape, else a buffer of the
    tensor's own (pinned: it goes on to a GPU). hidden_size None: a member without layers yet takes the bytes
    only to answer that it cannot serve."""
    from peers.wire import tensors
    if msg.get("t") != "fwd":
        raise wire.WireError(f"{msg.get('t')}: only a 'fwd' frame carries raw bytes")
    if hidden_size is None:
        tensors.check(msg.get("x"), n)
        return memoryview(bytearray(n))
    header(msg, hidden_size)
    if place is not None and msg["x"] == {"dtype": tensors.DTYPE_NAMES[place.dtype], "shape": list(place.shape)}:
        tensors.check(msg["x"], n)
        return tensors.byte_view(place)
    return tensors.landing(msg["x"], n, pin)


def header(msg: dict, hidden_size: int) -> None:
    """The fields of a 'fwd' frame and the shape of the hidden states it says follow."""
    from peers.wire import tensors
    need(msg, "sid", str)
    need(msg, "seq", int, 0)
    need(msg, "epoch", int, 0)
    need(msg, "committed", int, 0)
    need(msg, "n_logits", int, 0)
    if not isinstance(msg.get("trace"), list) or len(msg["trace"]) > 64:
        raise wire.WireError("fwd: 'trace' must be a short list")
    x = msg.get("x")
    shape, dtype = (x.get("shape"), x.get("dtype")) if isinstance(x, dict) else (None, None)
    floating = dtype in tensors.DTYPES and tensors.DTYPES[dtype].is_floating_point
    ok = floating and isinstance(shape, list) and len(shape) == 3 and shape[2] == hidden_size
    least = 0 if "batch" in msg else 1  # (a batch whose every conversation the host cancelled carries no rows)
    if not ok or shape[0] != 1 or not (isinstance(shape[1], int) and least <= shape[1] <= MAX_TOKENS_PER_FRAME):
        raise wire.WireError(f"fwd: tensor of {dtype} {shape} does not fit this stage (hidden {hidden_size})")
    if "parents" in msg:  # a tree of drafts: one parent per draft, and at least the root before them
        try:
            tree_layout.check_parents(msg["parents"], msg["n_logits"] - 1)
        except ValueError as e:
            raise wire.WireError(f"fwd: {e}") from None
        if msg["n_logits"] > shape[1]:
            raise wire.WireError("fwd: more drafts than positions")


MAX_SEGMENTS = 64
MAX_KEPT = 512  # positions a segment keeps from passes still in flight, past its own n
MAX_CANCELLED = 1024


def segments(msg: dict, n_positions: int) -> list[dict]:
    """The conversations a 'fwd' frame of several carries ("batch"), in the order of their positions; the frame's
    own committed, n_logits and parents are unused. Each: sid, committed, n positions, n_logits, parents (a tree);
    keep (the uncommitted cache columns it builds on, peers/compute/shard.py; parents then the full tree over kept and new
    rows); skip (true: the host cancelled it, no member computes it and its rows are not in the frame)."""
    segs = msg.get("batch")
    if not isinstance(segs, list) or not 0 < len(segs) <= MAX_SEGMENTS:
        raise wire.WireError(f"fwd: 'batch' must list 1 to {MAX_SEGMENTS} conversations")
    for seg in segs:
        if not isinstance(seg, dict):
            raise wire.WireError("fwd: each of 'batch' must be a map")
        seg["t"] = "fwd"  # (for need's messages)
        need(seg, "sid", str)
        need(seg, "committed", int, 0)
        need(seg, "n", int, 1)
        need(seg, "n_logits", int, 1)
        del seg["t"]
        if seg["n_logits"] > seg["n"]:
            raise wire.WireError("fwd: more drafts than positions")
        if "skip" in seg and seg["skip"] is not True:
            raise wire.WireError("fwd: 'skip' must be true or absent")
        keep = seg.get("keep")
        if keep is not None:
            ok = isinstance(keep, list) and len(keep) <= seg["n"] + MAX_KEPT and all(
                isinstance(c, int) and not isinstance(c, bool) for c in keep)
            if not ok or any(b <= a for a, b in zip(keep, keep[1:])) or (keep and keep[0] < seg["committed"]):
                raise wire.WireError(f"fwd: 'keep' must list at most n + {MAX_KEPT} ascending cache columns from "
                                     f"'committed' on")
        if "parents" in seg or keep is not None:
            try:
                tree_layout.check_parents(seg.get("parents"), seg["n_logits"] - 1 if keep is None else len(keep) + seg["n"])
            except ValueError as e:
                raise wire.WireError(f"fwd: {e}") from None
    if sum(rows(seg) for seg in segs) != n_positions or len({seg["sid"] for seg in segs}) != len(segs):
        raise wire.WireError("fwd: the batch's positions do not add up to the frame's")
    return segs


def rows(seg: dict) -> int:
    """A segment's rows in its frame's hidden states: none once skipped."""
    return 0 if seg.get("skip") else seg["n"]


def bounds(segs: list[dict]) -> list[tuple[int, int]]:
    """Each segment's [start, end) among the frame's positions (empty for a skipped one)."""
    out, at = [], 0
    for seg in segs:
        out.append((at, at + rows(seg)))
        at += rows(seg)
    return out


def cancel(msg: dict) -> list[tuple[str, int]]:
    """A 'cancel' frame's (sid, seq) pairs: the segments of those frames that nobody needs computed any more."""
    need(msg, "epoch", int, 0)
    pairs = msg.get("segments")
    if not isinstance(pairs, list) or len(pairs) > MAX_CANCELLED or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], int)
            and not isinstance(p[1], bool) for p in pairs):
        raise wire.WireError(f"cancel: 'segments' must list at most {MAX_CANCELLED} [sid, seq] pairs")
    return [(sid, seq) for sid, seq in pairs]


def progress(msg: dict) -> dict | None:
    """A member's 'progress' message: the file it fetches and the bytes done of all it needs; None once done."""
    if not msg.get("active"):
        return None
    total, done = need(msg, "total", int, 0), need(msg, "done", int, 0)
    return {"file": str(msg.get("file", ""))[:200], "done": min(done, total), "total": total}


def speed(offer: dict) -> float:
    """A member's measured ms per reference layer from its offer; nan where it did not say (an older member) or
    said something that is no time."""
    ms = offer.get("ms_per_layer")
    return float(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) and 0 < ms < 1e6 else math.nan
