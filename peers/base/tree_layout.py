"""The layout of a pass's tree, the arithmetic both the pass engine and speculation need.

Node i follows node parents[i] (< i), or the context's last token (the root) for -1, in depth-first order with the
first child first. A pass carries the tokens the ring lacks and then the nodes; node i sits at position
base + depth(i) and attends to every earlier position of the conversation and to its own ancestors only
(peers/speculation/tree.py says why this layout).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
# torch is imported where tensors are made: the frame schema checks parents with no tensor (the plan's roster reads
# it, and stays free of torch)


def check_parents(parents, n_nodes: int) -> list[int]:
    """A frame's parents list, or ValueError: one entry per node, each pointing to an earlier node or the root."""
    if not isinstance(parents, list) or len(parents) != n_nodes:
        raise ValueError(f"parents must list one parent for each of the {n_nodes} drafts")
    for i, p in enumerate(parents):
        if not isinstance(p, int) or isinstance(p, bool) or not -1 <= p < i:
            raise ValueError(f"parent {p!r} of draft {i} is not an earlier draft or -1")
    return parents


def depths(parents: list[int]) -> list[int]:
    out: list[int] = []
    for p in parents:
        out.append(1 + (out[p] if p >= 0 else 0))
    return out


def full_parents(n_tokens: int, parents: list[int]) -> list[int]:
    """A pass's tree in the frame's short form (n_tokens rows: the tokens the ring lacks in a chain, then the nodes,
    -1 meaning the last of those tokens) -> its full form: each row's parent among the pass's rows, -1 meaning the
    last committed position. A full list is its own full form."""
    n_pending = n_tokens - len(parents)
    return list(range(-1, n_pending - 1)) + [n_pending + p if p >= 0 else n_pending - 1 for p in parents]


def positions(committed: int, n_tokens: int, parents: list[int]) -> torch.Tensor:
    """Positions of a pass of n_tokens: each row one past its parent (committed - 1 + its depth in the full tree),
    so the tokens the ring lacks lie in a row and the nodes at their depth below the last of them."""
    import torch
    return torch.tensor([[committed - 1 + d for d in depths(full_parents(n_tokens, parents))]])


def ancestors(n_tokens: int, parents: list[int], size: int | None = None) -> torch.Tensor:
    """Boolean [size, size]: which of the pass's own positions row i may see: its ancestors in the full tree and
    itself (a pending token: those before it; a node: every pending token and its own ancestors). Rows past
    n_tokens (padding up to `size`) see only themselves."""
    import torch
    size = size or n_tokens
    full = full_parents(n_tokens, parents)
    lead = 0  # the leading chain (the pending tokens, and the main chain under them): causal, in one go
    while lead < len(full) and full[lead] == lead - 1:
        lead += 1
    sees = torch.eye(size, dtype=torch.bool)
    sees[:lead, :lead] = torch.ones(lead, lead, dtype=torch.bool).tril()
    for i in range(lead, n_tokens):
        if full[i] >= 0:
            sees[i, :n_tokens] |= sees[full[i], :n_tokens]
    return sees


def attention_mask(committed: int, n_tokens: int, parents: list[int], window: int | None = None,
                   device=None) -> torch.Tensor:
    """Boolean mask [1, 1, n_tokens, committed + n_tokens] (True: may attend): causal over the conversation, and
    a node sees the tokens before the root, the root and its own ancestors. `window`: a sliding-window layer's."""
    import torch
    allowed = torch.cat([torch.ones(n_tokens, committed, dtype=torch.bool), ancestors(n_tokens, parents)], dim=1)
    if window is not None:
        pos = positions(committed, n_tokens, parents)[0]
        kv = torch.cat([torch.arange(committed), pos])
        allowed &= (pos[:, None] - kv[None, :]) < window
    return allowed[None, None].to(device)
