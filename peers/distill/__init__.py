"""Self-distilled drafts, training only: the target writes varied text, a small draft learns to continue from its
features (the draft itself and its drafter: peers/speculation/drafting/).

prompts and chat_prompts (what the target is asked), teacher (batched generation, then the target's final hidden
states over what it wrote), weights (the draft's vocabulary, initial weights, saving), train (losses, steps,
agreement), pipeline (phases, checkpoints, resume).
"""
