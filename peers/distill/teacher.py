"""The target writes the training text. Conversations are answered in left-padded batches with transformers'
generate (one stream on a CPU makes ~14 tok/s; a batch of 32 several times that), and at every position the
target writes we keep its top-k next-token probabilities: the soft labels the draft learns from.

A shard is three batches: the target writes requests of its own (self_prompt), answers templated and
self-written prompts, then answers a follow-up turn on some of those conversations (multi-turn context).
"""
from __future__ import annotations

import random

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from ..chat import render
from . import prompts

SELF_PROMPT_TOKENS = 64


class TopK(LogitsProcessor):
    """Records the top-k of the target's raw distribution at each step, then applies the temperature. It is the
    only processor generate runs (top-k 0, top-p 1, temperature 1 there), so what it records is the target's p."""

    def __init__(self, k: int, temperature: float):
        self.k, self.temperature = k, temperature
        self.ids: list[torch.Tensor] = []
        self.probs: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        p, i = torch.softmax(scores.float(), -1).topk(self.k, dim=-1)
        self.ids.append(i.cpu())
        self.probs.append(p.cpu())
        return scores / self.temperature if self.temperature > 0 else scores


@torch.inference_mode()
def answer(model, tok, eos: set[int], convs: list[list[dict]], *, max_new: int, temperature: float, k: int,
           seed: int) -> list[dict]:
    """Answer each conversation in one batch. A sample: ids (prompt + answer, eos included), start (where the
    answer begins), topk_ids / topk_p ([len(answer), k]: the target's p at each answer position), text."""
    rendered = [render(tok, c) for c in convs]
    width = max(map(len, rendered))
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rendered])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rendered])
    rec = TopK(k, temperature)
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if temperature > 0 else {}
    config = GenerationConfig(max_new_tokens=max_new, pad_token_id=pad, eos_token_id=sorted(eos), **sampling)
    torch.manual_seed(seed)  # sampling draws from torch's global generator
    device = model.device
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config,
                         logits_processor=LogitsProcessorList([rec]))
    written = out[:, width:].cpu()
    top_ids, top_p = torch.stack(rec.ids, 1), torch.stack(rec.probs, 1)
    samples = []
    for b, r in enumerate(rendered):
        row = written[b].tolist()
        n = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        samples.append({"ids": torch.tensor(r + row[:n], dtype=torch.int32), "start": len(r),
                        "topk_ids": top_ids[b, :n].to(torch.int32), "topk_p": top_p[b, :n].half(),
                        "text": tok.decode(row[:n], skip_special_tokens=True)})
    return samples


def write_shard(model, tok, eos: set[int], *, seed: int, split: str, index: int, batch: int, max_new: int,
                k: int) -> list[dict]:
    """Shard `index` of `split` ("train" or "eval"): the same samples for the same arguments, on the same device."""
    rng = random.Random(f"{seed}:{split}:{index}")
    temperature = rng.choice([0.0, 0.7, 1.0])  # greedy and sampled answers, as chats use both
    base = (seed * 1_000_003 + index * 2 + (split == "eval")) % 2**31

    def ask(convs, n, salt):
        return answer(model, tok, eos, convs, max_new=n, temperature=temperature, k=k, seed=base + salt)

    user = lambda text: {"role": "user", "content": text}  # noqa: E731
    requests = ask([[user(prompts.self_prompt(rng, split))] for _ in range(batch // 2)],
                   min(SELF_PROMPT_TOKENS, max_new), 0)
    written = [prompts.as_prompt(s["text"]) or prompts.prompt(rng, split) for s in requests]
    convs = [[user(prompts.prompt(rng, split))] for _ in range(batch - len(written))] + [[user(w)] for w in written]
    rng.shuffle(convs)
    answers = ask(convs, max_new, 1)
    more = [c + [{"role": "assistant", "content": a["text"]}, user(prompts.follow_up(rng))]
            for c, a in zip(convs[: batch // 2], answers)]
    return requests + answers + ask(more, max_new, 2)
