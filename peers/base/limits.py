"""The limits every layer shares: the longest context, pass and tree, the graph buckets, the default room, and
bytes shown to people. Free of torch."""
GB = 1e9
CUDA_MARGIN = 1 << 30  # what the CUDA context, cuBLAS workspaces and allocator slack take beyond the tensors
MAX_CONTEXT = 8192  # the default --max-context: the model's own limit, capped here
MAX_PASS_POSITIONS = 1024  # a longer pass (prefill, replay) is cut into chunks of at most this many positions
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # pass lengths a CUDA graph is captured for (a pass is padded up to one)
BATCH_BUCKETS = (1, 2, 4, 8, 16)  # conversations in a graphed pass (a batch is padded up to one)
MAX_NODES = GRAPH_BUCKETS[-1] // 2  # a round's tree of drafts at most: with the tokens carried before it, one bucket
# the decoder layer every member times to report its speed (peers/compute/speed.py): SmolLM2-135M's shape; a
# model's layer costs about its weights / this layer's (peers/plan/layers.py: scale)
REFERENCE_LAYER = {"hidden": 576, "intermediate": 1536, "heads": 9, "kv_heads": 3}
REFERENCE_WEIGHTS = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536 + 2 * 576
SPEED_POSITIONS = (1, 8, 64)  # pass sizes it is timed at: one position, a speculative round, a prefill chunk
CONVERSATIONS = 4  # the default --max-conversations: rows of the KV arena each member allocates (peers/kv.py)
SESSION_IDLE_S = 600.0  # a member frees a conversation's row after this long without a pass (its host forgot it)


def size(n: float) -> str:
    """Bytes for people: GB with one decimal, or MB below a tenth of a GB."""
    return f"{n / GB:.1f} GB" if n >= GB / 10 else f"{n / 1e6:.1f} MB"


def cache_positions(context: int) -> int:
    """The positions one conversation's row of the KV arena holds for `context`: a round's drafts past the last
    position the context allows, padded to their graph bucket; a multiple of 16 (peers/compute/invariant.py pads
    keys to one)."""
    return -(-(context + 2 * GRAPH_BUCKETS[-1]) // 16) * 16
