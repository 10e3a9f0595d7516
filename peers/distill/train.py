"""Training the feature draft (EAGLE-style): at index t it reads (f_t, x_{t+1}) and must predict f_{t+1}.

Two losses, as in EAGLE: the draft's next-token distribution (the head over its predicted feature) is fitted to
the target's (the same head rows over the real f_{t+1}: the target's distribution renormalised over the ids the
draft can propose), and the predicted feature is pulled towards the real one (smooth L1). Each step also runs a
second pass whose inputs are the first pass's predictions instead of the target's features: at inference every
draft after the first reads the draft's own guess, and this teaches it to keep going from one.

Step j's batch is drawn by a generator seeded with (seed, j), and the learning rate depends on j alone, so a
run resumed from a checkpoint takes exactly the steps an uninterrupted one would: same seed, same data, same
number of steps -> the same weights (bit for bit on a CPU). A run given --steps decays its rate to that end;
continuing it with a larger --steps starts a new leg (the rate jumps to where a run of the new length has it,
then decays to the new end), and the reproducing commands name every leg.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BATCH = 16  # conversations per step
MAX_LEN = 1024  # tokens per conversation seen in training (longer ones are cut)
LR, WARMUP = 1e-3, 50
FEATURE_WEIGHT = 1.0


def collate(batch: list[dict], device) -> tuple[torch.Tensor, ...]:
    """Right-padded next ids [B, T], features f_t [B, T, H], targets f_{t+1}, mask, and where answers are
    predicted (x_{t+2} is an answer token)."""
    T = min(max(len(s["ids"]) for s in batch) - 1, MAX_LEN)
    B, H = len(batch), batch[0]["feats"].shape[-1]
    nxt = torch.zeros(B, T, dtype=torch.long)
    feats, target = torch.zeros(B, T, H), torch.zeros(B, T, H)
    mask = torch.zeros(B, T, dtype=torch.long)
    answer = torch.zeros(B, T, dtype=torch.bool)
    for b, s in enumerate(batch):
        n = min(len(s["ids"]) - 1, T)
        nxt[b, :n] = s["ids"][1 : n + 1]
        feats[b, :n], target[b, :n] = s["feats"][:n].float(), s["feats"][1 : n + 1].float()
        mask[b, :n] = 1
        # index t predicts x_{t+2}: answer tokens start at `start`, and the last token has nothing after it
        answer[b, max(s["start"] - 2, 0) : min(n, len(s["ids"]) - 2)] = True
    return tuple(t.to(device) for t in (nxt, feats, target, mask, answer))


def mixed_precision(device):
    """bfloat16 matrix products with float32 weights and losses: on a CPU with AMX (this project's latest machine)
    a step took 1.6 s instead of 2.5 s (the head over every answer position is much of a step's work; a CPU
    without bfloat16 units would be slower, not faster)."""
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def target_probs(model, target, answer) -> torch.Tensor:
    """The target's next-token distribution over the draft's head rows, from its real features."""
    with torch.no_grad():
        return torch.softmax(model.head(target[answer]).float(), -1)


def losses(model, nxt, feats, target, mask, answer, p) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, predicted features) of one pass."""
    g = model(nxt, feats, attention_mask=mask)
    pred, real = g[answer], target[answer]
    ce = -(p * torch.log_softmax(model.head(pred).float(), -1)).sum(-1).mean()
    return ce + FEATURE_WEIGHT * F.smooth_l1_loss(pred.float(), real), g


def lr_at(step: int, total: int | None = None) -> float:
    """Linear warm-up; then, when the run's length is known (--steps), a cosine decay to LR / 10 at its end (the
    last steps average out the noise of the constant-rate ones); with a time budget, constant."""
    warm = min(1.0, (step + 1) / WARMUP)
    if total is None or total <= WARMUP:
        return LR * warm
    done = min(max(step - WARMUP, 0) / (total - WARMUP), 1.0)
    return LR * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def step(model, opt, data: list[dict], seed: int, j: int, device, total: int | None = None) -> float:
    """Training step j (0-based) of `total`: its batch and learning rate depend only on (seed, j, total)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + j)
    pick = torch.randint(len(data), (min(BATCH, len(data)),), generator=g).tolist()
    for group in opt.param_groups:
        group["lr"] = lr_at(j, total)
    model.train()
    nxt, feats, target, mask, answer = collate([data[i] for i in pick], device)
    with mixed_precision(device):
        p = target_probs(model, target, answer)
        first, pred = losses(model, nxt, feats, target, mask, answer, p)
        # second pass: index t reads the draft's own prediction of f_t (made at t - 1) in place of the real one
        own = torch.cat([feats[:, :1], pred.detach().float()[:, :-1]], 1)
        second, _ = losses(model, nxt, own, target, mask, answer, p)
        loss = (first + second) / 2
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    return loss.detach().item()


def optimizer(model) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)


@torch.no_grad()
def agreement(model, data: list[dict], head: torch.Tensor, to_row: torch.Tensor, device) -> tuple[float, float]:
    """How often the draft's top token is the target's top token over every answer position of `data`, for the
    first draft of a round (real features in) and for later ones (the draft's own previous guess in). With
    greedy speculation a round then commits about 1 + a1 + a1*a2 + a1*a2^2 + ... tokens."""
    model.eval()
    head = head.to(device)
    hits, total = [0, 0], 0
    for i in range(0, len(data), BATCH):
        nxt, feats, target, mask, answer = collate(data[i : i + BATCH], device)
        real = target[answer]
        top = torch.cat([(c @ head.T).argmax(-1) for c in real.split(1024)])  # the target's greedy next token
        want = to_row.to(device)[top]  # -1: the draft cannot propose it
        g = model(nxt, feats, attention_mask=mask)
        own = torch.cat([feats[:, :1], g[:, :-1]], 1)
        for j, out in enumerate((g, model(nxt, own, attention_mask=mask))):
            hits[j] += int((model.head(out[answer]).argmax(-1) == want).sum())
        total += len(want)
    return hits[0] / max(total, 1), hits[1] / max(total, 1)
