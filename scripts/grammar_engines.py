"""Grammar engines compared for serve's constrained decoding: the time to set a JSON schema up on SmolLM2's
tokenizer, and to compute one mask, walking one answer's tokens: llguidance (what serve uses), xgrammar and
outlines-core.

Usage: python scripts/grammar_engines.py [DIR]
DIR holds xgrammar and outlines-core, installed apart from sfchat's environment (xgrammar pulls in triton):
    pip install --no-deps --target DIR xgrammar apache-tvm-ffi outlines-core
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from transformers import AutoTokenizer

from peers.base.locations import models_dir

VOCAB = 49152
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
ANSWER = json.dumps({"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry", "engines"]})


def walk(ids: list[int], mask, advance) -> list[float]:
    """Seconds each mask took, moving past each token after its mask."""
    out = []
    for t in ids:
        t0 = time.perf_counter()
        mask()
        out.append(time.perf_counter() - t0)
        advance(t)
    return out


def llguidance_engine(tok):
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt
    m = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tok, VOCAB),
                             llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)))
    bits = lt.allocate_token_bitmask(1, VOCAB)
    return lambda: lt.fill_next_token_bitmask(m, bits, 0), m.consume_token


def xgrammar_engine(tok):
    import xgrammar as xg
    compiled = xg.GrammarCompiler(xg.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB)).compile_json_schema(
        json.dumps(SCHEMA))
    m, bits = xg.GrammarMatcher(compiled), xg.allocate_token_bitmask(1, VOCAB)
    return lambda: m.fill_next_token_bitmask(bits, 0), m.accept_token


def outlines_engine(tok):
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema
    byte_of = {c: b for b, c in _byte_level().items()}  # a byte-level BPE token's text -> its bytes
    tokens: dict[bytes, list[int]] = {}
    for text, i in tok.get_vocab().items():
        if i not in tok.all_special_ids and all(c in byte_of for c in text):
            tokens.setdefault(bytes(byte_of[c] for c in text), []).append(i)
    guide = Guide(Index(build_regex_from_schema(json.dumps(SCHEMA)), Vocabulary(tok.eos_token_id, tokens)))
    return guide.get_tokens, guide.advance


def _byte_level() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main() -> None:
    if len(sys.argv) > 1:
        sys.path.append(sys.argv[1])
    tok = AutoTokenizer.from_pretrained(models_dir() / "smollm2-135m")
    ids = tok.encode(ANSWER, add_special_tokens=False)
    for name, engine in (("llguidance", llguidance_engine), ("xgrammar", xgrammar_engine),
                         ("outlines-core", outlines_engine)):
        try:
            t0 = time.perf_counter()
            mask, advance = engine(tok)
            setup = time.perf_counter() - t0
        except ImportError as e:
            print(f"{name}: not installed ({e})")
            continue
        ts = walk(ids, mask, advance)
        print(f"{name}: set-up {setup * 1e3:.0f} ms; a mask: median {statistics.median(ts) * 1e6:.0f} us, "
              f"slowest {max(ts) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
