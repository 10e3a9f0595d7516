"""`sfchat distill` on a tiny target: a loadable feature draft, exact speculation with it, better agreement than
its initialisation on held-out prompts, resume from a checkpoint, the same weights for the same seed."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
import trio
from safetensors.torch import load_file

from helpers import ROOT, answer, child_env, reference_ids
from peers.speculation.adaptive import LinkPolicy
from peers.conversation.chat import load_tokenizer
from peers.speculation.drafting import FeatureDrafter, shipped_draft
from peers.speculation.drafting.feature import COPY_WEIGHT
from peers.speculation.drafting.feature_net import target_head
from peers.distill.pipeline import Options, distill, held_out_samples
from peers.speculation.drafting import NgramDrafter, make_drafter
from peers.speculation.sampling import SamplingParams
from peers.base.limits import MAX_NODES
from peers.base.tree_layout import check_parents

PROMPT = "the quick brown fox jumps over the lazy dog"

# small everything: the target answers 8 conversations at a time, 32 tokens each; the draft keeps 128 ids
SMALL = dict(batch=8, max_new=32, vocab=128, device="cpu", seed=0, teacher_dtype="float32")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(target, out, **kw):
    events = []
    summary = distill(Options(model=str(target), out=out, **{**SMALL, **kw}),
                      progress=lambda *e: events.append(e), say=lambda *a: None)
    return summary, events


async def _answer(model, draft, *, k, max_new=24, params=None):
    return await answer(model, draft, prompt=PROMPT, k=k, params=params, max_new=max_new)


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, tiny_llama):
    """An untrained draft (0 steps) and one trained 120 steps by resuming the untrained one's work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("distill")
    run(tiny_llama, base / "init", shards=3, steps=0)
    shutil.copytree(base / "init", base / "trained")
    trained, events = run(tiny_llama, base / "trained", steps=120)
    torch.set_num_threads(threads)
    return {"init": base / "init", "trained": base / "trained", "summary": trained, "events": events}


def held_out_agreement(draft_dir, target_dir, samples) -> float:
    """Through the drafter interface, as the generation loop drives it: after a pass that verified x_0..x_{m-1}
    the draft holds the features f_0..f_{m-2}; how often is its proposal the target's greedy choice after x_{m-1}?"""
    d = make_drafter(str(draft_dir), target_dir, 300, load_tokenizer(target_dir))
    d.copy = False  # the draft itself, without prompt lookup
    head = target_head(target_dir)
    hit = total = 0
    for s in samples:
        ids, feats = s["ids"].tolist(), s["feats"].float()
        for m in range(max(s["start"], 2), len(ids)):
            d.observe(0, ids[: m - 1], feats[: m - 1])
            want = int((feats[m - 1] @ head.T).argmax())
            hit += d.propose(ids[:m], 1, SamplingParams())[0] == [want]
            total += 1
    return hit / total


def test_distillation_beats_the_initialisation_on_held_out_prompts(drafts, tiny_llama):
    held_out = held_out_samples(drafts["trained"] / "work")
    before = held_out_agreement(drafts["init"], tiny_llama, held_out)
    after = held_out_agreement(drafts["trained"], tiny_llama, held_out)
    s = drafts["summary"]
    assert after > before + 0.03, (before, after)  # a random tiny target is hard to follow: 0.02 -> 0.07
    assert s["agreement"][0] > s["agreement_init"][0] + 0.03
    assert abs(after - s["agreement"][0]) < 0.05  # the drafter sees what training measured
    # it resumed the untrained run's work: its data and, from step 0, its checkpoint
    assert s["shards"] == 3 and s["steps"] == 120
    assert not any(e[0] == "data" and e[3].startswith("shard") for e in drafts["events"])
    assert [e[1] for e in drafts["events"] if e[0] == "train"][0] == 1


