"""What the target's distribution gives a request through the real `openai` client, against `sfchat serve` with two
peer processes, a draft near the target (its guesses accepted about half the time) in trees and rounds in flight:
logprobs equal to plain transformers' at every position, and seeded answers that repeat whatever the server did
before, with or without drafts, on another ring."""
from __future__ import annotations

import math

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from serving import Server, client, user

N = 16


@pytest.fixture(scope="module")
def draft(tiny_llama, tmp_path_factory):
    """The target's weights with a little noise: it guesses the target's token about half the time, so answers come
    through accepted drafts (a random draft's are all rejected, and rows after accepted nodes went untested)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * p.std() * 0.01)
    path = tmp_path_factory.mktemp("noisy-draft")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_llama).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(tiny_llama, draft, tmp_path_factory):
    s = Server(tiny_llama, tmp_path_factory.mktemp("serve") / "serve.log", "--draft", str(draft), "--in-flight", "3",
               "--max-conversations", "4", peers=2)
    s.wait_until(lambda h: sum(m["layers"] not in ("", "none") for m in h["members"]) == 3, what="a ring of three")
    yield s
    s.close()


def reference_check(model_dir, prompt: str, entries, top: int) -> None:
    """Walk the answer's tokens with plain transformers: each entry's logprob is log_softmax of the model's logits at
    its position (the raw distribution, whatever the temperature), and its top_logprobs are the `top` largest."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = list(tok.apply_chat_template(user(prompt), add_generation_prompt=True, tokenize=True, return_dict=True)
               ["input_ids"])
    by_text: dict[str, list[int]] = {}
    for i in range(len(tok)):
        by_text.setdefault(tok.decode([i]), []).append(i)
    assert entries
    for e in entries:
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
        match = [i for i in by_text[e.token] if math.isclose(lp[i].item(), e.logprob, abs_tol=1e-4)]
        assert match, (e.token, e.logprob, [lp[i].item() for i in by_text[e.token]])
        want = lp.topk(top).values.tolist() if top else []
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(want, abs=1e-4)
        for t in e.top_logprobs:
            assert any(math.isclose(lp[i].item(), t.logprob, abs_tol=1e-4) for i in by_text[t.token])
        ids.append(match[0])


@pytest.mark.parametrize("temperature, seed", [(0, None), (0.7, 11)])
def test_logprobs_whole_and_streamed_equal_transformers(server, tiny_llama, temperature, seed):
    c, prompt = client(server), "the quick brown fox"
    kw = dict(model=server.model, messages=user(prompt), max_tokens=N, temperature=temperature, seed=seed,
              logprobs=True, top_logprobs=5)
    r = c.chat.completions.create(**kw)
    entries = r.choices[0].logprobs.content
    assert r.model_extra["sfchat"]["accepted"] > 0  # tokens came through accepted drafts
    assert "".join(e.token for e in entries) == r.choices[0].message.content
    assert all(e.bytes == list(e.token.encode()) and len(e.top_logprobs) == 5 for e in entries)
    reference_check(tiny_llama, prompt, entries, 5)
    chunks = list(c.chat.completions.create(**kw, stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    if seed is not None or temperature == 0:  # the same answer: the same entries, streamed as whole
        assert [e.token for e in streamed] == [e.token for e in entries]
        assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-5)
    plain = c.chat.completions.create(model=server.model, messages=user(prompt), max_tokens=N, temperature=0)
    assert plain.choices[0].logprobs is None
    only = c.chat.completions.create(**(kw | dict(top_logprobs=0)))
    assert all(e.top_logprobs == [] for e in only.choices[0].logprobs.content)


def test_top_logprobs_past_20_or_without_logprobs_is_a_400(server):
    c = client(server)
    for kw in (dict(logprobs=True, top_logprobs=21), dict(top_logprobs=2), dict(logprobs="yes")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=server.model, messages=user("hi"), max_tokens=2, **kw)
        assert e.value.body["param"] in ("top_logprobs", "logprobs")


def seeded(server, prompt="the ring", **kw) -> str:
    r = client(server).chat.completions.create(model=server.model, messages=user(prompt), max_tokens=N,
                                               temperature=1.0, seed=42, **kw)
    return r.choices[0].message.content


def test_a_seeded_request_repeats_whatever_came_before_and_on_another_ring(server, tiny_llama, tmp_path):
    c, answers = client(server), []
    for i in range(10):
        answers.append(seeded(server))
        # in between: other requests, which move the draft's policy and leave other conversations' state behind
        c.chat.completions.create(model=server.model, messages=user(f"other {i}"), max_tokens=i + 2,
                                  temperature=1.0, seed=i)
    assert len(set(answers)) == 1, answers
    alone = Server(tiny_llama, tmp_path / "alone.log", "--draft", "none")  # no draft, a ring of one
    try:
        assert seeded(alone) == answers[0]
    finally:
        alone.close()
