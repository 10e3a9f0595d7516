"""Sampled rounds with a tree of drafts, lossless: children drawn without replacement, verified by recursive
rejection sampling (SpecInfer, arXiv 2305.09781; without replacement as Sequoia 2402.12374 and Recursive
Speculative Decoding 2402.14160 draw them).

Drafting. A node's children x_1, x_2, … are drawn from the draft's q at that node without replacement, in that
order (Gumbel top-k: the k largest of log q + Gumbel noise are such a sequence). Each child's chance, what the tree
is grown and cut by, is the j-th largest probability of q times its parent's: it does not depend on which token
was drawn, so which children a tree keeps never favours some tokens over others.

Verification at a node, with the target's p there: for j = 1, 2, …
    accept x_j with probability min(1, p_j(x_j) / q_j(x_j)), and go on down from that child;
    else p_{j+1} = normalize(max(0, p_j - q_j)),  q_{j+1} = q_j with x_j removed, renormalized;
and when every child is turned down, draw the token from the last p. Each step is plain speculative rejection
sampling of p_j by a draft drawn from q_j, whose outcome is distributed as p_j: accepted, x_j is p_j's share
min(p_j, q_j); turned down, the rest goes to p_{j+1} (which gives x_j nothing, since a rejected x_j has
p_j(x_j) < q_j(x_j)). Given x_j and its rejection, x_{j+1} is drawn from q_{j+1} and p_{j+1} does not depend on
x_j, so by induction the node's token is distributed exactly as p. A deterministic draft (q None: ngram,
simulated) is the case q_j one-hot at x_j: that reduces to "draw y from p; go to the child y if there is one,
else y is the token", which is also what the target alone would have drawn with the same seed.
"""
from __future__ import annotations

import torch

from peers.speculation.sampling import draw, position_generator

ACCEPT, RESIDUAL, SIBLINGS = 1, 2, 3  # position_generator's streams (0 is the drafts')


def sampled_children(q: torch.Tensor, n: int, gen: torch.Generator) -> list[tuple[int, float]]:
    """n distinct tokens drawn from q without replacement, in the order drawn, each with the j-th largest
    probability of q (its chance: known before the draws). Fewer when q has fewer tokens with mass."""
    q = q.float()
    n = min(n, int((q > 0).sum()))
    if n <= 0:
        return []
    noise = -torch.log(-torch.log(torch.rand(q.shape, generator=gen).clamp_(1e-20, 1.0 - 1e-7)))
    drawn = (q.log() + noise.to(q.device)).topk(n).indices.tolist()
    return list(zip(drawn, q.topk(n).values.tolist()))


def verify_tree(p: torch.Tensor, q: torch.Tensor | None, tokens: list[int], parents: list[int], seed: int,
                position: int) -> tuple[list[int], int]:
    """p [n+1, V]: the target's probabilities at the root (row 0) and after each node i (row i + 1); q [n, V]: the
    distribution node i was drawn from (its parent's, before any sibling was drawn), or None for a deterministic
    draft. Siblings are tried in the order drawn, which is their order in the layout. Position `position` is the
    root's next token. Returns (the accepted nodes, root first; the token after them)."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    path, node = [], -1
    while True:
        at = position + len(path)
        kids = children.get(node, [])
        if q is None:
            y = draw(p[node + 1], position_generator(seed, at, ACCEPT))
            nxt = next((c for c in kids if tokens[c] == y), None)
            if nxt is None:
                return path, y
        else:
            j, target = reject_children(p[node + 1], q[kids[0]] if kids else None, [tokens[c] for c in kids], seed,
                                        at)
            if j is None:
                return path, draw(target, position_generator(seed, at, RESIDUAL))
            nxt = kids[j]
        path.append(nxt)
        node = nxt


def reject_children(p: torch.Tensor, q: torch.Tensor | None, drawn: list[int], seed: int, at: int
                    ) -> tuple[int | None, torch.Tensor]:
    """One node's children in turn, `drawn` from q in that order: the index of the child accepted, or None and the
    distribution left to draw from."""
    p = p.detach().double().cpu()
    qj = q.detach().double().cpu() if drawn else None
    gen = position_generator(seed, at, ACCEPT)  # the first child's uniform: the one a chain's verify draws
    for j, x in enumerate(drawn):
        if j == 1:
            gen = position_generator(seed, at, SIBLINGS)  # the later siblings' uniforms, in turn
        u = torch.rand((), generator=gen).item()
        qx, px = float(qj[x]), float(p[x])
        if qx > 0 and u < min(1.0, px / qx):
            return j, p
        residual = (p - qj).clamp_min(0.0)
        if residual.sum() > 0:  # (zero only where p == q: a rejection then had probability 0)
            p = residual / residual.sum()
        qj = qj.clone()
        qj[x] = 0.0
        if qj.sum() <= 0:
            break  # q has no token left: no later child can have been drawn
        qj = qj / qj.sum()
    return None, p


def coupled_children(q: torch.Tensor, n: int, gen: torch.Generator, seed: int, position: int
                     ) -> list[tuple[int, float]]:
    """As sampled_children, but the first child is drawn with the target's own uniform at `position` (the draw
    the rounds verify by, peers/speculation/sampling.py): where q is near p it is the token the target takes."""
    q = q.float()
    first = draw(q, position_generator(seed, position, ACCEPT))
    rest = q.clone()
    rest[first] = 0.0
    others = sampled_children(rest, n - 1, gen) if n > 1 and rest.sum() > 0 else []
    chances = q.topk(min(n, int((q > 0).sum()))).values.tolist()
    return list(zip([first] + [t for t, _ in others], chances))
