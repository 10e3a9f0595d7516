"""The relay: named endpoints spliced over real sockets on 127.0.0.1, bounded buffers, and link shaping."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import torch
import trio
from transformers import AutoModelForCausalLM

from peers.links import dial as links
from peers.links.auth import AuthError, client_handshake
from peers.links.channel import Channel, parse_addr
from helpers import ROOT, check_logits_follow, child_env, running_ring, wait_for_line
from peers.links.relay import Relay
from sfchat.invite import for_host


@contextmanager
def relay_process(*flags: str, log):
    """A real `sfchat relay` process on a free port, its output in `log`; yields (HOST:PORT, process)."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sfchat", "relay", "--listen", "127.0.0.1:0", *flags],
                                stdout=out, stderr=out, cwd=ROOT, env=child_env())
    try:
        yield wait_for_line(log, r"relay listening on (\S+)", proc)[1], proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def echo(stream) -> None:
    while data := await stream.receive_some(65536):
        await stream.send_all(data)


# above a median of many trips: a relay on a loaded machine adds milliseconds of its own, never takes any off
# (on two cores shared with other test runs it added about 10)
SLACK_MS = 20


async def round_trips(stream, n: int, size: int = 64) -> list[float]:
    """Milliseconds of n ping-pongs of `size` bytes."""
    out = []
    for i in range(n):
        msg = bytes([i % 256]) * size
        t0 = time.perf_counter()
        await stream.send_all(msg)
        got = b""
        while len(got) < size:
            got += await stream.receive_some(size - len(got))
        out.append((time.perf_counter() - t0) * 1e3)
        assert got == msg
    return out


def rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_addresses():
    assert links.parse_relay("relay://10.0.0.1:7341/abc/host") == ("10.0.0.1:7341", "abc/host")
    assert links.host_return("relay://r:1/abc/host", 7340) == "relay://r:1/abc/host"
    assert links.host_return("192.168.1.2:7340", 9999) == "192.168.1.2:9999"
    assert links.member_endpoint("relay://r:1/abc/host", "my peer!").startswith("abc/my-peer--")
    assert links.relay_of("relay://r:1/abc/host", None) == "r:1" and links.relay_of("h:1", None) is None
    with pytest.raises(ValueError):
        links.parse_relay("relay://r:1")


def test_splice_names_and_misbehaving_clients():
    """Bytes arrive intact both ways; unknown, taken and vanished names fail cleanly; junk never hurts the relay."""

    async def main():
        async with trio.open_nursery() as nursery:
            relay = Relay()
            addr = await nursery.start(relay.serve, "127.0.0.1:0")
            scope = trio.CancelScope()

            async def endpoint(task_status=trio.TASK_STATUS_IGNORED):
                with scope:
                    await links.serve(echo, None, addr, "ring1/echo", task_status=task_status)

            got = await nursery.start(endpoint)
            assert got.relay_address == f"relay://{addr}/ring1/echo" and got.port == 0
            stream = await links.dial(got.relay_address)
            blob = os.urandom(1 << 20)
            async with trio.open_nursery() as n:
                n.start_soon(stream.send_all, blob)
                back = b""
                while len(back) < len(blob):
                    back += await stream.receive_some(1 << 16)
            assert back == blob

            with pytest.raises(links.LinkError, match="no endpoint"):
                await links.dial(f"relay://{addr}/ring1/nobody")
            with pytest.RaisesGroup(pytest.RaisesExc(links.LinkError, match="taken"), flatten_subgroups=True):
                await links.serve(echo, None, addr, "ring1/echo")
            # junk: raw garbage, a frame of the wrong kind, a hang-up mid-request, a huge frame, a bogus accept
            for junk in (b"\xff" * 64, b"\x00\x00\x00\x05\xa1atbad", b"\x00\x00", b"\x03\xff\xff\xff" + b"z" * 4096):
                s = await trio.open_tcp_stream(*parse_addr(addr))
                await s.send_all(junk)
                await s.aclose()
            ch = Channel(await trio.open_tcp_stream(*parse_addr(addr)))
            await ch.send({"t": "accept", "id": "0123456789abcdef"})
            assert (await ch.recv())["t"] == "error"
            # the spliced connection still works
            assert len(await round_trips(stream, 3)) == 3
            # the endpoint vanishes: its name is free again, dialing it fails
            scope.cancel()
            await stream.aclose()
            with trio.fail_after(5):
                while "ring1/echo" in relay.endpoints:
                    await trio.sleep(0.02)
            with pytest.raises(links.LinkError):
                await links.dial(got.relay_address)
            again = await nursery.start(links.serve, echo, None, addr, "ring1/echo")
            s2 = await links.dial(again.relay_address)
            assert len(await round_trips(s2, 2)) == 2
            await s2.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize("shaping", [[], ["--delay-ms", "2", "--rate-mbit", "2000"]], ids=["plain", "shaped"])
