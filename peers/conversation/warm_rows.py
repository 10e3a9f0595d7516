"""Warm rows: a prefix cache across requests, on every member of the ring at once.

An answer that ends leaves its conversation's KV row on every member as it is (peers/compute/kv.py: one row of
--max-context per conversation); the host records the tokens the row holds. The next request takes the warm row
that shares the longest prefix with its prompt, sets the conversation's position there, and the ring computes
only the rest: the rollback rule (peers/host/session.py) makes every stage trim its row to that position with
the next frame, so nothing else is sent. A row's drafter goes with it (the feature draft's features, a model
draft's KV), so the draft too picks up where the row left off.

What a row holds is trusted only while it is the ring's: `host.committed` is 0 for a row of an older plan (a
re-plan, a member lost or given a new span: each is a new epoch), for one whose host-side row went to another
conversation (evicted), and here for one idle so long that the members may have collected it (SESSION_IDLE_S).
Such a row holds nothing and is reused from position 0.

Which row a request takes (`m`: the prefix it can reuse; `loss`: the positions of the row's own conversation it
would overwrite):
1. a row that holds only a prefix of the prompt (loss 0), the longest: a chat's next turn;
2. a row whose shared prefix is at least SHARE times what it would overwrite, the longest: an agent's next call
   after the same long system prompt, though the row held another call's short tail;
3. a free row: a new one while the pool is below its size, else one that holds nothing valid;
4. the least recently used idle row (with whatever prefix it shares).
Rows are never copied into one another, so two chats that share only a system prompt keep rows of their own while
there are rows to spare (rule 2 leaves them alone where a chat's own turns are more than a SHARE-th of its system
prompt), and take the least recently used one after.

The pool has as many rows as every member's arena (--max-conversations), so no member ever evicts a warm row, and
warm rows cost no memory beyond what the plan counts. More warm rows than admitted conversations would need arena
rows the plan does not count (on a GPU each is a whole --max-context, reserved); where memory allows, a larger
--max-conversations gives more of both.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from peers.base.limits import SESSION_IDLE_S
from peers.host.host import Host, RingSession
from peers.speculation.drafting import Drafter, common_prefix

SHARE = 4  # rule 2: the prefix shared is worth taking over another conversation's row at SHARE times its loss
TRUST_S = SESSION_IDLE_S / 2  # a row idle longer is reused from position 0: members collect theirs after SESSION_IDLE_S


@dataclass(eq=False)
class Row:
    rs: RingSession
    drafter: Drafter | None = None  # its own fork of the server's drafter, following the same tokens
    tokens: list[int] = field(default_factory=list)  # the conversation whose first host.committed(rs) the ring holds
    used: float = 0.0  # when its last answer ended (monotonic), for least recently used
    busy: bool = False
    spare: bool = False  # taken past the pool's size (every row busy): dropped when its answer ends


@dataclass
class Taken:
    row: Row
    cached: int  # prompt tokens every stage already holds: what the ring will not compute again


class WarmRows:
    def __init__(self, host: Host, drafter: Drafter, size: int):
        """size: how many rows the pool keeps (0: none; every answer's row is dropped when it ends)."""
        self.host, self.base, self.size = host, drafter, size
        self.rows: list[Row] = []

    def status(self) -> int:
        """How many rows are warm: idle, with positions every stage still holds."""
        return sum(not r.busy and self._held(r, time.monotonic()) > 0 for r in self.rows)

    def _held(self, r: Row, now: float) -> int:
        return self.host.committed(r.rs) if now - r.used < TRUST_S else 0

    def take(self, prompt: list[int], reuse: bool = True) -> Taken:
        """A row for this prompt, its position set (reuse False: from scratch, as `cache_prompt: false` asks)."""
        now = time.monotonic()
        idle = []
        for r in self.rows:
            if not r.busy:
                held = self._held(r, now)
                m = min(held, r.rs.filled, common_prefix(prompt, r.tokens), len(prompt) - 1) if reuse else 0
                idle.append((r, m, held - m))
        longest = lambda cs: max(cs, key=lambda c: (c[1], -c[0].used))  # noqa: E731 (a tie: least recently used)
        extend = [c for c in idle if c[1] > 0 and c[2] == 0]
        share = [c for c in idle if c[1] > 0 and c[1] >= SHARE * c[2]]
        empty = [c for c in idle if c[1] == 0 and c[2] == 0]
        if extend or share:
            row, m, _ = longest(extend or share)
        elif len(self.rows) < self.size or not idle:
            row, m = self._new(spare=len(self.rows) >= self.size), 0
        else:
            row, m, _ = min(empty or idle, key=lambda c: c[0].used)
        if m == 0 and row.drafter is not None:  # nothing reused: the draft starts afresh too
            row.drafter.close()
            row.drafter = None
        if row.drafter is None:
            row.drafter = self.base.fork()
        row.busy = True
        row.rs.set_position(m, len(prompt))
        return Taken(row, m)

    def _new(self, spare: bool) -> Row:
        r = Row(self.host.new_session("api-" + uuid.uuid4().hex[:12]), spare=spare)
        if not spare:
            self.rows.append(r)
        return r

    async def give_back(self, row: Row, tokens: list[int], finished: bool) -> None:
        """After the answer: a finished one's row stays warm holding `tokens` (the prompt and the answer); a row
        past the pool's size, or of an answer cut short (a client gone, a failure), goes on every member."""
        row.busy = False
        row.drafter.close()  # (drafting together no longer waits for it; its state stays)
        if finished and not row.spare and self.size:
            row.tokens, row.used = tokens, time.monotonic()
            return
        if row in self.rows:
            self.rows.remove(row)
        row.drafter = None
        await self.host.drop(row.rs)