def target_features(target_dir, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    with torch.no_grad():
        return m.model(input_ids=torch.tensor([ids])).last_hidden_state[0]


def test_speculation_with_the_draft_is_exact(drafts, tiny_llama):
    d = make_drafter(str(drafts["trained"]), tiny_llama, 300, load_tokenizer(tiny_llama))
    assert isinstance(d, FeatureDrafter)
    r = trio.run(lambda: _answer(tiny_llama, str(drafts["trained"]), k=4, max_new=32))
    assert r.token_ids == reference_ids(tiny_llama, PROMPT, 32)
    assert r.stats.drafted > 0
    # no pass yet, so no features: nothing to propose (the first pass brings them)
    ids = load_tokenizer(tiny_llama).encode(PROMPT)
    assert d.propose(ids, 3, SamplingParams()) == ([], None)
    d.observe(0, ids[:-1], target_features(tiny_llama, ids)[:-1])
    greedy, _ = d.propose(ids, 3, SamplingParams())
    assert len(greedy) == 3
    # a pass that starts past what the draft saw (it joined mid-conversation) still leaves it drafting
    d2 = make_drafter(str(drafts["trained"]), tiny_llama, 300, load_tokenizer(tiny_llama))
    d2.observe(4, ids[4:-1], target_features(tiny_llama, ids)[4:-1])
    assert len(d2.propose(ids, 3, SamplingParams())[0]) == 3
    # sampling: q lives on the target's vocabulary, zero outside the draft's 128 ids
    tokens, q = d.propose(ids, 3, SamplingParams(1.0, seed=1))
    kept = set(json.loads((drafts["trained"] / "draft_vocab.json").read_text()))
    assert q.shape == (3, 300) and torch.allclose(q.sum(-1), torch.ones(3))
    assert set(tokens) <= kept and set(q.nonzero()[:, 1].tolist()) <= kept
    runs = [trio.run(lambda: _answer(tiny_llama, str(drafts["trained"]), k=3, params=SamplingParams(0.8, seed=5)))
            for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) == 24  # seeded: reproducible
    assert runs[0].stats.drafted > 0


def test_features_of_rejected_drafts_are_never_read(drafts, tiny_llama):
    """A pass also returns features at drafts the target went on to reject: the draft must read only those of
    its context, exactly as a draft that never saw the rejected ones."""
    tok = load_tokenizer(tiny_llama)
    ids = tok.encode(PROMPT)
    cut = len(ids) - 3  # the pass verified ids[:cut] plus three drafts, and the target rejected them
    rejected = ids[:cut] + [7, 8, 9]
    d = make_drafter(str(drafts["trained"]), tiny_llama, 300, tok)
    d.observe(0, rejected, target_features(tiny_llama, rejected))
    fresh = make_drafter(str(drafts["trained"]), tiny_llama, 300, tok)
    fresh.observe(0, ids[:cut], target_features(tiny_llama, ids[:cut]))
    context = ids[: cut + 1]  # ids[cut] is the target's own token after the rejection
    assert d.propose(context, 3, SamplingParams()) == fresh.propose(context, 3, SamplingParams())
    # the feature buffer grows as a conversation does, keeping what it holds
    first = torch.randn(300, d.seen.feats.shape[1])
    d.observe(0, list(range(300)), first)
    d.observe(300, list(range(300)), torch.randn(300, d.seen.feats.shape[1]))
    assert d.seen.n_feats == 600 and len(d.seen.feat_ids) == 600 and torch.equal(d.seen.feats[:300], first)


def test_resume_and_seed_give_the_same_weights(drafts, tiny_llama, tmp_path):
    """Interrupted (Ctrl-C) after 10 of 20 steps and run again == 20 steps in one go from nothing (data written
    again)."""
    shutil.copytree(drafts["init"], tmp_path / "a")

    def interrupt(phase, done, total, note):
        if phase == "train" and done == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(Options(model=str(tiny_llama), out=tmp_path / "a", **{**SMALL, "steps": 20}), progress=interrupt,
                say=lambda *a: None)
    _, events = run(tiny_llama, tmp_path / "a", steps=20)
    assert [e[1] for e in events if e[0] == "train"] == list(range(11, 21))
    run(tiny_llama, tmp_path / "b", shards=3, steps=20)
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="other options"):
        run(tiny_llama, tmp_path / "b", steps=20, seed=1)


