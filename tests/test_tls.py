"""--tls: every ring link encrypted, certificates pinned by fingerprint; a wrong pin is refused."""
import os
import sys

import trio

from helpers import ROOT, reference_ids, sfchat
from peers.adaptive import KPolicy
from peers.chat import Chat, eos_ids, load_tokenizer
from peers.drafters import Drafter
from peers.host import Host
from peers.sampling import SamplingParams
from sfchat.local import LocalPeers

PROMPT = "hello world, the quick brown fox"


def test_ring_over_tls_answers_exactly_and_is_encrypted(tiny_llama):
    async def main():
        host = Host(str(tiny_llama), say=lambda *a: None, tls=True)
        tok = load_tokenizer(host.model_dir)
        async with trio.open_nursery() as nursery:
            await nursery.start(host.serve)
            assert f"--tls {host.tls.fingerprint}" in host.invite()
            with LocalPeers(2, host.address, host.token, model=str(tiny_llama),
                            extra=["--tls", host.tls.fingerprint]):
                await host.wait_members(2, timeout=120)
                await host.replan()
                assert isinstance(host.first_hop.stream, trio.SSLStream)
                assert all(m.tls_fingerprint for m in host.ring)
                chat = Chat(host, tok, eos_ids(host.model_dir, host.config, tok))
                _, r = await chat.reply(PROMPT, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                        max_new_tokens=16)
                await host.close()
            nursery.cancel_scope.cancel()
        return r

    assert trio.run(main).token_ids == reference_ids(tiny_llama, PROMPT, 16)


def test_wrong_fingerprint_or_plain_joiner_is_refused(tiny_llama):
    async def main():
        host = Host(str(tiny_llama), say=lambda *a: None, tls=True)
        out = []
        async with trio.open_nursery() as nursery:
            await nursery.start(host.serve)
            base = [sys.executable, "-m", "sfchat", "join", host.address, "--token", host.token, "--headless",
                    "--model", str(tiny_llama), "--listen", "127.0.0.1:0"]
            for extra in (["--tls", "00" * 32], []):
                p = await trio.run_process(base + extra, capture_stdout=True, capture_stderr=True, check=False,
                                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
                out.append((p.returncode, p.stderr.decode().strip().splitlines()[-1]))
            assert host.members == []
            nursery.cancel_scope.cancel()
        return out

    (rc1, err1), (rc2, err2) = trio.run(main)
    assert rc1 != 0 and "fingerprint" in err1
    assert rc2 != 0 and "TLS" in err2
