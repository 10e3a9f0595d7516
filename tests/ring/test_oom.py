"""Out of memory is named: a member whose allocator fails (SFCHAT_TEST_OOM has it ask for a pebibyte, so the real
allocation error takes the real path) is reported by name with its numbers, and the ring re-plans without it, or
stops with that line when the rest cannot hold the model."""
import re

import trio

from helpers import new_chat, reference_ids, running_ring
from peers.models import checkpoint
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.base.errors import FitError
from peers.plan.layers import ModelSize, Offer, host_bytes, layer_bytes, pass_bytes
from peers.speculation.sampling import SamplingParams

OOM = r"member \d \(local-b\) ran out of memory on cpu {doing} \([\d.]+ [MG]B in use, peak [\d.]+ [MG]B, [\d.]+ [MG]B free\)"


def test_out_of_memory_in_a_pass_replans_without_the_member(tiny_llama, monkeypatch):
    monkeypatch.setenv("SFCHAT_TEST_OOM", "local-b:pass")
    prompt = "hello world, the quick brown fox"

    async def main():
        async with running_ring(tiny_llama, 2) as (host, _):
            assert len(host.ring) == 2
            chat, events = new_chat(host), []
            _, r = await chat.reply(prompt, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                    max_new_tokens=12, on_round=events.append)
            return r.token_ids, events, [(m.name, m.state, m.error) for m in host.members], host.ring

    ids, events, members, ring = trio.run(main)
    errors = [e["error"] for e in events if e.get("event") == "recovering"]
    assert errors and re.fullmatch(OOM.format(doing=r"in a pass of \d+ positions"), errors[0]), errors
    (local_b,) = [m for m in members if m[0] == "local-b"]
    assert local_b[1] == "failed" and "ran out of memory" in local_b[2]
    assert [m.name for m in ring] == ["local-a"]
    assert ids == reference_ids(tiny_llama, prompt, 12)  # the answer, exact, from the ring without it


def test_out_of_memory_loading_when_the_rest_cannot_hold_the_model(tiny_llama, monkeypatch):
    monkeypatch.setenv("SFCHAT_TEST_OOM", "local-b:load")
    m = ModelSize.of(checkpoint.read_config(tiny_llama), checkpoint.tensor_shapes(tiny_llama))
    ctx = m.default_context()
    layer, run = layer_bytes(m, Offer("x", 0), ctx), pass_bytes(m, "float32", ctx)
    # room for 1 layer on the host and 2 on each member: 5 of 4 with both members, 3 without one
    host_gb = (host_bytes(m, "float32") + run + 1.5 * layer) / 2**30
    member_gb = (run + 2.5 * layer) / 2**30

    async def main():
        try:
            async with running_ring(tiny_llama, 2, extra=["--offer-gb", f"{member_gb:.9f}"], offer_gb=host_gb,
                                    conversations=1):
                raise AssertionError("the ring formed")
        except BaseExceptionGroup as group:
            fit, rest = group.split(FitError)
            assert fit is not None and rest is None, group
            while isinstance(fit, BaseExceptionGroup):
                fit = fit.exceptions[0]
            return str(fit)

    msg = trio.run(main)
    assert "\n" not in msg
    head, _, tail = msg.partition("; the rest of the ring ")
    assert re.fullmatch(OOM.format(doing=r"loading layers \d-\d"), head), msg
    assert tail.startswith("needs ") and "(room for 3 layers): add a member" in tail, msg
