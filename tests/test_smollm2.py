"""End to end on the real SmolLM2-135M-Instruct (pulled once from PyPI, cached): rings of real processes."""
import pytest

from helpers import ROOT, ask_json, assert_covers, reference_ids

pytestmark = pytest.mark.slow  # every test here runs the real SmolLM2

PROMPT = "Explain quantum entanglement in simple terms."
N = 40
DRAFT = str(ROOT / "peers" / "drafting" / "shipped" / "smollm2-135m")


@pytest.fixture(scope="module")
def want(smollm2):
    return reference_ids(smollm2, PROMPT, N)


def test_ring_of_two_peers_equals_transformers(want):
    got = ask_json(PROMPT, "--local-peers", "2", "--temperature", "0", "--max-new-tokens", str(N), "--draft", "none")
    assert got["token_ids"] == want
    members = got["stats"]["members"]
    assert members[0]["name"] == "host" and sorted(m["name"] for m in members[1:]) == ["local-a", "local-b"], members
    assert all(m["state"] == "ready" and m["layers"] not in ("", "none") for m in members), members
    assert_covers(members, 30)  # SmolLM2's 30 layers, each held once
    assert got["stats"]["tokens_per_round"] == 1.0


@pytest.mark.parametrize("draft", ["ngram", "smollm2-135m"])
def test_drafters_do_not_change_the_answer(want, draft):
    got = ask_json(PROMPT, "--local-peers", "1", "--max-new-tokens", str(N), "--draft", draft)
    assert got["token_ids"] == want


def test_self_draft_at_k6_commits_about_seven_tokens_a_round(want):
    got = ask_json(PROMPT, "--local-peers", "1", "--max-new-tokens", str(N), "--draft", "smollm2-135m", "--k", "6")
    assert got["token_ids"] == want
    s = got["stats"]
    # a draft identical to the target agrees everywhere: anything under ~7 means verification or rollback
    # lost tokens (the last round may be shorter, cut by max-new-tokens)
    assert s["acceptance"] >= 0.97, s
    assert s["tokens_per_round"] >= 6.0, s


def test_the_distilled_draft_is_the_default_and_only_changes_speed(want):
    """The draft distilled for SmolLM2 and shipped in peers/drafting/shipped/smollm2-135m (reading the target's features)
    is used with no --draft: through a ring of two real peers, greedy, the answer is plain transformers', and
    some of its drafts are accepted."""
    got = ask_json(PROMPT, "--local-peers", "2", "--max-new-tokens", str(N))
    assert got["token_ids"] == want
    assert got["stats"]["drafter"] == "smollm2-135m-draft"
    assert got["stats"]["accepted"] > 0 and got["stats"]["tokens_per_round"] > 1.0, got["stats"]


def test_the_distilled_draft_samples_too():
    """Sampling with it: drafts drawn from its q are accepted (verification keeps the target's distribution;
    tests/test_lossless.py checks that rule statistically)."""
    got = ask_json(PROMPT, "--local-peers", "1", "--max-new-tokens", "32", "--temperature", "0.7", "--seed", "11",
                   "--draft", DRAFT)
    s = got["stats"]
    assert s["tokens"] == 32 and s["accepted"] > 0, s
