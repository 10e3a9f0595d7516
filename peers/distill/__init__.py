"""Self-distilled drafts: the target writes varied text, a small draft learns its next-token distribution.

prompts (what the target is asked), teacher (batched generation with the target's top-k), draft (the draft
model, its reduced vocabulary, and the drafter that loads it), train (loss, steps, agreement), pipeline
(phases, checkpoints, resume).
"""
from .draft import DistilledDrafter, is_distilled, load, shipped_draft  # noqa: F401
