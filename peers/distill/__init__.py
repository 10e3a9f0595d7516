"""Self-distilled drafts: the target writes varied text, a small draft learns to continue from its features.

prompts (what the target is asked), teacher (batched generation, then the target's final hidden states over what
it wrote), draft (the feature draft, its reduced vocabulary, and the drafter that loads it), train (losses,
steps, agreement), pipeline (phases, checkpoints, resume).
"""
from .draft import FeatureDrafter, is_distilled, load, shipped_draft  # noqa: F401
