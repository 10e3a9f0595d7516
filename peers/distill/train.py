"""Training: at every position the target wrote, the draft's next-token distribution is fitted to the target's
top-k (renormalised over the ids the draft can output): cross-entropy against soft labels, i.e. distillation.

Step j's batch is drawn by a generator seeded with (seed, j), and the learning rate depends on j alone, so a
run resumed from a checkpoint takes exactly the steps an uninterrupted one would: same seed, same data, same
number of steps -> the same weights (bit for bit on a CPU).
"""
from __future__ import annotations

import torch

BATCH = 16  # conversations per step
MAX_LEN = 1024  # tokens per conversation seen in training (longer ones are cut)
LR, WARMUP = 3e-4, 50


def to_rows(samples: list[dict], to_row: torch.Tensor) -> list[dict]:
    """Samples with labels as head rows (-1: a token the draft cannot propose) and their renormalised weights."""
    out = []
    for s in samples:
        labels = to_row[s["topk_ids"].long()]
        p = s["topk_p"].float() * (labels >= 0)
        keep = p.sum(-1) > 0
        p[keep] /= p[keep].sum(-1, keepdim=True)
        # compact dtypes: all the data stays in memory
        out.append({"ids": s["ids"], "start": s["start"], "labels": labels.int(), "p": p.half()})
    return out


def collate(batch: list[dict], device) -> tuple[torch.Tensor, ...]:
    """Right-padded inputs [B, T], attention mask, labels [B, T, k], their weights, and where answers are."""
    T = min(max(len(s["ids"]) for s in batch) - 1, MAX_LEN)
    k = batch[0]["labels"].shape[-1]
    B = len(batch)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    labels = torch.full((B, T, k), -1, dtype=torch.long)
    weights = torch.zeros(B, T, k)
    answer = torch.zeros(B, T, dtype=torch.bool)
    for b, s in enumerate(batch):
        n = min(len(s["ids"]) - 1, T)
        ids[b, :n], mask[b, :n] = s["ids"][:n], 1
        # the logits at position t predict token t + 1: answer token j (at start + j) is predicted at start + j - 1
        a, e = s["start"] - 1, min(s["start"] - 1 + len(s["labels"]), n)
        if e > a:
            labels[b, a:e], weights[b, a:e], answer[b, a:e] = s["labels"][: e - a], s["p"][: e - a], True
    return tuple(t.to(device) for t in (ids, mask, labels, weights, answer))


def answer_logits(model, ids, mask, answer) -> torch.Tensor:
    """Logits [N, rows] at the answer positions only: the head is most of the cost, prompts need none."""
    h = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state[answer]
    return model.lm_head(h).float()


def loss_fn(model, ids, mask, labels, weights, answer) -> torch.Tensor:
    logp = torch.log_softmax(answer_logits(model, ids, mask, answer), -1).gather(-1, labels[answer].clamp_min(0))
    w = weights[answer]  # 0 where the label is -1
    return -(w * logp).sum() / w.sum().clamp_min(1.0)


def lr_at(step: int) -> float:
    return LR * min(1.0, (step + 1) / WARMUP)


def step(model, opt, data: list[dict], seed: int, j: int, device) -> float:
    """Training step j (0-based): its batch and learning rate depend only on (seed, j)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + j)
    pick = torch.randint(len(data), (min(BATCH, len(data)),), generator=g).tolist()
    for group in opt.param_groups:
        group["lr"] = lr_at(j)
    model.train()
    loss = loss_fn(model, *collate([data[i] for i in pick], device))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    return loss.detach().item()


def optimizer(model) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)


@torch.no_grad()
def agreement(model, data: list[dict], device) -> float:
    """How often the draft's top token is the target's top token, over every answer position of `data`: the
    per-token acceptance of greedy speculation (1 + a + a^2 + ... tokens per round)."""
    model.eval()
    hit = total = 0
    for i in range(0, len(data), BATCH):
        ids, mask, labels, _, answer = collate(data[i : i + BATCH], device)
        top = labels[answer][:, 0]  # head row of the target's top token; -1 if the draft cannot propose it
        hit += int((answer_logits(model, ids, mask, answer).argmax(-1) == top).sum())
        total += len(top)
    return hit / max(total, 1)
