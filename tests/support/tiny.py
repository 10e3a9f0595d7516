"""Tiny random models of every architecture sfchat splits, and a real BPE tokenizer with a chat template, built
inside the tests."""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# a template that shows the model tools and teaches the <tool_call> form, as Qwen2.5's and Hermes' do
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "</tools>\nTo call one, answer with <tool_call>\n{\"name\": <name>, \"arguments\": <object>}\n</tool_call>"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n{% elif m.get('tool_calls') %}<|im_start|>assistant\n{% for c in m['tool_calls'] %}"
    "<tool_call>\n{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}\n"
    "</tool_call>{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny tokenizer for tests of a ring of peers",
    "speculative decoding drafts tokens and the ring verifies them in one pass",
    "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "quantum entanglement pipeline parallelism 0123456789",
] * 20


# each architecture's model_type and the settings that exercise what it does differently (a window of 4 is far
# shorter than any test's context)
ARCHS = {
    "llama": dict(model_type="llama"),
    "llama3": dict(model_type="llama", rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                   low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=False),
    "qwen3": dict(model_type="qwen3", head_dim=16, tie_word_embeddings=False),
    "mistral": dict(model_type="mistral", sliding_window=4, tie_word_embeddings=False),
    "phi3": dict(model_type="phi3", sliding_window=5, tie_word_embeddings=False),
    "gemma2": dict(model_type="gemma2", head_dim=16, sliding_window=4, query_pre_attn_scalar=16,
                   attn_logit_softcapping=20.0, final_logit_softcapping=10.0, alternate=True),
    "gemma3": dict(model_type="gemma3_text", head_dim=16, sliding_window=4, query_pre_attn_scalar=16,
                   final_logit_softcapping=10.0, rope_local_base_freq=100.0, alternate=True),
}


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
    extra = dict(ARCHS[arch])
    model_type, tied = extra.pop("model_type"), extra.pop("tie_word_embeddings", True)
    if extra.pop("alternate", False):  # local and global layers in turn
        extra["layer_types"] = [("sliding_attention", "full_attention")[i % 2] for i in range(layers)]
    cfg = AutoConfig.for_model(model_type, **{**extra, **common})
    cfg.tie_word_embeddings = tied if tie is None else tie
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # random init is near-uniform; sharpen the head a little so greedy decoding has clear winners
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def qwen2_shapes(n_layers, hidden, inter, heads, kv_heads, vocab, tied=False):
    """The tensor shapes of a Qwen2-layout checkpoint (q/k/v with biases), as its safetensors headers list them."""
    hd = hidden // heads
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    if not tied:
        shapes["lm_head.weight"] = [vocab, hidden]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": [heads * hd, hidden], p + "self_attn.q_proj.bias": [heads * hd],
                   p + "self_attn.k_proj.weight": [kv_heads * hd, hidden], p + "self_attn.k_proj.bias": [kv_heads * hd],
                   p + "self_attn.v_proj.weight": [kv_heads * hd, hidden], p + "self_attn.v_proj.bias": [kv_heads * hd],
                   p + "self_attn.o_proj.weight": [hidden, heads * hd], p + "mlp.gate_proj.weight": [inter, hidden],
                   p + "mlp.up_proj.weight": [inter, hidden], p + "mlp.down_proj.weight": [hidden, inter],
                   p + "input_layernorm.weight": [hidden], p + "post_attention_layernorm.weight": [hidden]}
    return shapes


def one(shard, s, committed: int, x, parents=None):
    """A shard's pass of one conversation (a batch of one): its hidden states."""
    return shard.forward([(s, committed, x, parents)])[0]
