"""Adaptive draft length: pick K to maximise expected tokens per second.

With per-token acceptance alpha, a round with K drafts commits on average
    E(K) = (1 - alpha^(K+1)) / (1 - alpha)
tokens (the accepted prefix plus the target's own next token), and costs about
    base_ms + K * (verify_ms + draft_ms)
where base_ms is a ring pass over one token (the round trip and every member's layers), verify_ms what each
extra token adds to that pass (small on a GPU, a good part of a token's forward on a CPU) and draft_ms the draft's
cost per token. So we pick argmax_K E(K) / (base_ms + K * (verify_ms + draft_ms)).

alpha is estimated as a geometric acceptance: a round that accepted a of K drafts tested a + 1 of them (the
first miss ends the test; the drafts after it say nothing), or K if all passed; alpha = hits / tests over recent
rounds, older ones weighted down exponentially, starting from a prior of 0.6 worth two tests. (A plain average of
a / K reads a round of K = 8 that accepted 1 as 1/8, not as one hit in two tests, and sinks alpha below what
K = 1 rounds show.) base_ms and verify_ms are the intercept and slope of a
least-squares line through recent (K, pass time) pairs, with older rounds weighted down exponentially; while K
has not varied enough to see a slope, the last slope (at first 0) stands. When K = 0 is best (a draft too weak or
too dear for this link), one round in EXPLORE_EVERY still drafts once, so that alpha keeps being measured.

A drafter that knows how sure it is of each token (the feature draft: its top probability) does better than one K
for every round: acceptance is not the same everywhere (a list, code or a repeated phrase is easy, a new sentence
is not). Drafting one more token whose chance of being accepted, with every draft before it, is P adds P tokens to
a round and verify_ms + draft_ms to its cost; that raises tokens per ms exactly when P > R * (verify_ms + draft_ms),
R being the tokens per ms rounds make now. So such a drafter drafts while the product of its confidences stays
above that floor (up to k_max), and R is measured over recent rounds: thresholding at the current rate and
re-measuring climbs to the best rate (as Dinkelbach's method does for a ratio).

A pass's cost is not a straight line in the positions it carries: on a CPU it steps up where the matrix kernels
change (here at 4 positions), and in a ring every member pays the step. So the policy also keeps what each size
of pass cost, and of greedy drafts made down to the floor the host verifies only the n likeliest that maximise
the round's expected tokens per ms (select). It also compares what the drafter's confidences promised with what
was accepted, and discounts them by that (trust): a confidence calibrated offline can be optimistic on other text.

A tree of drafts (peers/speculation/tree.py) is sized by the same rule, node by node: a node whose chance of being reached
(the drafter's, with every ancestor's) is P adds P tokens to the round, so the drafter grows the tree while its
nodes' chances beat the floor, up to max_nodes, and `select` keeps the likeliest n that maximise the round's
tokens per ms at the measured pass costs. On a GPU a pass of 64 positions costs about what one of 1 does, so
the floor is low and trees grow to dozens of nodes; on a CPU each position costs, and they stay small.
`--tree-nodes N` pins the drafted positions (a tree of N nodes, or with `--no-trees` a chain of N).

Conversations that share a pass (peers/host/batcher.py) share one policy. R counts each round's share of the pass
(pass ms / the rounds in it), so it is what the whole pass makes per ms; a position costs what it adds to the
whole pass, and a draft what its share of the drafting run costs (peers/speculation/drafting/together.py): a draft must pay
for the time it adds to everyone's round, not only to its own conversation's. What a position adds depends on
how many the pass already carries (the other conversations' too: a fifth row costs less than a second), so the
line and the table of pass costs are over the pass's positions, all conversations' together.

Rounds in flight (peers/speculation/in_flight.py). A round alone on the ring takes trip_ms, link_ms of it on the links, and its
busiest stage is busy busiest_ms; while it crosses the links that stage can compute link_ms / busiest_ms more
rounds (beyond that they queue there), so an answer keeps one and that many more in flight (at most
AUTO_IN_FLIGHT); where that rounds to none (a link that costs less than a stage's pass), or the link is shorter
than FLY_LINK_MS, answers go in the plain rounds above. A round sent while others are in flight is a hedge for one
place where they may stop: the draft's next guess there and the tree under it. Where it is needed (its chance P),
it saves the round trip a round sent after the verdict would take (trip_ms); it costs what its positions add to the
busiest stage (position_ms each, in the answer's way only when that stage is busy). So a hedge goes where P *
trip_ms >= position_ms, with no more nodes than the last plain round had, so that hedges never make a stage slower
than plain rounds do. Both times are measured on rounds that had the ring to themselves (a round queued behind
others says nothing of its own costs). Whether that pays is measured too, as the tokens an answer commits per ms of
wall time with rounds in flight and one at a time, and one at a time is where an answer starts and stays: rounds
go in flight only for a trial (TRIAL_ROUNDS rounds), and after it stay there only if it measured them at least
FLY_GAIN faster. A trial that loses doubles the gap to the next one, so what trials cost shrinks as they keep
losing; flight that turns slower than one at a time goes back to it (and its trials start over). So auto never
settles on a pace its own measurements say is slower than one round at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from peers.base.limits import MAX_NODES

EXPLORE_EVERY = 8
MAX_IN_FLIGHT = 4  # an answer's rounds on the ring at once, at most
# ... as the policy chooses them: on a CPU a hedge costs a stage about what a round does, and two rounds ahead
# measured slower than one (docs/benchmarks.md); --in-flight N sends more
AUTO_IN_FLIGHT = 2
FLY_LINK_MS = 20.0  # links shorter than this (a LAN, one machine) save too little to pay for a hedge's drafting
TRIAL_ROUNDS = 16  # rounds a trial of rounds in flight lasts (and the rounds one at a time before the first)
FLY_GAIN = 1.03  # rounds go in flight after a trial only where it made tokens at least this much faster
MIN_K_VARIANCE = 0.25  # below this spread of recent K, a fitted slope would be noise


def expected_tokens(alpha: float, k: int) -> float:
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def best_k(alpha: float, round_ms: float, draft_ms: float, k_max: int, verify_ms: float = 0.0) -> int:
    per_token = verify_ms + draft_ms
    return max(range(k_max + 1), key=lambda k: expected_tokens(alpha, k) / (round_ms + k * per_token + 1e-9))


@dataclass
class KPolicy:
    pinned: int | None = None  # --k N
    k_max: int = 12
    hits: float = 1.2  # exponentially weighted accepted drafts; the prior: alpha 0.6 over two tests
    tests: float = 2.0  # exponentially weighted drafts tested
    keep: float = 0.9  # each round's weight on the next: the estimates follow about the last ten rounds
    base_ms: float = 0.0  # a pass over one token (0: not measured yet)
    verify_ms: float = 0.0  # what each drafted token adds to a pass
    rounds: int = 0
    # exponentially weighted sums for the line pass_ms = base_ms + verify_ms * K: weight, K, K^2, ms, K*ms
    _sums: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
    made: float = 0.0  # exponentially weighted tokens committed per round ...
    spent: float = 0.0  # ... and pass ms per round: their ratio is R, the rate rounds make now
    passes: dict = field(default_factory=dict)  # positions a pass carried -> its exponentially weighted ms
    others: int = 0  # positions the last pass carried for other conversations
    trust: float = 1.0  # drafts accepted over the number the drafter's confidences promised (greedy rounds)
    _promised: tuple[float, float] = (0.0, 0.0)  # exponentially weighted (accepted, promised)
    trees: bool = True  # False (--no-trees): drafts are chains
    tree_nodes: int | None = None  # --tree-nodes N: N drafted positions a round (a tree's nodes, or a chain's)
    max_nodes: int = MAX_NODES  # a tree's nodes at most
    in_flight: int | None = None  # --in-flight N: this conversation's rounds on the ring at most (None: the policy's)
    trip_ms: float = 0.0  # a round's time on the ring with nothing in front of it, smoothed
    link_ms: float = 0.0  # the part of it on the links
    # (tokens, wall ms) answers made one round at a time (False) and with rounds in flight (True), weighted down
    paces: dict = field(default_factory=lambda: {False: (0.0, 0.0), True: (0.0, 0.0)})
    paced: int = 0  # rounds paced, either way: the trials' clock
    trial_until: int = 0  # a trial of rounds in flight runs until `paced` reaches this (0: none running)
    next_trial: int = TRIAL_ROUNDS  # the next trial starts once `paced` reaches this ...
    trial_gap: int = TRIAL_ROUNDS  # ... and each one that loses doubles the gap to the next
    flying: bool = False  # a trial measured rounds in flight faster: they stay (while they are not slower)
    busiest_ms: float = 0.0  # the busiest stage's compute in such a round, smoothed

    @property
    def alpha(self) -> float:
        return min(self.hits / self.tests, 0.99)

    def choose(self, draft_ms: float) -> int:
        if self.pinned is not None:
            return self.pinned
        if self.base_ms <= 0:
            return 4
        k = best_k(self.alpha, self.base_ms + self.verify_ms * self.others, draft_ms, self.k_max, self.verify_ms)
        if k == 0 and self.rounds % EXPLORE_EVERY == 0:
            return 1
        return k

    def nodes(self) -> int:
        """The nodes a tree may have."""
        return self.tree_nodes if self.tree_nodes is not None else self.max_nodes

    def plan(self, draft_ms: float, confident: bool = False) -> tuple[int, float]:
        """(K, floor): draft K tokens, or with a drafter that reports its confidence and once rounds have been
        measured, up to k_max of them while the product of its confidences stays at or above floor (the
        confidences as measured: divided by how far they have promised more than was accepted). With
        --tree-nodes N: K = N and no floor (a tree N deep at most, of N nodes)."""
        if self.tree_nodes is not None:
            return self.tree_nodes, 0.0
        if not confident or self.pinned is not None or self.spent <= 0:
            return self.choose(draft_ms), 0.0
        return self.k_max, self.made / self.spent * (self.verify_ms + draft_ms) / self.trust

    def flight_plan(self, draft_ms: float, plain: bool, position_ms: float = 0.0) -> tuple[int, float, int]:
        """(rounds in flight, peers/speculation/in_flight.py) A round's tree: (depth, floor, nodes). A plain round (nothing in
        flight) is on the answer's critical path: a node pays its drafting and its place in the pass, as plan()
        has it. A hedge node is worth what it saves: where it is needed (its chance P), the answer goes on without
        waiting a round trip (trip_ms) for a round sent after the verdict; it costs what its place adds to the
        busiest stage (position_ms), where rounds queue. So it goes where P * trip_ms >= position_ms."""
        if self.tree_nodes is not None:
            return self.tree_nodes, 0.0, self.tree_nodes
        depth = self.pinned or self.k_max
        if self.spent <= 0:
            return min(depth, 4), 0.1, self.nodes()
        if plain or self.trip_ms <= 0:
            return depth, self.made / self.spent * (self.verify_ms + draft_ms) / self.trust, self.nodes()
        return depth, position_ms / self.trip_ms / self.trust, self.nodes()

    def stages(self, timing: dict) -> None:
        """A round that had the ring to itself: its time there, the link's part of it and its busiest stage's
        compute."""
        busiest = max([timing["host_ms"]] + [ms for _, ms in timing["peers"]])
        for name, value in (("trip_ms", timing["pass_ms"]), ("link_ms", timing["network_ms"]),
                            ("busiest_ms", busiest)):
            old = getattr(self, name)
            setattr(self, name, value if not old else 0.7 * old + 0.3 * value)

    def rounds_in_flight(self) -> int:
        """How many of an answer's rounds may be on the ring at once: --in-flight N, else one and as many more as
        the busiest stage can compute while a round crosses the links (beyond that they queue there)."""
        if self.in_flight is not None:
            return self.in_flight
        if self.busiest_ms <= 0 or self.link_ms < FLY_LINK_MS:
            return 1
        n = max(1, min(AUTO_IN_FLIGHT, 1 + round(self.link_ms / self.busiest_ms)))
        if n == 1 or self.flying or self.trial_until:
            return n
        if self.paced >= self.next_trial:  # time for a trial: rounds in flight, measured
            self.trial_until = self.paced + TRIAL_ROUNDS
            self.paces[True] = (0.0, 0.0)  # each trial measures afresh
            return n
        return 1

    def pace(self, flying: bool, tokens: int, ms: float) -> None:
        """Tokens an answer committed in `ms` of its wall time, with rounds in flight or one at a time; ends a
        trial (rounds in flight stay if it won, else the next waits twice as long) and ends flight that turned
        slower than one at a time."""
        made, spent = self.paces[flying]
        self.paces[flying] = (self.keep * made + tokens, self.keep * spent + ms)
        self.paced += 1
        if self.trial_until and self.paced >= self.trial_until:
            self.trial_until = 0
            self.flying = self.flight_gain() >= FLY_GAIN
            if not self.flying:
                self.trial_gap *= 2
                self.next_trial = self.paced + self.trial_gap
        elif self.flying and self.flight_gain() < 1.0:
            self.flying = False
            self.trial_gap = TRIAL_ROUNDS
            self.next_trial = self.paced + self.trial_gap

    def flight_gain(self) -> float:
        """Tokens per ms with rounds in flight over one at a time, as measured (0: either not yet)."""
        (one_made, one_ms), (fly_made, fly_ms) = self.paces[False], self.paces[True]
        if min(one_ms, fly_ms, one_made) <= 0:
            return 0.0
        return (fly_made / fly_ms) / (one_made / one_ms)

    def pass_ms(self, positions: int) -> float:
        """What a pass carrying `positions` costs: as measured where passes of that size were seen (on a CPU the
        cost steps up where the matrix kernels change, so no straight line fits it; `python scripts/pass_cost.py`),
        else from the fitted line."""
        if positions in self.passes:
            return self.passes[positions]
        return self.base_ms + self.verify_ms * (positions - 1)

    def select(self, sure: list[float], pending: int = 1) -> int:
        """How many of the likeliest of these drafts (their chances, each with its ancestors') to verify in a pass
        that also carries `pending` tokens (and, as the last pass did, `others` of other conversations): n
        maximising (1 + trust * the n largest chances summed) / pass_ms(others + pending + n), the expected
        tokens per ms of the round. (Greedy only: for sampled drafts a later chance depends on the earlier draws,
        so choosing by it would bias which drafts are verified.)"""
        if self.spent <= 0 or self.pinned is not None:
            return len(sure)
        others = self.others
        best_n, best, expected = 0, 1.0 / self.pass_ms(others + pending), 1.0
        for n, s in enumerate(sorted(sure, reverse=True), 1):
            expected += self.trust * s
            if (rate := expected / self.pass_ms(others + pending + n)) > best:
                best_n, best = n, rate
        return best_n

    def update(self, drafted: int, accepted: int, round_ms: float, positions: int | None = None,
               promised: float | None = None, share: float = 1.0, others: int = 0) -> None:
        """One round: `positions` is how many of its own the pass carried (1 + drafted unless it also caught up
        on a prompt or re-sent tokens a tree accepted off its main chain); passes that carried many tokens
        besides the drafts (a prompt's prefill, a replay) say nothing about K. `promised`: the sum of the drafts'
        confidences (what a greedy round expected to accept). `share`: this round's part of the pass (1 / the
        rounds that shared it), for R; `others`: the positions it carried for other conversations."""
        self.rounds += 1
        if promised is not None:
            a, p = (self.keep * v for v in self._promised)
            self._promised = (a + accepted, p + promised)
            if self._promised[1] >= 2.0:  # a couple of rounds' worth before it says anything
                self.trust = min(max(self._promised[0] / self._promised[1], 0.5), 1.5)
        if drafted:
            self.hits = self.keep * self.hits + accepted
            self.tests = self.keep * self.tests + (accepted + 1 if accepted < drafted else drafted)
        k = float(drafted if positions is None else positions - 1)
        if k - drafted > self.k_max:
            return
        k += others
        self.others = others
        self.made = self.keep * self.made + accepted + 1
        self.spent = self.keep * self.spent + round_ms * share
        n = int(k) + 1
        self.passes[n] = round_ms if n not in self.passes else 0.7 * self.passes[n] + 0.3 * round_ms
        w, sk, skk, sr, skr = (self.keep * s for s in self._sums)
        self._sums = (w + 1, sk + k, skk + k * k, sr + round_ms, skr + k * round_ms)
        w, sk, skk, sr, skr = self._sums
        mean_k, mean_r = sk / w, sr / w
        var_k = skk / w - mean_k**2
        if var_k >= MIN_K_VARIANCE:
            self.verify_ms = max((skr / w - mean_k * mean_r) / var_k, 0.0)
        self.base_ms = max(mean_r - self.verify_ms * mean_k, 1e-3)


class LinkPolicy(KPolicy):
    """The policy as it would see rounds over a link that adds `rtt_ms` to every ring pass (a measurement on one
    machine of the choices a wide-area ring would make)."""

    def __init__(self, rtt_ms: float, **kw):
        super().__init__(**kw)
        self.rtt_ms = rtt_ms

    def update(self, drafted, accepted, round_ms, positions=None, promised=None, share=1.0, others=0):
        super().update(drafted, accepted, round_ms + self.rtt_ms, positions, promised, share, others)
