"""A round's drafts as a tree: where the draft is unsure, its second and third guesses are verified in the same
ring pass as its first (SpecInfer, EAGLE-2). In a greedy round the target's argmax picks one child per node; in
a sampled one, recursive rejection sampling (peers/tree_sampling.py).

Layout. Node i follows node parents[i] (< i), or the context's last token (the root) for -1. The nodes are in
depth-first order with the first child first, so the draft's main chain (its best guess at every step) is nodes
0..c-1. A pass carries the tokens the ring lacks and then the nodes; node i sits at position base + depth(i) and
attends to every earlier position of the conversation and to its own ancestors only. The caches append the nodes
in that order, so when the accepted path is a prefix of the main chain (the usual case) the caches already hold
exactly the accepted tokens and the ring's rollback rule (trim to `committed`) is unchanged; when the path leaves
the chain, the caches are trimmed to where it left and the accepted tokens after that are sent again with the
next round's drafts (a few positions more on that pass, no cache surgery anywhere).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .plan import MAX_NODES  # noqa: F401 (a tree's nodes at most)

BRANCHES = 3  # children per node at most (each kept only if its chance beats the floor, like any node)


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    sure: list[float] = field(default_factory=list)  # the drafter's chance that node i and its ancestors are accepted
    q: torch.Tensor | None = None  # (sampling) the distribution each node was drawn from: its parent's
    guess: int | None = None  # the draft's bet on the token after the main chain (what a look-ahead builds on)

    def path(self, i: int) -> list[int]:
        """The tokens from the root down to node i."""
        out = []
        while i >= 0:
            out.insert(0, self.tokens[i])
            i = self.parents[i]
        return out

    def likeliest(self, n: int) -> Draft:
        """The n likeliest nodes, in this layout still (a node is never likelier than its parent, so they
        include every ancestor of theirs). Where the main chain is cut, the first node cut is the new guess."""
        order = sorted(range(len(self.tokens)), key=lambda i: (-self.sure[i], i))
        kept = sorted(order[:n])
        index = {-1: -1} | {old: new for new, old in enumerate(kept)}
        d = Draft([self.tokens[i] for i in kept], [index[self.parents[i]] for i in kept],
                  [self.sure[i] for i in kept], self.q[kept] if self.q is not None else None, self.guess)
        if d.chain < self.chain:
            d.guess = self.tokens[d.chain]
        return d

    @property
    def chain(self) -> int:
        """How many leading nodes form the main chain."""
        n = 0
        while n < len(self.parents) and self.parents[n] == n - 1:
            n += 1
        return n


def depth_first(tokens: list[int], parents: list[int], sure: list[float],
                best_child: dict[int, int]) -> tuple[Draft, list[int]]:
    """A tree made in any order in which parents come first and each parent's children likeliest first -> this
    file's order (depth first, likeliest child first: the main chain leads), and where each node came from.
    best_child: each expanded node's likeliest next token, whether kept or not; the one after the main chain's
    last node is the guess."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    d, index, order = Draft(), {-1: -1}, []
    stack = list(reversed(children.get(-1, [])))
    while stack:
        i = stack.pop()
        order.append(i)
        index[i] = len(d.tokens)
        d.tokens.append(tokens[i])
        d.parents.append(index[parents[i]])
        d.sure.append(sure[i])
        stack.extend(reversed(children.get(i, [])))
    last = -1
    while children.get(last):
        last = children[last][0]
    d.guess = best_child.get(last)
    return d, order


def chain(tokens: list[int]) -> list[int]:
    """The parents of a plain chain of drafts."""
    return list(range(-1, len(tokens) - 1))


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
    return torch.tensor([[committed - 1 + d for d in depths(full_parents(n_tokens, parents))]])


def ancestors(n_tokens: int, parents: list[int], size: int | None = None) -> torch.Tensor:
    """Boolean [size, size]: which of the pass's own positions row i may see: its ancestors in the full tree and
    itself (a pending token: those before it; a node: every pending token and its own ancestors). Rows past
    n_tokens (padding up to `size`) see only themselves."""
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
    allowed = torch.cat([torch.ones(n_tokens, committed, dtype=torch.bool), ancestors(n_tokens, parents)], dim=1)
    if window is not None:
        pos = positions(committed, n_tokens, parents)[0]
        kv = torch.cat([torch.arange(committed), pos])
        allowed &= (pos[:, None] - kv[None, :]) < window
    return allowed[None, None].to(device)


def verify_greedy(best: list[int], tokens: list[int], parents: list[int]) -> tuple[list[int], int]:
    """best: the target's argmax at the root (0) and at each node i (i + 1), taken where the logits are. Walk down
    from the root while that choice is one of the children: (the accepted nodes, the target's own next token)."""
    children: dict[int, dict[int, int]] = {}
    for i, (t, p) in enumerate(zip(tokens, parents)):
        children.setdefault(p, {}).setdefault(t, i)
    path, node = [], -1
    while (nxt := children.get(node, {}).get(best[node + 1])) is not None:
        path.append(nxt)
        node = nxt
    return path, best[node + 1]


def on_chain(path: list[int]) -> int:
    """How many leading accepted nodes are main-chain nodes, i.e. already in place in every cache."""
    n = 0
    while n < len(path) and path[n] == n:
        n += 1
    return n
