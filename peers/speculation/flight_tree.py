"""The tree of drafts that rounds in flight share (peers/speculation/in_flight.py), apart from the rounds' I/O: pure,
testable without a ring.

Its root stands for the last position every stage held when the answer's rounds began; the head is the last
committed token; each node below it is a draft with its chance of being reached (the drafter's probability of it
given its parent, times its parent's chance). The tree also keeps the layout every stage's cache has for the
conversation after each frame sent: the committed positions in a row (`base`), then the nodes in the columns they
were sent to (`cols`). A frame names `committed` = base and `keep`: the columns of the nodes still alive or
committed, in order; an ancestor is always sent before its descendants, so the committed nodes lead the kept
ones and base grows by them.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from peers.speculation.sampling import SamplingParams, draw, position_generator
from peers.speculation.tree import Draft
from peers.speculation.tree_sampling import ACCEPT

END_POINTS = 2  # stops of the rounds in flight a round considers hedging: the likeliest (each is drafted)


@dataclass(eq=False)
class Node:
    token: int
    parent: Node | None
    pos: int  # its position in the conversation
    cond: float = 1.0  # the drafter's chance of it given its parent (1: the target's own token)
    q: torch.Tensor | None = None  # (sampled drafts) the distribution it was drawn from: its parent's
    children: list[Node] = field(default_factory=list)  # in the order drafted
    flight: object | None = None  # the round that carried it (in_flight.Flying)
    col: int = -1  # its cache column at every stage, once sent
    best: int | None = None  # the target's greedy choice after it, once its round is back
    p: torch.Tensor | None = None  # (sampled) the target's distribution after it
    logits: torch.Tensor | None = None  # (with logprobs asked for) the target's logits after it
    feat: torch.Tensor | None = None  # the target's final features at it
    committed: bool = False
    dead: bool = False


@dataclass
class Layout:
    """A frame's place in the caches: its rows' parents (-1: the last committed position), the columns of the
    nodes it keeps, and the base it is laid out after."""

    parents: list[int]
    keep: list[int]
    committed: int


class Tree:
    def __init__(self, tokens: list[int], base: int):
        """`tokens`: the answer so far (the conversation's); `base`: how many of them every stage holds."""
        self.base = base  # positions in a row every stage holds
        root = tokens[base - 1] if base else None
        self.root = Node(root, None, base - 1, committed=True)  # the last of them (a stand-in: never sent)
        self.head, self.cols = self.root, []  # the last committed token; the nodes in the columns after base
        self.unobserved: deque[Node] = deque()  # committed tokens whose features a feature draft has not had
        for t in tokens[base:]:  # tokens the ring lacks: the first round carries them
            self.commit(Node(t, self.head, self.head.pos + 1))

    def commit(self, n: Node) -> None:
        n.committed = True
        n.parent.children = [n]
        self.head = n
        self.unobserved.append(n)

    @staticmethod
    def kill(n: Node) -> None:
        stack = [n]
        while stack:
            m = stack.pop()
            m.dead = True
            stack.extend(m.children)

    def unsent(self) -> list[Node]:
        """Committed tokens no round has carried yet (the ring lacks them): the head and those above it."""
        out, n = [], self.head
        while n is not self.root and n.flight is None and n.col < 0:
            out.insert(0, n)
            n = n.parent
        return out

    def alive(self) -> list[Node]:
        """The head and every node below it, parents first."""
        out, stack = [], [self.head]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(n.children))
        return out

    @staticmethod
    def below(n: Node) -> int:
        """How many nodes the tree has under n."""
        count, stack = 0, list(n.children)
        while stack:
            m = stack.pop()
            count += 1
            stack.extend(m.children)
        return count

    @staticmethod
    def path(n: Node, top: Node) -> list[int]:
        """The tokens from below `top` down to n."""
        out = []
        while n is not top:
            out.insert(0, n.token)
            n = n.parent
        return out

    def chance(self, n: Node) -> float:
        """Its chance of being reached from the head."""
        c = 1.0
        while n is not self.head:
            c *= n.cond
            n = n.parent
        return c

    @staticmethod
    def child_of(n: Node, top: Node) -> Node | None:
        """The child of `top` that n is under (or is), if any."""
        while n.parent is not None and n.parent is not top:
            n = n.parent
        return n if n.parent is top else None

    def ends(self, floor: float, greedy: bool) -> list[tuple[float, Node]]:
        """The likeliest places the rounds in flight stop at, where new nodes may go: (the chance of stopping
        there, the node). Greedy: a node's chance less its children's (the target's token there is none of
        them); sampled: only nodes with no children yet (their children are drawn once)."""
        out = []
        for n in self.alive():
            if n.best is not None or n.p is not None:
                continue  # resolved already (the walk goes past it as soon as it can)
            chance = self.chance(n)
            stop = chance - sum(self.chance(c) for c in n.children) if greedy else 0.0 if n.children else chance
            if stop >= floor and stop > 0:
                out.append((stop, n))
        out.sort(key=lambda sn: -sn[0])
        return [(self.chance(n), n) for _, n in out[:END_POINTS]]

    @staticmethod
    def graft(at: Node, chance: float, d: Draft, greedy: bool) -> list[tuple[float, Node]]:
        """The draft's tree under `at`, merged into the tree: a token already a child there is that child. Returns
        the new nodes with their chances from the head."""
        mapped: dict[int, Node] = {-1: at}
        out = []
        for i, (t, parent) in enumerate(zip(d.tokens, d.parents)):
            up = mapped.get(parent)
            if up is None:
                continue
            known = next((c for c in up.children if c.token == t), None)
            if known is not None:
                mapped[i] = known
                continue
            if not greedy and any(c.col >= 0 or c.flight is not None for c in up.children):
                continue  # a sampled node's children are drawn once
            up_sure = d.sure[parent] if parent >= 0 else 1.0
            n = Node(t, up, up.pos + 1, cond=d.sure[i] / up_sure if up_sure > 0 else 0.0,
                     q=d.q[i] if d.q is not None else None)
            up.children.append(n)
            mapped[i] = n
            out.append((chance * d.sure[i], n))
        return out

    def lay_out(self, new: list[Node]) -> Layout:
        """The frame for these new nodes: where they go in every stage's cache, after the nodes still alive, and
        the layout the caches have after it (the committed nodes leading the columns join base)."""
        kept = [n for n in self.cols if not n.dead]
        order = kept + new
        index = {id(n): i for i, n in enumerate(order)}
        parents = []
        for n in order:
            p = index.get(id(n.parent), -1)
            if p < 0 and n.parent.pos != self.base - 1:
                raise AssertionError("a node's parent is neither sent nor the last committed position")
            parents.append(p)
        layout = Layout(parents, [n.col for n in kept], self.base)
        for j, n in enumerate(order):
            n.col = self.base + j
        lead = 0
        while lead < len(order) and order[lead].committed:
            lead += 1
        self.base += lead
        self.cols = order[lead:]
        return layout

    def walk(self, left: int, params: SamplingParams, eos: set[int]) -> tuple[list[int], bool, list[torch.Tensor]]:
        """Down from the head while the target's choice there is known; commits at most `left` tokens. Returns
        them, whether they end the answer, and (with logprobs asked for) the target's logits where each was
        chosen."""
        new: list[int] = []
        rows: list[torch.Tensor] = []
        at_eos = False
        while len(new) < left and not at_eos:
            h = self.head
            if h.best is None and h.p is None:
                break
            child, token = self.choose(h, params)
            if params.logprobs is not None:
                rows.append(h.logits)
            for c in h.children:
                if c is not child:
                    self.kill(c)
            if child is None:  # the target's own token: the next round carries it
                child = Node(token, h, h.pos + 1)
            elif h.children and child is not h.children[0] and child.flight is not h.children[0].flight:
                child.flight.caught = True  # a hedge sent after the first guess caught this rejection
            self.commit(child)
            new.append(token)
            at_eos = token in eos
        return new, at_eos, rows

    @staticmethod
    def choose(h: Node, params: SamplingParams) -> tuple[Node | None, int]:
        """The target's token after h: one of its children, or (None, a token of its own)."""
        if params.greedy:
            return next((c for c in h.children if c.token == h.best), None), h.best
        # the target's own draw, keyed by (seed, position), then the child that drafted it if there is one: the
        # same token as a plain round or no draft at all would take (peers/speculation/sampling.py)
        y = draw(h.p, position_generator(params.seed, h.pos + 1, ACCEPT))
        return next((c for c in h.children if c.token == y), None), y

    def observed(self) -> list[Node]:
        """The committed tokens whose target features have come, in order, from the first not yet handed on."""
        done = []
        while self.unobserved and self.unobserved[0].feat is not None:
            done.append(self.unobserved.popleft())
        return done
