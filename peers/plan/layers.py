"""The plan in bytes: how many decoder layers each member can hold, and which layers it gets. Free of torch.

A member holding layers needs, per layer, the layer's weights (in its dtype, or quantized) and its KV cache for the
longest context; once, the working memory of the largest pass. The host also holds the embedding, the final norm,
the LM head and the drafter. A member's capacity is what it offers less that, divided by one layer's bytes; the
layers are split in proportion to capacities, so no member gets more than it can hold.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from peers.base.dtypes import DTYPE_BYTES
from peers.base.errors import FitError
from peers.base.limits import (GRAPH_BUCKETS, MAX_CONTEXT, MAX_PASS_POSITIONS, REFERENCE_WEIGHTS, cache_positions,
                               size)
from peers.base.span import Span
from peers.plan.placement import Stage, place, ring_order

# bytes a quantized matrix keeps per weight: int8 one byte (its float32 scale per row is counted by rows);
# nf4 half a byte, a one-byte absmax per 64-weight block and a float32 per 256 blocks (double quantization)
# int4 (a CPU's, peers/compute/cpu_quant.py): half a byte, a bfloat16 scale and zero per 32-weight group
QUANT_BYTES = {"int8": 1.0, "nf4": 0.5 + 1 / 64 + 4 / (64 * 256), "int4": 0.5 + 4 / 32}


@dataclass(frozen=True, slots=True)
class ModelSize:
    """The counts a plan needs; per-layer figures are the largest layer's."""

    n_layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    max_context: int  # the model's own limit
    layer_matrix: int  # weights in one layer's matrices (what quantization shrinks)
    layer_rows: int  # rows of those matrices (int8 keeps a float32 scale per row)
    layer_other: int  # weights in one layer's vectors (norms, biases): kept in the dtype
    host_weights: int  # embedding, final norm and an untied LM head

    @classmethod
    def of(cls, config: dict, shapes: dict[str, list[int]]) -> "ModelSize":
        """From config.json and the checkpoint's tensor shapes (peers/models/checkpoint.py)."""
        c = config.get("text_config", config)
        n, hidden, heads = c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"]
        per_layer = [[0, 0, 0] for _ in range(n)]
        host = 0
        for name, shape in shapes.items():
            count = _product(shape)
            parts = name.split(".")
            if "layers" in parts and parts[parts.index("layers") + 1].isdigit():
                i = int(parts[parts.index("layers") + 1])
                if i < n:
                    if len(shape) == 2:
                        per_layer[i][0] += count
                        per_layer[i][1] += shape[0]
                    else:
                        per_layer[i][2] += count
            else:
                host += count
        matrix, rows, other = (max(p[j] for p in per_layer) for j in range(3))
        return cls(n, hidden, c.get("intermediate_size") or 4 * hidden, heads,
                   c.get("num_key_value_heads") or heads, c.get("head_dim") or hidden // heads,
                   c.get("max_position_embeddings") or MAX_CONTEXT, matrix, rows, other, host)

    def default_context(self) -> int:
        return min(self.max_context, MAX_CONTEXT)


@dataclass(frozen=True, slots=True)
class Offer:
    """One member as the plan sees it: the host first, then the members in ring order."""

    name: str
    free: int  # bytes it offers
    dtype: str = "float32"
    quant: str = "none"
    ms_per_layer: float = math.nan  # measured on a reference layer (peers/compute/speed.py); nan: not measured
    link_ms: float = 0.0  # the round trip between the host and it
    cuda: bool = True  # on a GPU of NVIDIA's (quantization is bitsandbytes': CUDA only)
    must: bool = False  # a process the user asked for in the ring (--local-peers): it holds layers, never a spare


def weight_bytes(m: ModelSize, dtype: str, quant: str) -> int:
    """One layer's weights."""
    d = DTYPE_BYTES[dtype]
    if quant == "none":
        return (m.layer_matrix + m.layer_other) * d
    scales = 4 * m.layer_rows if quant == "int8" else 0
    return int(m.layer_matrix * QUANT_BYTES[quant]) + scales + m.layer_other * d