def test_data_of_two_kinds_is_reproduced_by_the_printed_commands(tiny_llama, tmp_path, capsys):
    """Two --data-only runs (float32 templated shards, then bfloat16 chat shards), a training run, then --reopen
    for one more chat shard and training again, then training continued to more steps; the summary's commands,
    run as printed into another directory, give the same weights."""
    from sfchat.cli import parser
    from sfchat.distill import run as cli_run

    first, _ = run(tiny_llama, tmp_path / "a", shards=2, data_only=True, prompt_set="templates")
    assert first["shards"] == 2 and "agreement" not in first
    assert not (tmp_path / "a" / "model.safetensors").exists()
    run(tiny_llama, tmp_path / "a", shards=3, data_only=True, teacher_dtype="bfloat16", prompt_set="chat")
    summary, _ = run(tiny_llama, tmp_path / "a", shards=3, steps=4)
    assert summary["teacher_dtypes"] == {"float32": 2, "bfloat16": 1}
    assert summary["prompt_sets"] == {"templates": 2, "chat": 1}
    held_out = sorted(p.name for p in (tmp_path / "a" / "work" / "data").glob("eval-*.pt"))
    assert held_out == ["eval-00000.pt", "eval-00001.pt"]  # one per prompt set: templates, chat
    trained_on_3 = load_file(tmp_path / "a" / "model.safetensors")
    closed, _ = run(tiny_llama, tmp_path / "a", shards=4, steps=4)  # without --reopen the data stays closed
    assert closed["shards"] == 3 and closed["steps"] == 4
    with pytest.raises(ValueError, match="--reopen needs --shards"):
        run(tiny_llama, tmp_path / "a", steps=4, reopen=True)
    summary, events = run(tiny_llama, tmp_path / "a", shards=4, steps=4, teacher_dtype="bfloat16",
                          prompt_set="chat", reopen=True)
    assert [e[1] for e in events if e[0] == "train"] == [1, 2, 3, 4]  # training started over, on 4 shards
    assert summary["shards"] == 4 and summary["prompt_sets"] == {"templates": 2, "chat": 2}
    assert not torch.equal(load_file(tmp_path / "a" / "model.safetensors")["fc.weight"], trained_on_3["fc.weight"])
    summary, events = run(tiny_llama, tmp_path / "a", steps=6)  # a second leg, decaying to its own end
    assert [e[1] for e in events if e[0] == "train"] == [5, 6]
    commands = summary["reproduce"].split(" && ")
    assert commands[0].endswith("--teacher-dtype float32 --prompts templates --shards 2 --data-only")
    assert commands[1].endswith("--teacher-dtype bfloat16 --prompts chat --shards 4 --steps 4")
    assert commands[2].endswith("--teacher-dtype bfloat16 --prompts chat --shards 4 --steps 6") and len(commands) == 3
    for command in commands:
        args = parser().parse_args(command.replace(str(tmp_path / "a"), str(tmp_path / "b")).split()[1:])
        args.device, args.batch = "cpu", 8
        assert cli_run(args) == 0
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = json.loads((tmp_path / "b" / "work" / "state.json").read_text())
    assert state["dtypes"] == ["float32"] * 2 + ["bfloat16"] * 2
    assert state["prompt_sets"] == ["templates"] * 2 + ["chat"] * 2


def test_chat_prompts_keep_held_out_subjects_and_the_measured_prompts_out_of_training():
    """The held-out shard's subjects never reach training, and no prompt that measures the draft
    (scripts/draft_eval.py, the bench's defaults) is one the draft learns from."""
    import random

    from peers.distill import chat_prompts
    from scripts.draft_eval import PROMPTS
    from sfchat.bench import DEFAULT_PROMPTS

    rng = random.Random(0)
    train = {chat_prompts.prompt(rng, "train") for _ in range(20000)}
    held = {chat_prompts.prompt(rng, "eval") for _ in range(5000)}
    assert len(train) > 5000 and len(held) > 500  # varied
    assert not train & held
    assert not train & (set(PROMPTS) | set(DEFAULT_PROMPTS))
    assert not any(p.lower() in t.lower() for p in ("fibonacci", "entanglement", "pipeline", "tomato", "cover letter",
                                                   "refrigerator", "lighthouse", "tuple", "paris", "purr")
                   for t in train)


