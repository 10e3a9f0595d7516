"""Tiny random Llama / Qwen2 models and a real BPE tokenizer with a chat template, built inside the tests."""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny tokenizer for tests of a ring of peers",
    "speculative decoding drafts tokens and the ring verifies them in one pass",
    "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "quantum entanglement pipeline parallelism 0123456789",
] * 20


def make_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(path: Path, arch: str = "llama", layers: int = 4, seed: int = 0, hidden: int = 64,
               vocab_pad: int = 0, tie: bool | None = None, **config) -> Path:
    """Save a random model of `arch` (`config`: more of its config's fields) with a trained tokenizer into `path`;
    returns path."""
    tok = make_tokenizer()
    vocab = len(tok) + vocab_pad
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    common |= config  # e.g. a wider MLP or more heads
    if arch == "llama":
        cfg = LlamaConfig(**common, tie_word_embeddings=True if tie is None else tie)
    elif arch == "qwen2":
        cfg = Qwen2Config(**common, tie_word_embeddings=False if tie is None else tie)
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # random init is near-uniform; sharpen the head a little so greedy decoding has clear winners
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
