"""What the feature draft has seen of one conversation: the target's features the ring handed over (observe), the
draft's own cache over them, and how much of that cache was computed from real features. The step generators
that draft from it are in feature.py.

Cache index t holds the draft's keys and values for input (f_t, x_{t+1}). The first `true_len` indices were
computed from the target's real features; later ones (drafted ahead of what the ring has verified, e.g. during a
round trip) from the draft's own predictions, and are recomputed once the real ones arrive."""
from __future__ import annotations

import torch

from peers.speculation.drafting.base import common_prefix


class FeatureContext:
    def __init__(self, new_cache, hidden_size: int, device: str):
        self.new_cache = new_cache
        self.cache = new_cache()
        # the target's features at positions 0..n_feats-1, in a buffer that grows by doubling (observe runs
        # every round: appending must not copy the whole conversation each time)
        self.feats = torch.zeros(256, hidden_size, device=device)
        self.n_feats = 0
        self.feat_ids: list[int] = []  # the token at each of those positions
        self.blind = 0  # leading positions never seen (the draft joined mid-conversation): their features are zeros
        self.cache_next: list[int] = []  # x_{t+1} behind cache index t
        self.true_len = 0

    def observe(self, start: int, ids: list[int], feats: torch.Tensor) -> None:
        """The ring's features for positions start.. (tokens `ids`): a replay rewrites from `start` on."""
        end = start + len(feats)
        if end > len(self.feats):
            grown = self.feats.new_zeros(max(end, 2 * len(self.feats)), self.feats.shape[1])
            grown[: self.n_feats] = self.feats[: self.n_feats]
            self.feats = grown
        if start > self.n_feats:  # positions it never saw (it joined mid-conversation): start over blind
            self.feats[:start] = 0
            self.feat_ids, self.blind, self.true_len = [-1] * start, start, 0
        self.blind = min(self.blind, start)  # a replay brings real features from `start` on
        self.feats[start:end] = feats.to(self.feats.device, self.feats.dtype)
        self.n_feats = end
        self.feat_ids = self.feat_ids[:start] + list(ids)
        self.true_len = min(self.true_len, start)

    def known(self, context: list[int]) -> int:
        """Leading positions whose feature belongs to this very context (not to a rejected draft), the last token
        excluded: its feature is what the ring computes next. Blind positions count as belonging."""
        b = min(self.blind, len(context) - 1)
        return b + common_prefix(self.feat_ids[b:], context[b:], len(context) - 1 - b)

    def crop(self, n: int) -> None:
        """Keep the first n cache indices."""
        if n < len(self.cache_next):
            if n == 0:
                self.cache = self.new_cache()
            else:
                self.cache.crop(n - len(self.cache_next))  # (this cache's crop takes what to drop)
            self.cache_next = self.cache_next[:n]
        self.true_len = min(self.true_len, n)
