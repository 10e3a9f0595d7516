"""The draft `--draft auto` picks for a hub model: its family's smallest instruct sibling, which shares its tokenizer
(the draft's tokens are the target's ids) and, being trained on the same data, agrees with it most often.

One table, one place. A family's pattern matches the target's hub id (case ignored); the sibling itself, and any
target no pattern matches, draft with prompt lookup (ngram).
"""
from __future__ import annotations

import re

SIBLINGS: list[tuple[str, str]] = [
    # (the target's hub id, its draft)
    (r"Qwen/Qwen2\.5-(Coder-)?[0-9.]+B(-Instruct)?(-\w+)?", "Qwen/Qwen2.5-0.5B-Instruct"),  # Coder: same tokenizer
    (r"Qwen/Qwen3-[0-9.]+B(-\w+)?", "Qwen/Qwen3-0.6B"),
    (r"Qwen/Qwen2-[0-9.]+B(-Instruct)?", "Qwen/Qwen2-0.5B-Instruct"),
    (r"meta-llama/(Meta-)?Llama-3\.[123]-[0-9.]+B(-Instruct)?", "meta-llama/Llama-3.2-1B-Instruct"),
    (r"google/gemma-2-[0-9.]+b(-it)?", "google/gemma-2-2b-it"),
    (r"HuggingFaceTB/SmolLM2-[0-9.]+[MB](-Instruct)?", "HuggingFaceTB/SmolLM2-135M-Instruct"),
]


def sibling_draft(repo_id: str | None) -> str | None:
    """The draft for the hub model `repo_id` (no revision), or None: no sibling known, or it is the sibling."""
    if not repo_id:
        return None
    for pattern, draft in SIBLINGS:
        if re.fullmatch(pattern, repo_id, re.IGNORECASE) and repo_id.lower() != draft.lower():
            return draft
    return None