def kv_bytes(m: ModelSize, dtype: str, context: int) -> int:
    """One layer's KV cache: a key and a value of kv_heads x head_dim at every position (in the compute dtype)."""
    return 2 * m.kv_heads * m.head_dim * context * DTYPE_BYTES[dtype]


def pass_bytes(m: ModelSize, dtype: str, context: int) -> int:
    """The working set of the largest pass through one layer: hidden states in and out, q/k/v/o, the MLP's three
    intermediates, and the attention scores of every head (positions x context) where a kernel materialises them;
    and that of the largest graphed pass beside it (CUDA graphs keep their own memory pool)."""
    t = min(MAX_PASS_POSITIONS, context) + GRAPH_BUCKETS[-1]
    return t * (4 * m.hidden + 3 * m.intermediate + m.heads * context) * DTYPE_BYTES[dtype]


def layer_bytes(m: ModelSize, o: Offer, context: int, rows: int = 1) -> int:
    """One layer's weights and its part of the KV arena: `rows` conversations of `context` positions."""
    return weight_bytes(m, o.dtype, o.quant) + rows * kv_bytes(m, o.dtype, cache_positions(context))


def planned_bytes(m: ModelSize, o: Offer, span: Span, context: int, rows: int) -> int:
    """What the plan counts for a member's span: its layers, their KV arena, and a pass's working set."""
    return span.size * layer_bytes(m, o, context, rows) + pass_bytes(m, o.dtype, context) if span.size else 0


def host_bytes(m: ModelSize, dtype: str, drafter: int = 0) -> int:
    return m.host_weights * DTYPE_BYTES[dtype] + drafter


