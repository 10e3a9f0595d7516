"""A data link that breaks between two members is told to the host by the members at its ends: the host fails the
passes of that plan at once and re-wires the ring (everyone alive: the same spans, nothing reloaded), so the answer
goes on within seconds, not at the 60-s pass timeout, and stays exact. The members are real processes whose links
all go through a relay in this process, which cuts the one between them."""
import time
from functools import partial

import trio

from helpers import new_chat, reference_ids, running_ring
from peers.links import dial as links
from peers.links.relay import Relay
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams

PROMPT = "the quick brown fox jumps over the lazy dog"
N = 30


async def answer_with_a_cut(model, cut, at_round=4, fresh=False):
    """The answer, the ring's spans before and after, and seconds from the cut to the next round (at_round 0: the
    cut comes right after a re-plan, before the answer starts; `fresh`: peers started with this environment)."""
    async with trio.open_nursery() as outer:
        relay = Relay()
        addr = await outer.start(relay.serve, "127.0.0.1:0")
        async with running_ring(model, 2, relay=addr, heartbeat_s=0.5, dead_after_s=3.0, fresh=fresh) as (host, _):
            spans = [(m.name, str(m.span)) for m in host.ring]
            rounds, cut_at, back = 0, None, None

            def on_round(ev):
                nonlocal rounds, cut_at, back
                if ev["event"] != "round":
                    return
                rounds += 1
                if cut_at is not None and back is None:
                    back = time.monotonic() - cut_at
                if rounds == at_round:
                    assert cut(relay, host) == 1, "no such link to cut"
                    cut_at = time.monotonic()

            if at_round == 0:
                await host.replan()
                spans = [(m.name, str(m.span)) for m in host.ring]
                assert cut(relay, host) == 1, "no such link to cut"
                cut_at = time.monotonic()
            _, r = await new_chat(host).reply(PROMPT, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                              max_new_tokens=N, on_round=on_round)
            after = [(m.name, str(m.span)) for m in host.ring]
        outer.cancel_scope.cancel()
    return r.token_ids, spans, after, back


def between_members(relay, host):
    return relay.cut(links.parse_relay(host.ring[1].data_addr)[1])


def blackholed_between_members(relay, host):
    """Open and silent, as a cut cable or a machine asleep: no FIN, no RST, nothing."""
    return relay.cut(links.parse_relay(host.ring[1].data_addr)[1], hole=True)


def blackholed_to_the_first_member(relay, host):
    return relay.cut(links.parse_relay(host.ring[0].data_addr)[1], hole=True)


def test_a_link_closed_between_members_is_rewired_at_once(tiny_llama):
    ids, spans, after, back = trio.run(answer_with_a_cut, tiny_llama, between_members)
    assert ids == reference_ids(tiny_llama, PROMPT, N)
    assert after == spans, "everyone was alive: the same spans"
    assert back is not None and back < 5, f"the first pass after the cut came back in {back} s"


def test_a_link_closed_right_after_a_replan_costs_no_pass_timeout(tiny_llama):
    """The 93-s stall of the soak (docs/reliability.md): a link of a new plan closed before it carried anything.
    The host, every control link healthy, sent the next pass into it; the member wrote it into a socket whose
    other end was gone, and the pass waited out its whole timeout (60 s + 0.5 s a position)."""
    ids, spans, after, back = trio.run(answer_with_a_cut, tiny_llama, between_members, 0)
    assert ids == reference_ids(tiny_llama, PROMPT, N)
    assert after == spans
    assert back is not None and back < 5, f"the first pass after the cut came back in {back} s"


def test_a_blackholed_link_is_found_dead_by_its_silence_and_rewired(tiny_llama):
    """A link that goes silent without a FIN (its writer's keepalives stop arriving) is dead to its reader after
    2.5 s (peers/links/liveness.py): the member at its end tells the host, which re-wires; the frame that went
    into it is not waited for until the 60-s pass timeout."""
    for cut in (blackholed_between_members, blackholed_to_the_first_member):
        ids, spans, after, back = trio.run(answer_with_a_cut, tiny_llama, cut)
        assert ids == reference_ids(tiny_llama, PROMPT, N)
        assert after == spans, "everyone was alive: the same spans"
        assert back is not None and back < 6, f"{cut.__name__}: the first pass after the cut came back in {back} s"


def test_a_blackholed_link_between_running_ends_is_judged_dead_by_the_host_in_seconds(tiny_llama, monkeypatch, caplog):
    """Silence cannot tell a cut link from a stopped writer, so a reader's own limit stays long (set to 30 s here);
    but its member says after 1.5 s, and the host, which hears the writer (itself, or the member before) answer
    its pings meanwhile, takes that for the link's death and re-wires (peers/links/liveness.py)."""
    monkeypatch.setenv("SFCHAT_LINK_SILENT_S", "30")
    for cut in (blackholed_between_members, blackholed_to_the_first_member):
        caplog.clear()
        ids, spans, after, back = trio.run(partial(answer_with_a_cut, fresh=True), tiny_llama, cut)
        assert ids == reference_ids(tiny_llama, PROMPT, N)
        assert after == spans, "everyone was alive: the same spans"
        judged = [r.getMessage() for r in caplog.records if "link has been silent for" in r.getMessage()]
        assert judged, f"{cut.__name__}: not judged by the host (back after {back} s)"
        assert back is not None and back < 6, f"{cut.__name__}: the first pass after the cut came back in {back} s"