def test_backpressure_bounds_memory(shaping, tmp_path):
    """A receiver that stops reading stops the sender; the relay's memory stays flat; nothing is lost."""
    with relay_process(*shaping, log=tmp_path / "relay.log") as (addr, proc):
        async def main():
            reading, finished = trio.Event(), trio.Event()
            sent, received = [0], [0]

            async def slow(stream):
                await reading.wait()
                while data := await stream.receive_some(1 << 16):
                    received[0] += len(data)
                finished.set()

            async def sender(stream):
                chunk = b"x" * (1 << 16)
                while sent[0] < (256 << 20) and not reading.is_set():  # an unbounded relay would take it all
                    await stream.send_all(chunk)
                    sent[0] += len(chunk)
                for _ in range(128):  # then 8 MiB more once the receiver reads again
                    await stream.send_all(chunk)
                    sent[0] += len(chunk)
                await stream.send_eof()

            async with trio.open_nursery() as nursery:
                got = await nursery.start(links.serve, slow, None, addr, "bp/sink")
                stream = await links.dial(got.relay_address)
                rss0 = rss_kb(proc.pid)
                nursery.start_soon(sender, stream)
                last = -1
                while sent[0] != last:  # wait until the sender has been stuck for a second
                    last = sent[0]
                    await trio.sleep(1)
                grown = rss_kb(proc.pid) - rss0
                print(f"sender blocked after {sent[0] / 2**20:.1f} MiB; relay RSS grew by {grown / 1024:.1f} MiB")
                assert sent[0] < 96 << 20  # kernel socket buffers on both legs, plus the relay's bounded queue
                assert grown < 16 << 10
                reading.set()
                with trio.fail_after(20):
                    await finished.wait()
                assert received[0] == sent[0]
                nursery.cancel_scope.cancel()

        trio.run(main)


@pytest.mark.serial  # times round trips
def test_shaping_adds_the_asked_delay(tmp_path):
    """--delay-ms 25 adds 50 ms to a round trip: no trip is quicker, and the median trip is about that much
    slower than a direct one; with jitter each trip is still no quicker than the band's low end, and the median
    is the middle of the band. (Upper bounds are on medians, with slack for a busy machine.)"""
    with relay_process("--delay-ms", "25", log=tmp_path / "relay.log") as (addr, _):
        async def main():
            async with trio.open_nursery() as nursery:
                got = await nursery.start(links.serve, echo, "127.0.0.1:0", addr, "shape/echo")
                direct = await links.dial(f"127.0.0.1:{got.port}")
                relayed = await links.dial(got.relay_address)
                await round_trips(relayed, 2)
                d, r = await round_trips(direct, 20), await round_trips(relayed, 20)
                added = statistics.median(r) - statistics.median(d)
                print(f"direct {statistics.median(d):.2f} ms, relayed {statistics.median(r):.2f} ms: +{added:.2f} ms")
                assert min(r) >= 50 and 49.5 <= added <= 50 + SLACK_MS
                nursery.cancel_scope.cancel()

        trio.run(main)
    with relay_process("--delay-ms", "20", "--jitter-ms", "10", log=tmp_path / "jitter.log") as (addr, _):
        async def jittered():
            async with trio.open_nursery() as nursery:
                got = await nursery.start(links.serve, echo, "127.0.0.1:0", addr, "shape/jitter")
                direct = await links.dial(f"127.0.0.1:{got.port}")
                relayed = await links.dial(got.relay_address)
                d, r = await round_trips(direct, 20), await round_trips(relayed, 30)  # every byte back in order
                added = statistics.median(r) - statistics.median(d)
                print(f"jittered round trips: min {min(r):.1f}, median {statistics.median(r):.1f}, max {max(r):.1f} ms")
                # each way 20 ± 10 ms: a round trip 40 ± 20, its median near 40 (two uniform draws, 30 trips)
                assert min(r) >= 20 and 35 <= added <= 40 + SLACK_MS and statistics.pstdev(r) > 2
                nursery.cancel_scope.cancel()

        trio.run(jittered)


def test_shaping_caps_the_rate(tmp_path):
    """--rate-mbit 16 (2 MB/s): 1 MiB one way takes at least ~0.5 s, and arrives intact."""
    with relay_process("--rate-mbit", "16", log=tmp_path / "relay.log") as (addr, _):
        async def main():
            done, blob = trio.Event(), os.urandom(1 << 20)
            got_bytes = bytearray()

            async def sink(stream):
                while len(got_bytes) < len(blob) and (data := await stream.receive_some(1 << 16)):
                    got_bytes.extend(data)
                done.set()

            async with trio.open_nursery() as nursery:
                got = await nursery.start(links.serve, sink, None, addr, "rate/sink")
                stream = await links.dial(got.relay_address)
                t0 = time.perf_counter()
                await stream.send_all(blob)
                await done.wait()
                seconds = time.perf_counter() - t0
                print(f"1 MiB at a 16 Mbit/s cap: {seconds:.3f} s = {len(blob) * 8 / seconds / 1e6:.1f} Mbit/s")
                assert bytes(got_bytes) == blob
                assert seconds >= 0.9 * len(blob) / 2e6
                nursery.cancel_scope.cancel()

        trio.run(main)


def test_ring_through_relay(tiny_llama, tmp_path):
    """Host and two peer processes meet only through a relay process; logits equal plain transformers'.
    The relay never sees the token, and a dialer without it is refused end to end."""
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    with relay_process(log=tmp_path / "relay.log") as (addr, proc):
        async def main():
            async with running_ring(tiny_llama, 2, relay=addr) as (host, _):
                invite = for_host(host).command
                assert f" join relay://{addr}/" in invite and invite.endswith(f"--token {host.token}")
                assert len(host.ring) == 2 and all(m.data_addr.startswith(f"relay://{addr}/") for m in host.ring)
                await check_logits_follow(host, ref, [5, 17, 42, 99, 7], 4)
                intruder = Channel(await links.dial(host.relay_address))
                with pytest.raises(AuthError):
                    await client_handshake(intruder, "not-the-token", "join")
            return host.token

        token = trio.run(main)
        proc.terminate()
        proc.wait(timeout=10)
        log = (tmp_path / "relay.log").read_text()
    assert "registered" in log and "connected" in log and token not in log
