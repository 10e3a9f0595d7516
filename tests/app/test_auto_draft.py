"""`--draft auto` on a hub model drafts with its family's smallest sibling (peers/speculation/drafting/siblings.py), fetched
like the target from the hub stand-in, where tiny models of one tokenizer are published under the real names; a
sibling that cannot be had leaves ngram, with one line saying why and how to choose."""
import json

import pytest

from helpers import reference_ids
from hubstub import HubStub
from peers.speculation.drafting.siblings import sibling_draft
from test_hub import env_for, run
from tiny import make_model

TARGET, DRAFT = "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"
PROMPT = "hello world, the quick brown fox"


def test_the_table_names_each_familys_sibling():
    assert sibling_draft(TARGET) == DRAFT and sibling_draft("qwen/qwen2.5-coder-32b-instruct") == DRAFT
    assert sibling_draft("Qwen/Qwen3-8B") == "Qwen/Qwen3-0.6B"
    assert sibling_draft("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.2-1B-Instruct"
    assert sibling_draft("google/gemma-2-9b-it") == "google/gemma-2-2b-it"
    assert sibling_draft(DRAFT) is None and sibling_draft("acme/tiny") is None and sibling_draft(None) is None


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("pair")
    return make_model(base / "target", "qwen2", layers=4, seed=5), make_model(base / "draft", "qwen2", layers=2, seed=6)


def ask(env) -> tuple[dict, str]:
    p = run(["ask", PROMPT, "--json", "--model", TARGET, "--max-new-tokens", "12"], env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_a_hub_model_drafts_with_its_sibling_and_answers_as_it_alone_would(pair, tmp_path):
    target, draft = pair
    want = reference_ids(target, PROMPT, 12)
    with HubStub({TARGET: target, DRAFT: draft}) as hub:
        out, _ = ask(env_for(tmp_path / "both", hub))
        assert any(f.endswith(".safetensors") for m, f, _ in hub.requests if m == "GET") and \
            f"api/{DRAFT}" in [f for _, f, _ in hub.requests]
    assert out["stats"]["drafter"] == DRAFT and out["token_ids"] == want
    assert out["stats"]["drafted"] > 0
    with HubStub({TARGET: target}) as hub:  # the sibling is not there: prompt lookup, and why
        out, err = ask(env_for(tmp_path / "alone", hub))
    assert out["stats"]["drafter"] == "ngram" and out["token_ids"] == want
    said = [ln for ln in err.splitlines() if ln.startswith("draft: ngram")]
    assert len(said) == 1 and DRAFT in said[0] and "--draft" in said[0], err[-2000:]