def test_cli_runs_for_seconds_and_make_drafter_picks_the_shipped_draft(tiny_llama, tmp_path, monkeypatch):
    """`sfchat distill --minutes` as a user runs it; a draft at $SFCHAT_DRAFTS_DIR/<default> serves the default target."""
    models = tmp_path / "models"
    shutil.copytree(tiny_llama, models / "smollm2-135m")  # the tiny target plays the embedded default
    out = tmp_path / "drafts" / "smollm2-135m"
    env = child_env(SFCHAT_MODELS_DIR=str(models), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "sfchat", "distill", "--model", "smollm2-135m", "--out", str(out),
                        "--minutes", "0.1", "--batch", "8", "--max-new-tokens", "16", "--device", "cpu"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout)
    assert summary["steps"] > 0 and summary["shards"] >= 1
    assert (out / "work" / ".gitignore").read_text() == "*\n"

    target = models / "smollm2-135m"
    monkeypatch.setenv("SFCHAT_MODELS_DIR", str(models))
    tok = load_tokenizer(target)
    monkeypatch.setenv("SFCHAT_DRAFTS_DIR", str(tmp_path / "nothing"))
    assert isinstance(make_drafter(None, target, 300, tok), NgramDrafter)
    monkeypatch.setenv("SFCHAT_DRAFTS_DIR", str(tmp_path / "drafts"))
    assert shipped_draft(target) == out
    assert shipped_draft(tiny_llama) is None  # another target: not the embedded default
    assert isinstance(make_drafter(None, target, 300, tok), FeatureDrafter)


def test_learning_rate_warms_up_then_decays_to_a_tenth_when_the_steps_are_known():
    from peers.distill.train import LR, WARMUP, lr_at

    assert lr_at(0, 1000) == pytest.approx(LR / WARMUP) and lr_at(WARMUP, 1000) == pytest.approx(LR)
    assert lr_at(999, 1000) == pytest.approx(LR / 10, rel=0.01) and lr_at(525, 1000) == pytest.approx(0.55 * LR)
    assert lr_at(999) == LR  # a time budget: no known end, no decay


def test_the_draft_runs_on_one_thread_and_the_host_keeps_its_count(drafts, tiny_llama):
    """torch's thread count is per OS thread, and a new thread takes the process default, which dips to 1 while
    a draft proposes: the host's compute sets its own count (call_with_threads), so it keeps 2 regardless."""
    from concurrent.futures import ThreadPoolExecutor

    from peers.compute.runtime import call_with_threads

    torch.set_num_threads(2)
    d = make_drafter(str(drafts["trained"]), tiny_llama, 300, load_tokenizer(tiny_llama))
    ids = load_tokenizer(tiny_llama).encode(PROMPT)
    d.observe(0, ids[:-1], target_features(tiny_llama, ids)[:-1])
    seen = []
    real = d._drive
    d._drive = lambda steps: (seen.append(torch.get_num_threads()), real(steps))[1]
    with ThreadPoolExecutor(1) as drafting:
        assert len(drafting.submit(d.propose, ids, 3, SamplingParams()).result()[0]) == 3
        assert seen == [1] and drafting.submit(torch.get_num_threads).result() == 2  # restored
        drafting.submit(torch.set_num_threads, 1).result()  # as if caught mid-proposal
        with ThreadPoolExecutor(1) as fresh:
            assert fresh.submit(torch.get_num_threads).result() == 1  # torch's default, the hazard
        with ThreadPoolExecutor(1) as fresh:
            assert fresh.submit(call_with_threads, 2, torch.get_num_threads).result() == 2


def test_where_the_context_repeats_the_draft_copies_what_followed(drafts, tiny_llama):
    tok = load_tokenizer(tiny_llama)
    ids = tok.encode(PROMPT)
    context = ids + ids[:3]  # the text starts over: after ids[:3] came ids[3], ids[4], ...
    d = make_drafter(str(drafts["trained"]), tiny_llama, 300, tok)
    d.observe(0, context[:-1], target_features(tiny_llama, context[:-1]))
    assert d.propose(context, 3, SamplingParams())[0] == ids[3:6]
    # sampling: the copy holds COPY_WEIGHT of q, the draft's own distribution the rest
    tokens, q = d.propose(context, 3, SamplingParams(0.8, seed=1))
    assert torch.allclose(q.sum(-1), torch.ones(3))
    assert q[0, ids[3]] >= COPY_WEIGHT and d.confidence[0] == pytest.approx(float(q[0].max()))
    d.copy = False
    assert d.propose(context, 3, SamplingParams())[0] != ids[3:6]