def capacities(m: ModelSize, offers: list[Offer], context: int, drafter: int = 0, rows: int = 1) -> list[int]:
    """How many layers each member can hold (the host's fixed part and one pass's working set come off first)."""
    caps = []
    for i, o in enumerate(offers):
        fixed = pass_bytes(m, o.dtype, context) + (host_bytes(m, o.dtype, drafter) if i == 0 else 0)
        caps.append(max(o.free - fixed, 0) // layer_bytes(m, o, context, rows))
    return caps


def ring_bytes(m: ModelSize, offers: list[Offer], context: int, drafter: int = 0, rows: int = 1) -> int:
    """What the whole model needs in a ring of these members: every layer at the host's dtype and quantization,
    the host's fixed part, one pass's working set on each member."""
    h = offers[0]
    return (m.n_layers * layer_bytes(m, h, context, rows) + host_bytes(m, h.dtype, drafter)
            + len(offers) * pass_bytes(m, h.dtype, context))


def plan(m: ModelSize, offers: list[Offer], context: int, drafter: int = 0, rows: int = 1,
         placement: str = "memory", many: bool = False) -> list[Span]:
    """Contiguous spans, host first, each within what its member can hold; FitError if the ring cannot.
    `placement` "memory": in proportion to what each can hold; "speed" (where every member measured its speed):
    the least predicted time per token (peers/plan/placement.py), `many` conversations: the least busy stage."""
    host = offers[0]
    fixed = host_bytes(m, host.dtype, drafter) + pass_bytes(m, host.dtype, context)
    if host.free < fixed:
        raise FitError(f"the host needs {size(fixed)} for the embedding, head, drafter and a pass in {host.dtype}; "
                       f"it offers {size(host.free)}", host_short=True)
    caps = capacities(m, offers, context, drafter, rows)
    if sum(caps) < m.n_layers:
        raise FitError(_too_small(m, offers, context, drafter, sum(caps), rows))
    if placement == "speed" and not any(math.isnan(o.ms_per_layer) for o in offers):
        stages = [Stage(c, o.ms_per_layer * scale(m), o.link_ms) for c, o in zip(caps, offers)]
        must = frozenset(i for i, o in enumerate(offers) if o.must)  # (a ring asked for: its stages evened out)
        counts = place(stages, m.n_layers, many=many or bool(must), must=must)
        if counts is not None:
            return spans_in_order(m.n_layers, counts, [0, *ring_order(stages, counts)])
    return split_layers(m.n_layers, [float(c) for c in caps])


def scale(m: ModelSize) -> float:
    """A layer of this model against the reference layer members time (peers/compute/speed.py): its weights, to
    which a pass's compute is about proportional."""
    return (m.layer_matrix + m.layer_other) / REFERENCE_WEIGHTS


def spans_in_order(n_layers: int, counts: list[int], order: list[int]) -> list[Span]:
    """Span per member (by index) for `counts` layers each, contiguous in the pass order `order`; the rest empty."""
    spans, start = [Span(0, 0, n_layers) for _ in counts], 0
    for i in order:
        spans[i] = Span(start, start + counts[i], n_layers)
        start += counts[i]
    return spans


def predicted_ms(m: ModelSize, offers: list[Offer], spans: list[Span]) -> float:
    """Predicted ms per token for one conversation under these spans (nan where a member did not measure)."""
    return sum(s.size * o.ms_per_layer * scale(m) + (o.link_ms if s.size else 0.0) for o, s in zip(offers, spans))


def _too_small(m: ModelSize, offers: list[Offer], context: int, drafter: int, room: int, rows: int) -> str:
    h = offers[0]
    kind = h.dtype + (f" {h.quant}" if h.quant != "none" else "")
    need = ring_bytes(m, offers, context, drafter, rows)
    offered = sum(o.free for o in offers)
    helps = ["add a member"]

    def needs(**change) -> str:
        other = [replace(o, dtype=change.get("dtype", o.dtype), quant=change.get("quant", o.quant)) for o in offers]
        return size(ring_bytes(m, other, change.get("context", context), drafter, change.get("rows", rows)))

    if h.quant != "nf4" and h.cuda:
        helps.append(f"--quant nf4 (needs {needs(quant='nf4')})")
    if h.dtype == "float32":
        helps.append(f"--dtype bfloat16 (needs {needs(dtype='bfloat16')})")
    if context > 2048:
        helps.append(f"--max-context 2048 (needs {needs(context=2048)})")
    if rows > 1:
        helps.append(f"--max-conversations 1 (needs {needs(rows=1)})")
    return (f"needs {size(need)} for {m.n_layers} layers in {kind} at {context} positions of context "
            f"for {rows} conversation{'s' * (rows > 1)}; "
            f"members offer {size(offered)} (room for {room} layers): " + ", or ".join(helps))


def chunk_positions(hidden: int, wire_bytes: int, max_frame: int) -> int:
    """The most positions of a pass that go round at once: hidden states ([positions, hidden] at wire_bytes each)
    filling at most a quarter of a frame."""
    return max(1, min(MAX_PASS_POSITIONS, max_frame // 4 // (hidden * wire_bytes)))


def chunk_end(start: int, n_positions: int, size: int, tail: int = 1) -> int:
    """Where the chunk of at most `size` positions from `start` ends; the last chunk keeps at least `tail` positions
    (the drafts and the position before them, which must travel together)."""
    return n_positions if start + size > n_positions - tail else start + size


def covers(spans: list[Span], n_layers: int) -> bool:
    """The ring's spans, host first and in pass order, hold every layer exactly once: the first starts at 0, each
    starts where the one before it ends, the last ends at n_layers. (Empty spans hold nothing and are skipped.)"""
    end = 0
    for s in spans:
        if s.n_layers != n_layers or (s.size and s.start != end):
            return False
        end = s.end if s.size else end
    return end == n_layers


def split_layers(n_layers: int, offers: list[float]) -> list[Span]:
    """Contiguous spans, member i getting about n_layers * offer_i / sum(offers) layers (largest remainder).

    Member 0 is the host and comes first in the ring; a member offering nothing gets an empty span.
    """
    if not offers or any(o < 0 for o in offers):
        raise ValueError("offers must be non-negative")
    total = sum(offers)
    if total <= 0:
        offers, total = [1.0] * len(offers), float(len(offers))
    exact = [n_layers * o / total for o in offers]
    counts = [int(e) for e in exact]
    by_remainder = sorted(range(len(offers)), key=lambda i: (exact[i] - counts[i], offers[i]), reverse=True)
    for i in by_remainder[: n_layers - sum(counts)]:
        counts[i] += 1
    spans, start = [], 0
    for c in counts:
        spans.append(Span(start, start + c, n_layers))
        start += c
    return spans


def _product(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
