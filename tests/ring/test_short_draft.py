"""A draft model whose context is shorter than the target's: past its own context it stops drafting, and the
answer goes on exactly as with no draft (chains, trees, rounds in flight), instead of failing on the draft's
cache."""
from __future__ import annotations

import pytest
import trio

from helpers import new_chat, running_ring
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import make_drafter
from peers.speculation.sampling import SamplingParams
from tiny import CORPUS, make_model

DRAFT_CONTEXT = 512
NEW = 48
# "long": all of it past the draft's context (and past the room its arena keeps beyond that); "crossing": the
# answer crosses it
PROMPTS = {"long": 1500, "crossing": DRAFT_CONTEXT - 40}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A target of 2,048 positions and a draft of the same weights that keeps 512 (it agrees with the target
    wherever it drafts)."""
    root = tmp_path_factory.mktemp("short-draft")
    target = make_model(root / "target", "llama", layers=2, max_position_embeddings=2048)
    draft = make_model(root / "draft", "llama", layers=2, max_position_embeddings=DRAFT_CONTEXT)
    return target, draft


def _prompt(tokens: int, tok) -> str:
    """A prompt of about `tokens` tokens."""
    words, text = " ".join(CORPUS).split(), ""
    while len(tok.encode(text)) < tokens:
        text += words[len(text.split())] + " "
    return text


def _answers(target, spec: str, policy: dict) -> dict:
    """Each of PROMPTS answered greedily through a host and two peer processes, drafted by `spec` under
    KPolicy(**policy): {prompt: (the answer's ids, the conversation's length, the tokens drafted, most rounds in flight)}."""
    async def main():
        out = {}
        async with running_ring(target, 2) as (host, _):
            for name, n in PROMPTS.items():
                chat = new_chat(host)
                drafter = make_drafter(spec, host.model_dir, host.config.vocab_size, chat.tokenizer)
                _, r = await chat.reply(_prompt(n, chat.tokenizer), drafter=drafter, params=SamplingParams(),
                                        policy=KPolicy(**policy), max_new_tokens=NEW)
                out[name] = r.token_ids, len(chat.tokens), r.stats.drafted, max(x["in_flight"] for x in r.rounds)
        return out

    return trio.run(main)


@pytest.fixture(scope="module")
def plain(models):
    """The answers with no draft."""
    got = _answers(models[0], "none", dict(in_flight=1))
    for name, (ids, length, _, _) in got.items():
        assert len(ids) == NEW and length > DRAFT_CONTEXT, (name, length)  # (whole answers, past the draft's context)
    return got


@pytest.mark.parametrize("path", [dict(trees=False, pinned=3, in_flight=1), dict(tree_nodes=4, in_flight=1),
                                  dict(tree_nodes=3, in_flight=3)], ids=["chain", "tree", "in-flight"])
def test_a_conversation_longer_than_the_drafts_context_answers_as_with_no_draft(models, plain, path):
    target, draft = models
    got = _answers(target, str(draft), path)
    for name in PROMPTS:
        assert got[name][0] == plain[name][0], name
    assert got["crossing"][2] > 0  # it drafted while the conversation fit its context
    assert got["long"][2] == 0  # and not past it
    if path["in_flight"] > 1:
        assert got["crossing"][3] > 1  # (rounds really flew, drafted by it)
