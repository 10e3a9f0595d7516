"""Under load: a 2,000-token conversation over many rounds keeps memory flat apart from the KV cache."""
import multiprocessing

import trio

from helpers import new_chat, running_ring
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.compute.memory import rss_bytes
from peers.speculation.sampling import SamplingParams
from tiny import CORPUS, make_model


def conversation(model) -> tuple[list, int]:
    """Six long turns on a host and one peer: (tokens, host RSS, peer RSS) after each, and the rounds."""
    async def main():
        async with running_ring(model, 1) as (host, lp):
            chat = new_chat(host)
            samples, rounds = [], 0
            for turn in range(6):
                text = " ".join(CORPUS[turn * 3: turn * 3 + 12])
                _, r = await chat.reply(text, drafter=Drafter(), params=SamplingParams(1.0, seed=turn),
                                        policy=KPolicy(), max_new_tokens=120)
                rounds += r.stats.rounds
                samples.append((len(chat.tokens), rss_bytes(), rss_bytes(lp.procs[0].pid)))
        return samples, rounds
    return trio.run(main)


def test_long_conversation_memory_is_flat(tmp_path):
    model = make_model(tmp_path, "llama", layers=4, seed=1, max_position_embeddings=4096)  # holds 2,000+ tokens
    # the host in a fresh process: a test worker's RSS also moves with what earlier tests left in its allocator
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        samples, rounds = pool.apply(conversation, (model,))
    assert samples[-1][0] >= 2000 and rounds >= 100, (samples, rounds)
    # after the first turn (allocator warm-up) neither process grows by more than a few MB
    (_, h1, p1), (_, h2, p2) = samples[1], samples[-1]
    assert h2 - h1 < 40 * 2**20, samples
    assert p2 - p1 < 40 * 2**20, samples
