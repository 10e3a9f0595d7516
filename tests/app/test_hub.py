"""Models fetched from the hub (peers/models/hub.py) through the real huggingface_hub against a stand-in on 127.0.0.1
(tests/support/hubstub.py), every process with its own Hugging Face cache and its own stand-in, so the requests each one
made can be counted: members fetch only their layers' files, the host the embedding, head and tokenizer; a second
start needs no hub; offline mode reads the cache and names what is missing; a dropped download resumes."""
import json
import re
import subprocess
import sys

import pytest

from helpers import ROOT, child_env, free_port, reference_ids
from hubstub import COMMIT, HubStub, shard_by_layer
from tiny import make_model

PROMPT = "hello world, the quick brown fox"
REPO = "acme/tiny"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A 6-layer model on the stand-in: one file per layer and one for the embedding, norm and head."""
    base = tmp_path_factory.mktemp("hub")
    plain = make_model(base / "plain", "qwen2", layers=6, seed=5)
    return plain, shard_by_layer(plain, base / "repo")


def env_for(hf_home, hub: HubStub | None = None, offline: bool = False, endpoint: str | None = None) -> dict:
    env = child_env(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1" if offline else "0")
    env.pop("HF_HUB_CACHE", None)
    env["HF_ENDPOINT"] = endpoint or (hub.url if hub else "http://127.0.0.1:9")  # port 9: nothing listens
    return env


def run(args, env, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sfchat", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def ask(env, *extra) -> dict:
    p = run(["ask", PROMPT, "--json", "--model", REPO, "--max-new-tokens", "12", "--draft", "none", *extra], env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def layer_files(repo_dir, layers: str) -> set[str]:
    """The files holding layers "a-b" of the repo."""
    a, b = map(int, layers.split("-"))
    wm = json.loads((repo_dir / "model.safetensors.index.json").read_text())["weight_map"]
    return {f for k, f in wm.items() if (m := re.match(r"model\.layers\.(\d+)\.", k)) and a <= int(m.group(1)) <= b}


def ask_with_joiners(tmp_path, hub: HubStub, joiners: dict[str, HubStub]):
    """`sfchat ask` hosting a ring of REPO with its own stand-in, and a headless joiner (no --model) per entry, each
    with its own; (the host's exit code, stdout, stderr, [(each joiner's exit code, its log)]). Joiners still
    serving when the answer is done are terminated."""
    port, token = free_port(), "t" * 32
    host = subprocess.Popen([sys.executable, "-m", "sfchat", "ask", PROMPT, "--json", "--model", REPO,
                             "--max-new-tokens", "12", "--draft", "none", "--listen", f"127.0.0.1:{port}",
                             "--token", token, "--wait-peers", str(len(joiners))], env=env_for(tmp_path / "host", hub),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    procs = []
    try:
        for line in host.stderr:  # the invite: the host listens now
            if "sfchat join" in line:
                break
        procs = [subprocess.Popen([sys.executable, "-m", "sfchat", "join", f"127.0.0.1:{port}", "--token", token,
                                   "--headless", "--listen", "127.0.0.1:0", "--name", name],
                                  env=env_for(tmp_path / name, h), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, cwd=ROOT)
                 for name, h in joiners.items()]
        out, err = host.communicate(timeout=300)
    finally:
        host.kill()
        for j in procs:
            j.terminate()
        logs = [j.communicate(timeout=30)[0] for j in procs]
    return host.returncode, out, err, [(j.returncode, log) for j, log in zip(procs, logs)]


def test_each_member_fetches_only_its_layers_and_the_joiner_needs_no_model(repo, tmp_path):
    plain, repo_dir = repo
    want = reference_ids(plain, PROMPT, 12)
    with HubStub({REPO: repo_dir}) as h0, HubStub({REPO: repo_dir}) as h1, HubStub({REPO: repo_dir}) as h2:
        code, out, err, joined = ask_with_joiners(tmp_path, h0, {"m1": h1, "m2": h2})
    logs = [log for _, log in joined]
    assert code == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert got["token_ids"] == want
    layers = {m["name"]: m["layers"] for m in got["stats"]["members"]}
    assert all(layers.values()), layers
    outer = {json.loads((repo_dir / "model.safetensors.index.json").read_text())["weight_map"]["model.embed_tokens.weight"]}
    for name, hub in (("m1", h1), ("m2", h2)):  # exactly the files of its own layers, and config and index
        assert set(hub.gets(".safetensors")) == layer_files(repo_dir, layers[name]), (name, layers)
        assert set(hub.gets()) - layer_files(repo_dir, layers[name]) == {"config.json", "model.safetensors.index.json"}
    host = set(h0.gets())
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= host
    assert set(h0.gets(".safetensors")) == layer_files(repo_dir, layers["host"]) | outer
    assert all(f"{REPO}@{COMMIT}" in log and "fetching the files of layers" in log for log in logs), logs


def test_a_second_start_needs_no_hub_and_offline_names_a_missing_file(repo, tmp_path):
    plain, repo_dir = repo
    want = reference_ids(plain, PROMPT, 12)
    with HubStub({REPO: repo_dir}) as hub:
        assert ask(env_for(tmp_path, hub))["token_ids"] == want
        assert len(hub.gets(".safetensors")) == 7
    # the stand-in is gone: everything comes from the cache
    assert ask(env_for(tmp_path))["token_ids"] == want
    assert ask(env_for(tmp_path, offline=True))["token_ids"] == want
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / COMMIT
    (snap / "model-00003-of-00007.safetensors").unlink()
    p = run(["ask", PROMPT, "--model", REPO, "--draft", "none"], env_for(tmp_path, offline=True))
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith("sfchat ask:") and "model-00003-of-00007.safetensors" in lines[-1], p.stderr
    assert "HF_HUB_OFFLINE" in lines[-1]
    p = run(["ask", PROMPT, "--model", "acme/other", "--draft", "none"], env_for(tmp_path, offline=True))
    assert p.returncode == 1 and "acme/other" in p.stderr.strip().splitlines()[-1] and "config.json" in p.stderr


def test_a_dropped_download_resumes_where_it_stopped(tmp_path):
    """huggingface_hub writes a file in 10 MB chunks and, when the connection drops, asks for the rest only."""
    big = make_model(tmp_path / "big", "llama", layers=1, seed=6, vocab_pad=110_000)  # a 28 MB embedding
    name = "model.safetensors"
    with HubStub({"acme/big": big}) as hub:
        hub.cut[name] = 12 << 20  # the first GET of the weights stops after 12 MB
        p = run(["pull", "acme/big"], env_for(tmp_path / "hf", hub))
        assert p.returncode == 0, p.stderr[-2000:]
        tries = [r for m, f, r in hub.requests if m == "GET" and f == name]
    assert len(tries) == 2 and tries[0] == "" and tries[1].startswith("bytes="), tries
    assert 0 < int(tries[1][6:-1]) <= 12 << 20  # the second GET asked only for what was not on disk
    snap = tmp_path / "hf" / "hub" / "models--acme--big" / "snapshots" / COMMIT
    assert (snap / name).read_bytes() == (big / name).read_bytes()


def test_hub_errors_are_one_line_naming_model_and_file(repo, tmp_path):
    _, repo_dir = repo
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in repo_dir.iterdir():
        if f.name != "model-00004-of-00007.safetensors":
            (broken / f.name).write_bytes(f.read_bytes())
    with HubStub({REPO: repo_dir, "acme/broken": broken}) as hub:
        for model, words in (("acme/broken", ["acme/broken", "model-00004-of-00007.safetensors"]),
                             ("acme/nothing", ["acme/nothing"]), (f"{REPO}@v9", [REPO, "v9"])):
            p = run(["pull", model], env_for(tmp_path / model.replace("/", "_"), hub))
            assert p.returncode == 1
            lines = p.stderr.strip().splitlines()
            assert lines[-1].startswith("sfchat pull:") and all(w in lines[-1] for w in words), p.stderr
        p = run(["pull", REPO], env_for(tmp_path / "dead", endpoint="http://127.0.0.1:9"))
        assert p.returncode == 1 and "acme/tiny" in p.stderr.strip().splitlines()[-1], p.stderr
        # one quick check finds the hub out of reach: no half minute of huggingface_hub's retries
        assert "the hub is out of reach" in p.stderr.strip().splitlines()[-1] and "Retrying" not in p.stderr


def test_a_joiner_that_cannot_fetch_says_which_file_and_the_ring_answers_without_it(repo, tmp_path):
    """m2's stand-in lacks every layer file: m2 ends with one line naming the model and the file, and the host
    re-plans over itself and m1 and answers exactly."""
    plain, repo_dir = repo
    want = reference_ids(plain, PROMPT, 12)
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in repo_dir.iterdir():
        if f.name not in layer_files(repo_dir, "0-5"):
            (broken / f.name).write_bytes(f.read_bytes())
    with HubStub({REPO: repo_dir}) as h0, HubStub({REPO: repo_dir}) as h1, HubStub({REPO: broken}) as h2:
        code, out, err, (_, (m2_code, m2_log)) = ask_with_joiners(tmp_path, h0, {"m1": h1, "m2": h2})
    assert code == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert got["token_ids"] == want
    assert {m["name"] for m in got["stats"]["members"] if m["layers"]} == {"host", "m1"}, got["stats"]["members"]
    last = m2_log.strip().splitlines()[-1]
    assert m2_code not in (0, -15) and last.startswith("sfchat join:"), m2_log[-3000:]
    assert REPO in last and re.search(r"model-\d{5}-of-\d{5}\.safetensors", last), last
