"""Constrained decoding: a grammar (a JSON schema, or any of llguidance's grammars) that every token of an answer
must follow, kept by masking the target's distribution at each position.

Exact under speculation. A round's verification walks down the drafts from the root as before; at each node the
target's row is masked by the grammar's state after the tokens above it, and the target's own choice there (its
argmax, or its draw keyed by (seed, position)) is taken from the masked row. That is, token for token, what
decoding with the grammar alone would choose, with or without drafts. Only the accepted path needs a mask: the
walk stops at the first node the target does not choose.

Drafts are held to the grammar too, before the pass: a draft token the grammar refuses where it stands, and the
nodes under it, are dropped, so no position of a pass is spent on a token the target can never take. Where the
grammar allows exactly one token (a key of a schema, a closing brace), the main chain is carried on with it.

llguidance (Microsoft's): no dependencies, masks in tens of microseconds for a 49k vocabulary, rollback for
walking a draft tree; docs/benchmarks.md has the comparison with xgrammar and outlines-core.
"""
from __future__ import annotations

import json

import llguidance
import llguidance.hf
import torch
# (numpy's kernels, not llguidance.torch's: that one is torch.compile'd, and its first call compiled it on the event
# loop, tens of seconds on a busy 2-core machine, with torch._dynamo imported first; a mask costs the same)
from llguidance.numpy import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmask

from peers.speculation.sampling import SamplingParams, sample
from peers.speculation.tree import Draft

# JSON as models write it (json.dumps' separators), one line: a flexible whitespace lets a small model pad forever
JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
FORCED_MAX = 16  # forced tokens appended to a draft's main chain at most

_tokenizers: dict[tuple[int, int], tuple[object, llguidance.LLTokenizer]] = {}


class GrammarError(ValueError):
    """A grammar or schema llguidance cannot use (said to the client as a 400)."""


def _lltokenizer(tokenizer, vocab: int) -> llguidance.LLTokenizer:
    """llguidance's view of a Hugging Face tokenizer, made once (about a second for a 50k vocabulary)."""
    key = (id(tokenizer), vocab)
    if key not in _tokenizers:
        _tokenizers[key] = (tokenizer, llguidance.hf.from_tokenizer(tokenizer, vocab))
    return _tokenizers[key][1]


def json_grammar(schema: dict | None) -> str:
    """llguidance's grammar for JSON following `schema` (None: any JSON object); GrammarError if it cannot be."""
    schema = dict(schema) if schema is not None else {"type": "object"}
    schema["x-guidance"] = {**JSON_STYLE, **schema.get("x-guidance", {})}
    return _checked(llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)))


def lark_grammar(text: str) -> str:
    """llguidance's grammar from a Lark grammar (%json {schema} inside it: JSON as json_grammar writes it)."""
    return _checked(llguidance.LLMatcher.grammar_from_lark(text))


def _checked(grammar: str) -> str:
    if why := llguidance.LLMatcher.validate_grammar(grammar):  # the error's text, empty when none
        raise GrammarError(why.strip().splitlines()[0])
    return grammar


class Grammar:
    """One answer's grammar and where it stands: after the answer's committed tokens."""

    def __init__(self, tokenizer, grammar: str, vocab: int):
        """grammar: json_grammar's or lark_grammar's; vocab: the width of the target's logits."""
        self.vocab = vocab
        self.matcher = llguidance.LLMatcher(_lltokenizer(tokenizer, vocab), grammar)
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        self._bits = allocate_token_bitmask(1, vocab)

    def mask(self, row: torch.Tensor) -> torch.Tensor:
        """A row of logits [V] with every token the grammar refuses here at -inf (a copy, on the CPU)."""
        fill_next_token_bitmask(self.matcher, self._bits, 0)
        out = row.detach().float().cpu()[:self.vocab].clone()
        apply_token_bitmask_inplace(out.numpy(), self._bits)  # (in place: the array is the tensor's memory)
        return out

    def consume(self, token: int) -> None:
        """Move past a committed token (the target chose it from a masked row, so the grammar allows it)."""
        if not self.matcher.consume_token(token):
            raise GrammarError(f"token {token} broke the grammar: {self.matcher.get_error()}")

    def verify(self, logits: torch.Tensor, draft: Draft, params: SamplingParams,
               position: int) -> tuple[list[int], int]:
        """A round's verdict under the grammar (logits [n+1, V]: the root's row, then node i's at i + 1): walk down
        from the root taking the target's choice from each masked row, while it is one of the node's children.
        Returns (the accepted nodes, the target's own next token); the grammar moves past all of them."""
        children: dict[int, dict[int, int]] = {}
        for i, (t, p) in enumerate(zip(draft.tokens, draft.parents)):
            children.setdefault(p, {}).setdefault(t, i)
        path, node = [], -1
        while True:
            row = self.mask(logits[node + 1])
            if params.greedy:
                y = int(row.argmax())
            else:  # the draw keyed by (seed, position) the unconstrained rounds take, from the masked row
                y = sample(params.probs(row.view(1, -1))[0], params.seed, position + len(path))
            self.consume(y)
            if (nxt := children.get(node, {}).get(y)) is None:
                return path, y
            path.append(nxt)
            node = nxt

    def fit(self, draft: Draft) -> Draft:
        """The draft without the nodes the grammar refuses (and what grows under them); its main chain carried on
        by the tokens the grammar forces after it."""
        kept, stack = [], []  # stack: the kept nodes consumed, root first
        for i, (t, p) in enumerate(zip(draft.tokens, draft.parents)):
            while stack and stack[-1] != p:
                stack.pop()
                self.matcher.rollback(1)
            if (p == -1 or stack) and self.matcher.try_consume_tokens([t]) == 1:
                kept.append(i)
                stack.append(i)
        self.matcher.rollback(len(stack))
        out = draft if len(kept) == len(draft.tokens) else draft.keep(kept)
        return self._forced(out)

    def _forced(self, draft: Draft) -> Draft:
        """The draft's main chain followed by the tokens the grammar forces after it (a schema's next key, say), in
        their usual tokenization: the target takes them unless it spells the same text in other tokens."""
        chain = draft.tokens[:draft.chain]
        done = self.matcher.try_consume_tokens(chain)
        forced = self.matcher.compute_ff_tokens()[:FORCED_MAX] if done == len(chain) else []
        self.matcher.rollback(done)
        if not forced:
            return draft
        return draft.extend_chain(forced)
