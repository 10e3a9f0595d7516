"""Rounds in flight on the wire (peers/member/passes.py): members that run in this process, so that a test can hold one's
compute while frames queue behind it. A segment with `keep` goes round exactly; one whose keep this member cannot
honour fails alone; a cancel goes round the ring at once (the host ignores it) and the segment it names, queued
behind a pass, comes back skipped with no rows while every member's columns advance as if it had been computed."""
import torch
import trio
from transformers import AutoModelForCausalLM

from helpers import running_ring
from peers.wire import tensors, schema as validate
from peers.base.options import PeerOptions
from peers.member.peer import Peer

PX = [5, 17, 42, 99, 7, 3, 120, 64, 11]
PY = [250, 33, 8, 19, 140]


async def with_members(host, nursery, n: int) -> list[Peer]:
    """n members in this process, joined and planned, in ring order."""
    peers = [Peer(PeerOptions(host.address, host.token, listen="127.0.0.1:0", device="cpu", name=f"inproc{i}"))
             for i in range(n)]
    for p in peers:
        await nursery.start(p.run)
    await host.wait_members(n)
    await host.replan()
    by_name = {p.name: p for p in peers}
    ring = [by_name[m.name] for m in host.ring]
    assert len(ring) == n and all(p.shard is not None and p.shard.span.size for p in ring), host.ring
    return ring


def frame(host, segments: list[dict], x: torch.Tensor) -> dict:
    header, raw = tensors.host_bytes(x)
    return {"t": "fwd", "epoch": host.epoch, "sid": "", "committed": 0, "n_logits": 1, "batch": segments,
            "x": header, "raw": raw, "trace": []}


def reference(model):
    ref = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    return lambda ids: ref(torch.tensor([ids])).logits[0, -1]


async def prefill(host, sid: str, prompt: list[int]):
    rs = host.new_session(sid)
    await host.forward(rs, prompt, [])
    rs.set_position(len(prompt) - 1, len(prompt))  # (every stage holds the prompt; its last token goes again)
    return rs


def test_keep_goes_round_and_a_bad_keep_fails_alone(tiny_llama):
    """A round's tree, then a pass that keeps the accepted off-chain path (columns 9, 12, 13) and adds a tree
    under it: each row's logits, through the host's layers, two members and the head, are transformers' own.
    A segment whose keep names columns a member does not hold is left out with one line; its frame's other
    conversation is computed."""
    want = reference(tiny_llama)

    async def main():
        async with running_ring(tiny_llama, 0, plan=False) as (host, _):
            async with trio.open_nursery() as nursery:
                await with_members(host, nursery, 2)
                rs = await prefill(host, "x", PX)
                rs.set_position(len(PX), len(PX) + 1)
                await host.forward(rs, PX + [30], [31, 32, 33, 34, 35, 36], parents=[-1, 0, -1, 2, 3, 2])
                keep, ids, full = [9, 12, 13], [40, 41, 42], [-1, 0, 1, 2, 3, 2]
                hs, (header, raw) = await host.stage.first([(rs.cache, 9, torch.tensor([ids]), full, keep)], True)
                seg = {"sid": "x", "committed": 9, "n": 3, "n_logits": 3, "parents": full, "keep": keep}
                f = frame(host, [seg], torch.zeros(1))
                f["x"], f["raw"] = header, raw
                reply = await host.returns.round_trip(f, 3, [])
                h = validate.forward_frame(reply, host.config.hidden_size)
                ((_, logits, _),) = await host.stage.head([(h[0], 3)])
                for row, path in enumerate([[40], [40, 41], [42]]):
                    torch.testing.assert_close(logits[row], want(PX + [30, 33, 34] + path), atol=1e-4, rtol=1e-4)
                # a keep past what the member holds: that conversation alone is left out
                segs = [{"sid": "x", "committed": 9, "n": 1, "n_logits": 1, "parents": [-1, 0], "keep": [40]},
                        {"sid": "z", "committed": 0, "n": 2, "n_logits": 1}]
                reply = await host.returns.round_trip(frame(host, segs, torch.randn(1, 3, host.config.hidden_size)),
                                                      3, [])
                assert [s["sid"] for s in reply["batch"]] == ["z"] and reply["x"]["shape"][1] == 2
                assert "keep" in reply["failed"]["x"] and "\n" not in reply["failed"]["x"]
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_cancel_overtakes_the_frame_it_names(tiny_llama):
    """The first member's compute is held while a real round of conversation x and a frame of conversation y
    queue behind it; the host cancels y's segment. The cancel reaches both members and the host (which ignores
    it) before anything is computed; x's round is exact, y's segment comes back skipped with no rows, both
    members' y columns advanced by its n, and y's next round is exact."""
    want = reference(tiny_llama)

    async def main():
        async with running_ring(tiny_llama, 0, plan=False) as (host, _):
            async with trio.open_nursery() as nursery:
                first, second = await with_members(host, nursery, 2)
                rx, ry = await prefill(host, "x", PX), await prefill(host, "y", PY)
                rx.set_position(len(PX), len(PX) + 1)
                await first.data.compute.acquire()
                got = {}

                async def round_x(sent):
                    got["x"] = (await host.forward(rx, PX + [70], [], sent=sent))[0]

                async def frame_y(sent):
                    f = frame(host, [{"sid": "y", "committed": len(PY), "n": 3, "n_logits": 1}],
                              torch.randn(1, 3, host.config.hidden_size))
                    got["y seq"] = f
                    got["y"] = await host.returns.round_trip(f, 3, [sent])

                for task in (round_x, frame_y):
                    sent = trio.Event()
                    nursery.start_soon(task, sent)
                    await sent.wait()
                seq = got["y seq"]["seq"]
                with trio.fail_after(10):
                    while first.data.unfinished < 2:  # both read: x's waits for the compute, y's behind it
                        await trio.sleep(0.01)
                await host.first_hop.send({"t": "cancel", "epoch": host.epoch, "segments": [["y", seq]]})
                with trio.fail_after(10):
                    while ("y", seq) not in second.data.cancelled:
                        await trio.sleep(0.01)
                assert ("y", seq) in first.data.cancelled and "x" not in got
                first.data.compute.release()
                with trio.fail_after(30):
                    while "y" not in got or "x" not in got:
                        await trio.sleep(0.01)
                torch.testing.assert_close(got["x"][-1], want(PX + [70]), atol=1e-4, rtol=1e-4)
                reply = got["y"]
                assert reply["batch"][0]["skip"] is True and reply["x"]["shape"][1] == 0
                assert validate.bounds(validate.segments(reply, 0)) == [(0, 0)]
                assert [p.data.sessions["y"].length for p in (first, second)] == [len(PY) + 3] * 2
                ry.set_position(len(PY), len(PY) + 1)
                logits, _ = await host.forward(ry, PY + [71], [])
                torch.testing.assert_close(logits[-1], want(PY + [71]), atol=1e-4, rtol=1e-4)
                nursery.cancel_scope.cancel()

    trio.run(main)
