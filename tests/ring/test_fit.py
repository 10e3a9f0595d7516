"""Fit before loading: a ring that cannot hold the model says so, with numbers, before any member loads."""
import trio

from helpers import running_ring
from peers.base.errors import FitError


def test_too_small_a_ring_says_so_before_loading(tiny_llama, caplog):
    async def main():
        # a tiny layer needs ~0.3 MB (weights and 768 positions of KV), a pass ~6.4 MB: each offers ~7.5 MB
        try:
            async with running_ring(tiny_llama, 1, extra=["--offer-gb", "0.007"], offer_gb=0.007,
                                    conversations=1) as (host, _):
                raise AssertionError(f"the ring formed: {[str(m.span) for m in host.ring]}")
        except BaseExceptionGroup as group:
            fit, rest = group.split(FitError)
            assert fit is not None and rest is None, group
            return str(fit.exceptions[0])

    msg = trio.run(main)
    assert "\n" not in msg and msg.startswith("needs ") and "for 4 layers in float32 at 512 positions" in msg, msg
    assert "members offer 15.0 MB (room for 2 layers): add a member" in msg, msg
    assert "--dtype bfloat16 (needs " in msg, msg
    assert "nf4" not in msg, msg  # (bitsandbytes' quantization is CUDA's: never suggested on a CPU)
    assert not any("assign" in r.getMessage() or "loaded layers" in r.getMessage() for r in caplog.records)


def test_a_host_that_cannot_hold_its_own_part_says_no_joiner_helps(tiny_llama, tmp_path):
    """`--offer-gb` below the host's own part (embedding, head, a pass): the ring stays up refusing prompts, and
    says that no joiner can help, as a joiner would then find out (issue 48: it said one would)."""
    from serving import Server
    s = Server(tiny_llama, tmp_path / "serve.log", "--offer-gb", "0.001")
    try:
        log = s.log.read_text()
    finally:
        s.close()
    line = next(x for x in log.splitlines() if "the host needs " in x)
    assert "it offers 1.1 MB; a joiner cannot help" in line and "--offer-gb" in line, line
    assert "until a machine that can hold the rest joins" not in log and "nf4" not in log, log
