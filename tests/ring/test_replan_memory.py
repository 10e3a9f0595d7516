"""A re-plan gives back what it replaces: the host's resident set follows the layers it holds, re-plan after
re-plan, on the real SmolLM2 beside a real peer process."""
import weakref

import pytest
import trio

from helpers import new_chat, running_ring
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.compute.memory import rss_bytes
from peers.speculation.sampling import SamplingParams

pytestmark = pytest.mark.slow
MB = 2**20
# what the host offers (GB) beside a peer offering 1 GB: 25 of SmolLM2's 30 layers, or 5
MORE, FEWER = 4.0, 0.6


def test_five_re_plans_free_the_layers_and_caches_they_replace(smollm2):
    async def main():
        async with running_ring(smollm2, 1, extra=["--offer-gb", "1.0"], offer_gb=MORE,
                                conversations=1) as (host, _):
            chat = new_chat(host)
            seen = []
            for gb in (FEWER, MORE, FEWER, MORE, FEWER):
                host.planner.offer_gb = gb
                old_cache = weakref.ref(chat.rs.cache) if chat.rs.cache is not None else None
                await host.replan()
                # the conversation's cache of the old plan is gone before it speaks again
                assert old_cache is None or old_cache() is None
                # an answer under each plan: its caches are made, and dropped by the next plan
                await chat.reply("Hi", drafter=Drafter(), params=SamplingParams(), policy=KPolicy(), max_new_tokens=2)
                layer = sum(p.numel() * p.element_size() for p in host.shard.layers.parameters()) / host.shard.span.size
                seen.append((host.shard.span.size, rss_bytes()))
            return seen, layer

    seen, layer = trio.run(main)
    print("layers held, resident MB after each re-plan:", [(n, rss // MB) for n, rss in seen])
    assert [n for n, _ in seen] == [5, 25, 5, 25, 5]
    (_, first), (_, _), _, (_, more), (_, fifth) = seen
    dropped = (25 - 5) * layer
    assert more - fifth > dropped / 2, f"the 20 layers dropped ({dropped / MB:.0f} MB) stayed resident"
    assert fifth < first + 64 * MB, "the host grew across re-plans that hold the same layers"
