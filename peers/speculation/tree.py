"""A round's drafts as a tree: where the draft is unsure, its second and third guesses are verified in the same
ring pass as its first (SpecInfer, EAGLE-2). In a greedy round the target's argmax picks one child per node; in
a sampled one, recursive rejection sampling (peers/speculation/tree_sampling.py).

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

from peers.base.limits import MAX_NODES  # noqa: F401 (a tree's nodes at most)
from peers.base.tree_layout import ancestors, attention_mask, check_parents, depths, full_parents, positions  # noqa: F401

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
        d = self.keep(sorted(order[:n]))
        if d.chain < self.chain:
            d.guess = self.tokens[d.chain]
        return d

    def keep(self, kept: list[int]) -> Draft:
        """The nodes `kept` (in order, each with its parent), in this layout still; the guess stays this draft's."""
        index = {-1: -1} | {old: new for new, old in enumerate(kept)}
        return Draft([self.tokens[i] for i in kept], [index[self.parents[i]] for i in kept],
                     [self.sure[i] for i in kept if i < len(self.sure)],  # (a drafter without chances has none)
                     self.q[kept] if self.q is not None else None, self.guess)

    def extend_chain(self, tokens: list[int]) -> Draft:
        """The main chain carried on by `tokens`, each as sure as the chain's end. They go right after the chain's
        last node (which has no child), so the layout stays depth first, main chain leading; no guess is left."""
        c, n = self.chain, len(tokens)
        shift = {-1: -1} | {i: i if i < c else i + n for i in range(len(self.tokens))}
        sure = self.sure[c - 1] if 0 < c <= len(self.sure) else 1.0
        q = None
        if self.q is not None:  # a forced token was drawn from the one-hot on it
            q = torch.cat([self.q[:c], torch.nn.functional.one_hot(torch.tensor(tokens), self.q.shape[1])
                           .to(self.q.dtype), self.q[c:]])
        return Draft(self.tokens[:c] + tokens + self.tokens[c:],
                     self.parents[:c] + list(range(c - 1, c + n - 1)) + [shift[p] for p in self.parents[c:]],
                     self.sure[:c] + [sure] * n + self.sure[c:] if len(self.sure) >= c else self.sure, q, None)

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
