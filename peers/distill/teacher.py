"""The target writes the training text, and reads it back to give the draft what it learns from.

Conversations are answered in left-padded batches with transformers' generate (a batch of 128 makes ~340 tok/s on
two CPU cores, one stream ~14). Each finished conversation is then read by the target once more (teacher forcing,
right-padded so positions are plain 0..L-1) to keep its final hidden state at every position: the feature the
draft reads at inference (the host holds it after each ring pass) and the target's next-token distribution at
training time (its LM head over the feature).

A shard of the templated prompt set is three batches: the target writes requests of its own (self_prompt),
answers templated and self-written prompts, then answers a follow-up turn on some of those conversations
(multi-turn context). A shard of the chat set answers plain chat requests, then the follow-ups.
"""
from __future__ import annotations

import random

import torch
from transformers import GenerationConfig

from peers.conversation.chat import render
from peers.distill import chat_prompts, prompts

SELF_PROMPT_TOKENS = 64
READ_BATCH = 16  # conversations per teacher-forcing pass (bounds the attention's memory)


@torch.inference_mode()
def features(model, rows: list[list[int]]) -> list[torch.Tensor]:
    """The target's final (normalised) hidden state at every position of each row: [len(row), hidden] each."""
    out = []
    for i in range(0, len(rows), READ_BATCH):
        chunk = rows[i : i + READ_BATCH]
        width = max(map(len, chunk))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in chunk], device=model.device)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in chunk], device=model.device)
        h = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        out += [h[b, : len(r)].half().cpu() for b, r in enumerate(chunk)]
    return out


@torch.inference_mode()
def answer(model, tok, eos: set[int], convs: list[list[dict]], *, max_new: int, temperature: float,
           seed: int) -> list[dict]:
    """Answer each conversation in one batch. A sample: ids (prompt + answer, eos included), start (where the
    answer begins), feats ([len(ids), hidden] float16: the target's final hidden states), text."""
    rendered = [render(tok, c) for c in convs]
    width = max(map(len, rendered))
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rendered])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rendered])
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {}
    config = GenerationConfig(max_new_tokens=max_new, pad_token_id=pad, eos_token_id=sorted(eos), **sampling)
    torch.manual_seed(seed)  # sampling draws from torch's global generator
    out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                         generation_config=config)
    written = out[:, width:].cpu()
    rows, texts = [], []
    for b, r in enumerate(rendered):
        row = written[b].tolist()
        n = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(r + row[:n])
        texts.append(tok.decode(row[:n], skip_special_tokens=True))
    return [{"ids": torch.tensor(row, dtype=torch.int32), "start": len(r), "feats": f, "text": text}
            for row, r, f, text in zip(rows, rendered, features(model, rows), texts)]


PROMPT_SETS = ("templates", "chat")


def write_shard(model, tok, eos: set[int], *, seed: int, split: str, index: int, batch: int,
                max_new: int, prompt_set: str = "templates") -> list[dict]:
    """Shard `index` of `split` ("train" or "eval"): the same samples for the same arguments, on the same device."""
    rng = random.Random(f"{seed}:{split}:{index}")
    temperature = rng.choice([0.0, 0.0, 0.7])  # mostly greedy (what greedy chats meet), some sampled answers
    base = (seed * 1_000_003 + index * 2 + (split == "eval")) % 2**31

    def ask(convs, n, salt):
        return answer(model, tok, eos, convs, max_new=n, temperature=temperature, seed=base + salt)

    user = lambda text: {"role": "user", "content": text}  # noqa: E731
    if prompt_set == "chat":
        requests, convs = [], [[user(chat_prompts.prompt(rng, split))] for _ in range(batch)]
    else:
        requests = ask([[user(prompts.self_prompt(rng, split))] for _ in range(batch // 2)],
                       min(SELF_PROMPT_TOKENS, max_new), 0)
        written = [prompts.as_prompt(s["text"]) or prompts.prompt(rng, split) for s in requests]
        convs = [[user(prompts.prompt(rng, split))] for _ in range(batch - len(written))] + [[user(w)] for w in written]
        rng.shuffle(convs)
    answers = ask(convs, max_new, 1)
    more = [c + [{"role": "assistant", "content": a["text"]}, user(prompts.follow_up(rng))]
            for c, a in zip(convs[: batch // 2], answers)]
    return requests + answers + ask(more, max_new, 2)