def test_a_confidence_floor_ends_a_draft_where_the_draft_stops_being_sure(drafts, tiny_llama):
    """Each token's confidence is the draft's chance that it and every draft before it are accepted (so it only
    falls), times the chance of the drafts a call continues; drafting stops after the first below the floor."""
    tok = load_tokenizer(tiny_llama)
    ids = tok.encode(PROMPT)
    d = make_drafter(str(drafts["trained"]), tiny_llama, 300, tok)
    d.observe(0, ids[:-1], target_features(tiny_llama, ids)[:-1])
    tokens, _ = d.propose(ids, 8, SamplingParams())
    sure = list(d.confidence)
    assert len(sure) == len(tokens) == 8 and all(0 < b <= a <= 1 for a, b in zip([1.0] + sure, sure))
    floor = (sure[2] + sure[3]) / 2 if sure[3] < sure[2] else sure[3]  # between the 3rd and the 4th
    cut, _ = d.propose(ids, 8, SamplingParams(), floor=floor)
    assert cut == tokens[: len(cut)] and d.confidence == pytest.approx(sure[: len(cut)])
    assert len(cut) == next((i + 1 for i, s in enumerate(sure) if s < floor), 8)  # up to the first below the floor
    assert all(s >= floor for s in d.confidence[:-1])
    d.propose(ids, 3, SamplingParams(), prior=0.5)
    assert d.confidence == pytest.approx([s / 2 for s in sure[:3]])


def test_a_tree_of_drafts_leads_with_the_chain_and_each_node_is_what_the_draft_says_there(drafts, tiny_llama):
    """The tree grows a level at a time (all of a level's nodes in one step of the draft, each at its own position
    and seeing only its ancestors); every node must be what a chain drafted from its parent's context gives."""
    tok = load_tokenizer(tiny_llama)
    ids = tok.encode(PROMPT)
    d = make_drafter(str(drafts["trained"]), tiny_llama, 300, tok)
    d.copy = False  # (copies are looked up over the context only in a tree, over the drafts too in a chain)
    d.observe(0, ids[:-1], target_features(tiny_llama, ids)[:-1])
    chain, _ = d.propose(ids, 6, SamplingParams())
    sure = list(d.confidence)
    t = d.propose_tree(ids, 1e-4, 6, MAX_NODES)
    check_parents(t.parents, len(t.tokens))
    assert t.chain >= 1 and len(t.tokens) > t.chain and d.confidence == t.sure
    assert t.tokens[: t.chain] == chain[: t.chain] and t.sure[: t.chain] == pytest.approx(sure[: t.chain], rel=1e-4)
    if t.chain < 6:  # the main chain ended below the floor: the guess is the chain's next token
        assert t.guess == chain[t.chain]
    assert all(c >= 1e-4 for c in t.sure) and all(t.sure[i] <= t.sure[p] for i, p in enumerate(t.parents) if p >= 0)
    checked = 0
    for i, p in enumerate(t.parents):
        first_child = t.parents.index(p) == i
        if p >= 0 and first_child:  # the likeliest child: what a chain from its parent's context proposes
            path = t.path(i)
            got, _ = d.propose(ids + path[:-1], 1, SamplingParams())
            assert got == [path[-1]] and d.confidence[0] * t.sure[p] == pytest.approx(t.sure[i], rel=1e-4)
            checked += 1
    assert checked > t.chain - 1  # some of them off the main chain


class RecordingPolicy(LinkPolicy):
    def plan(self, draft_ms, confident=False):
        self.plans = getattr(self, "plans", []) + [super().plan(draft_ms, confident)]
        return self.plans[-1]


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(0.8, seed=5)])
def test_speculation_with_the_confidence_floor_through_a_peer_is_exact(drafts, tiny_llama, params):
    """No --k: once rounds are measured the host drafts up to k_max while the draft is sure enough, and the
    look-ahead (a peer process: drafting while the round is on the wire) uses the same floor. K as chosen over
    an 86 ms link: on loopback a tiny target's round costs so little that drafting rarely pays."""
    policy = RecordingPolicy(86.0)
    r = trio.run(lambda: answer(tiny_llama, str(drafts["trained"]), prompt=PROMPT, params=params, max_new=48,
                                peers=1, policy=policy))
    if params.greedy:
        assert r.token_ids == reference_ids(tiny_llama, PROMPT, 48)
    # (a sampled answer may draw the end of turn early: which drafts it saw depends on the timing)
    assert (len(r.token_ids) == 48 or r.finish == "eos") and r.stats.drafted > 0
    # after the first measured round every plan is (k_max, a floor), and the floor, not k_max, ended the drafts
    assert all(k == policy.k_max and floor > 0 for k, floor in policy.plans[2:])
    assert all(rd["k"] < MAX_NODES for rd in r.rounds[2:])
    assert any(rd["tree"] for rd in r.rounds)  # sampled rounds too draft trees (peers/speculation/tree_sampling.py)
