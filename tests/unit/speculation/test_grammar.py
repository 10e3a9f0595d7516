"""A grammar alone (peers/speculation/grammar.py) on a real tokenizer: which draft nodes it keeps, the tokens it
forces onto the main chain, and a verdict taken from masked rows."""
import json

import torch

from peers.speculation.grammar import Grammar, json_grammar
from peers.speculation.sampling import SamplingParams
from peers.speculation.tree import Draft, chain

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


def setup():
    from tiny import make_tokenizer
    tok = make_tokenizer()
    return tok, Grammar(tok, json_grammar(SCHEMA), len(tok))


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_fit_drops_refused_nodes_with_what_grows_under_them_and_forces_the_schema_key():
    tok, g = setup()
    a, b, c = ids(tok, "{"), ids(tok, "x"), ids(tok, "[")
    assert len(a) == len(b) == len(c) == 1
    # root -> "{" (0) -> "x" (1, refused: a key starts with a quote) -> "{" (2, under a refused node); root -> "[" (3)
    d = Draft(a + b + a + c, [-1, 0, 1, -1], [0.9, 0.5, 0.4, 0.2])
    out = g.fit(d)
    assert out.tokens[:1] == a and c[0] not in out.tokens  # (an array is no object)
    forced = tok.decode(out.tokens[1:])
    assert forced.startswith('"ok":') and out.parents == chain(out.tokens) and out.guess is None
    assert out.sure == [0.9] * len(out.tokens)
    assert g.matcher.try_consume_tokens(a) == 1  # nothing was consumed for good by fitting


def test_extend_chain_keeps_the_layout_depth_first_with_the_main_chain_leading():
    d = Draft([10, 11, 12, 13], [-1, 0, 0, -1], [0.9, 0.8, 0.3, 0.2], torch.eye(20)[[10, 11, 12, 13]], guess=5)
    out = d.extend_chain([14, 15])
    assert out.tokens == [10, 11, 14, 15, 12, 13] and out.parents == [-1, 0, 1, 2, 0, -1]
    assert out.chain == 4 and out.sure == [0.9, 0.8, 0.8, 0.8, 0.3, 0.2] and out.guess is None
    assert out.q.argmax(-1).tolist() == out.tokens


def test_a_verdict_takes_each_choice_from_the_masked_row_and_moves_the_grammar_past_it():
    tok, g = setup()
    brace, x = ids(tok, "{")[0], ids(tok, "x")[0]
    logits = torch.zeros(3, len(tok))
    logits[0, x] = 5.0  # the target would write x, which the grammar refuses: its choice is "{" (next likeliest)
    logits[0, brace] = 1.0
    logits[1, x] = 5.0  # after "{", x is refused again: the grammar forces '"'
    d = Draft([brace, x], chain([brace, x]), [0.9, 0.8])
    path, nxt = g.verify(logits, d, SamplingParams(), position=0)
    assert path == [0] and tok.decode([nxt]).startswith('"')
    rest = ids(tok, json.dumps({"ok": True})[len("{" + tok.decode([nxt])):])
    assert g.matcher.try_consume_tokens(rest) == len(rest) and g.matcher.is_accepting()  # it stands after both


def test_a_first_mask_compiles_nothing():
    """A grammar's first mask runs on the host's event loop: it must not compile a kernel there (llguidance's torch
    kernel is torch.compile'd: tens of seconds on a busy machine, every member's heartbeat held up meanwhile). A
    fresh process, as a fresh host is."""
    import subprocess
    import sys

    from helpers import ROOT, child_env

    code = ("import sys, torch; sys.path.insert(0, 'tests/support')\n"
            "from tiny import make_tokenizer\n"
            "from peers.speculation.grammar import Grammar, json_grammar\n"
            "tok = make_tokenizer(); g = Grammar(tok, json_grammar(None), len(tok))\n"
            "row = g.mask(torch.zeros(len(tok)))\n"
            "print(int(torch.isfinite(row).sum()), 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                         timeout=300)
    allowed, compiled = out.stdout.split()
    assert 0 < int(allowed) < 100 and compiled == "False", out.stdout + out.stderr  # "{" and a few whitespaces
