"""The fixed prompts and their answers from plain transformers (greedy), computed before the ring starts."""
from __future__ import annotations

PROMPTS = [
    "hello world",
    "the quick brown fox",
    "def fib(n):",
    "Name three colours.",
    "What is the capital of France?",
    "quantum entanglement",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "Why is the sky blue?",
    "speculative decoding drafts tokens",
    "Say something kind.",
    "the lazy dog",
]


def references(model_dir: str, max_tokens: int) -> dict[str, dict]:
    """Each prompt's greedy answer: its text (as the endpoint streams it: special tokens left out) and its
    token count, the end-of-sequence token included when it came (as the endpoint's usage counts it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id} - {None}
    gen = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=sorted(eos),
                           pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else sorted(eos)[0])
    out = {}
    for p in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt")["input_ids"]
        with torch.no_grad():
            new = model.generate(ids, generation_config=gen)[0, ids.shape[1]:].tolist()
        n = next((i for i, t in enumerate(new) if t in eos), len(new))
        out[p] = {"text": tok.decode(new[:n], skip_special_tokens=True), "tokens": min(n + 1, len(new))}
    return out
