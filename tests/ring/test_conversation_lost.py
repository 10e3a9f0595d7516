"""A member that no longer holds one conversation's caches (another holder of the token took its only row, as the
soak's fuzzer does) leaves that conversation out of the pass: it replays alone and its answer is the same; the ring,
whole all along, is not re-planned (on the code before, every such miss re-planned the ring and replayed every
conversation)."""
import logging

import torch
import trio

from helpers import new_chat, running_ring
from peers.links.auth import client_handshake
from peers.links.channel import Channel, parse_addr
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams
from peers.wire import tensors

FIRST, SECOND = "the quick brown fox jumps over the lazy dog", "and then what did the fox do"
N = 8


async def turn(chat, prompt: str) -> list[int]:
    _, r = await chat.reply(prompt, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(), max_new_tokens=N)
    return r.token_ids


async def take_the_row(host) -> None:
    """A frame of a conversation nobody has, into the first member: its arena's only row goes to it."""
    stream = await trio.open_tcp_stream(*parse_addr(host.ring[0].data_addr))
    ch = Channel(stream, "intruder")
    await client_handshake(ch, host.token, "data", epoch=host.epoch)
    header, raw = tensors.host_bytes(torch.zeros(1, 3, host.config.hidden_size))
    await ch.send({"t": "fwd", "epoch": host.epoch, "sid": "intruder", "seq": 10**6, "committed": 0, "n_logits": 1,
                   "x": header, "raw": bytes(raw), "trace": []})
    await trio.sleep(1.0)  # computed (its reply goes on round the ring and is dropped by the host)
    await ch.aclose()


def test_a_conversation_a_member_lost_replays_alone_and_nothing_is_replanned(tiny_llama, caplog):
    caplog.set_level(logging.INFO, "sfchat.generate")

    async def main():
        async with running_ring(tiny_llama, 2, conversations=1) as (host, _):
            undisturbed = new_chat(host)
            expected = [await turn(undisturbed, FIRST), await turn(undisturbed, SECOND)]
            chat = new_chat(host)
            got = [await turn(chat, FIRST)]
            await take_the_row(host)
            epoch = host.epoch
            got.append(await turn(chat, SECOND))
            assert host.epoch == epoch, "the ring was re-planned for one conversation's caches"
            return expected, got

    expected, got = trio.run(main)
    assert got == expected
    assert "replaying this conversation" in caplog.text, "the member did not lose the conversation: nothing tested"
