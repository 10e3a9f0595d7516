"""--tls: every ring link encrypted, certificates pinned by fingerprint; a wrong pin is refused."""
import sys

import trio

from helpers import child_env, greedy_reply, quiet_host, reference_ids, running_ring
from sfchat.invite import for_host

PROMPT = "hello world, the quick brown fox"


def test_ring_over_tls_answers_exactly_and_is_encrypted(tiny_llama):
    async def main():
        pin = quiet_host(tiny_llama, tls=True).tls.fingerprint  # the same cert on every start
        async with running_ring(tiny_llama, 2, extra=["--tls", pin], tls=True) as (host, _):
            assert for_host(host).command.endswith(f"--tls {pin}")
            assert isinstance(host.first_hop.stream, trio.SSLStream)
            assert all(m.tls_fingerprint for m in host.ring)
            return await greedy_reply(host, PROMPT, 16)

    assert trio.run(main) == reference_ids(tiny_llama, PROMPT, 16)


def test_wrong_fingerprint_or_plain_joiner_is_refused(tiny_llama):
    async def main():
        out = []
        async with running_ring(tiny_llama, 0, tls=True) as (host, _):
            base = [sys.executable, "-m", "sfchat", "join", host.address, "--token", host.token, "--headless",
                    "--model", str(tiny_llama), "--listen", "127.0.0.1:0"]
            for extra in (["--tls", "00" * 32], []):
                p = await trio.run_process(base + extra, capture_stdout=True, capture_stderr=True, check=False,
                                           env=child_env())
                out.append((p.returncode, p.stderr.decode().strip().splitlines()[-1]))
            assert host.members == []
        return out

    (rc1, err1), (rc2, err2) = trio.run(main)
    assert rc1 != 0 and "fingerprint" in err1
    assert rc2 != 0 and "TLS" in err2


def test_a_cut_fingerprint_or_a_plain_host_is_one_line(tiny_llama):
    """What a paste gets wrong is said in one line: a fingerprint cut short, --tls toward a host without TLS."""
    async def main():
        host = quiet_host(tiny_llama)  # no --tls
        out = []
        async with trio.open_nursery() as nursery:
            await nursery.start(host.serve)
            base = [sys.executable, "-m", "sfchat", "join", host.address, "--token", host.token, "--headless",
                    "--model", str(tiny_llama), "--listen", "127.0.0.1:0", "--tls"]
            for pin in ("ab" * 28, "ab" * 32):
                p = await trio.run_process(base + [pin], capture_stdout=True, capture_stderr=True, check=False,
                                           env=child_env())
                out.append((p.returncode, p.stderr.decode().strip()))
            assert host.members == []
            nursery.cancel_scope.cancel()
        return out

    (rc1, err1), (rc2, err2) = trio.run(main)
    assert (rc1, err1) == (1, "sfchat join: the --tls fingerprint has 56 of 64 characters (cut short when pasted?): "
                              "copy the whole value from the invite")
    assert (rc2, err2) == (1, "sfchat join: the host does not use TLS: drop --tls")


def test_ring_through_a_tls_relay(tiny_llama):
    """`sfchat relay --tls`: every connection to the relay is encrypted and pinned; with the ring's own --tls
    inside, the relay forwards ciphertext of ciphertext. The answer is exact."""
    from peers.links.relay import Relay

    async def main():
        relay = Relay(tls=True)
        async with trio.open_nursery() as nursery:
            addr = await nursery.start(relay.serve, "127.0.0.1:0")
            assert addr.startswith(relay.tls.fingerprint + "@")
            pin = quiet_host(tiny_llama, tls=True).tls.fingerprint
            async with running_ring(tiny_llama, 2, extra=["--tls", pin], tls=True, relay=addr) as (host, _):
                assert f" join relay://{addr}/" in for_host(host).command
                assert all(m.data_addr.startswith(f"relay://{addr}/") for m in host.ring)
                ids = await greedy_reply(host, PROMPT, 16)
            nursery.cancel_scope.cancel()
        return ids

    assert trio.run(main) == reference_ids(tiny_llama, PROMPT, 16)
