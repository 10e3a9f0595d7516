"""The suite runs in pytest-xdist workers (scripts/test), so a test must not depend on another's order or leftovers:
ports from 0 (or helpers.free_port), files under tmp_path. Tests of one module that share a ring or a server take it
from a module-scoped fixture: they then run on one worker, which makes it once. A test that asserts on a time
(a median, an echo in ms) is marked `serial` and runs with no other test beside it. A skip says what is missing
("needs ..."): the run ends with one line per reason."""
import fcntl
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))  # helpers, tiny models, the zygote

# the real SmolLM2 is pulled once into a cache that survives test runs; nothing touches the user's own dirs
os.environ.setdefault("SFCHAT_MODELS_DIR", str(ROOT / ".cache" / "models"))
# exactness tests compare with float32 transformers: --dtype auto stays float32 on a CPU with native bfloat16 too
# (peers/compute/memory.py: cpu_bf16); the tests of bfloat16 and of auto's choice name theirs
os.environ.setdefault("SFCHAT_CPU_DTYPE", "float32")
os.environ.setdefault("SFCHAT_CPU_QUANT", "none")  # (and --quant auto keeps the embedded default in float)


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("SFCHAT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SFCHAT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SFCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SFCHAT_MODELS_DIR", os.environ["SFCHAT_MODELS_DIR"])
    for name in ("TMUX", "DISPLAY", "WAYLAND_DISPLAY"):  # copying never reaches the user's tmux or clipboard
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True, scope="session")
def forked_local_peers():
    """Rings brought up in this process by `sfchat ask`'s own open_ring (SharedRing, the app's tests) fork their
    local peers from a process that has imported torch once (tests/support/forked_peers.py), as running_ring does."""
    import sfchat.runtime
    from forked_peers import ForkedLocalPeers

    fresh, sfchat.runtime.LocalPeers = sfchat.runtime.LocalPeers, ForkedLocalPeers
    yield
    sfchat.runtime.LocalPeers = fresh


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    from tiny import make_model
    return make_model(tmp_path_factory.mktemp("tiny-llama"), "llama", layers=4, seed=1)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory):
    from tiny import make_model
    return make_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", layers=5, seed=2)


@pytest.fixture(scope="session")
def sliding_qwen2(tmp_path_factory):
    """Qwen2 whose last two layers attend through a window of 4 positions (shorter than any test's context)."""
    from tiny import make_model
    return make_model(tmp_path_factory.mktemp("sliding-qwen2"), "qwen2", layers=4, seed=3, use_sliding_window=True,
                      sliding_window=4, max_window_layers=2)


@pytest.fixture(scope="session")
def smollm2():
    from peers.models import source as models
    return models.resolve("smollm2-135m", say=lambda *a: None)


LONGEST = ("test_soak", "test_tui_tmux", "test_partial_ring", "test_long_context", "test_distill")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` run where a GPU is (scripts/gpu_check); elsewhere they skip, saying why. Under
    pytest-xdist (--dist loadgroup), the tests that share a module-scoped fixture (a ring, a server) run on one
    worker, so that it is made once; every other test goes to whichever worker is free."""
    import torch

    # the longest go first, so that no worker is left running one alone at the end
    items.sort(key=lambda item: LONGEST.index(item.module.__name__) if item.module.__name__ in LONGEST else len(LONGEST))
    for item in items:
        if any(d.scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (scripts/gpu_check runs these)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """Under pytest-xdist, a test marked `serial` runs with no other test beside it (its set-up included): it
    times something that a second worker on two cores would slow. Two lock files shared by the workers: `turn`
    lets one test in at a time (a serial one holds it throughout, so no new test starts), `ring` is held shared
    by every running test and exclusively by a serial one, which so waits for those already running."""
    if not hasattr(item.config, "workerinput"):  # one process runs every test in turn anyway
        yield
        return
    folder = Path(item.config.option.basetemp).parent  # the run's temporary folder; each worker has one in it
    with open(folder / "serial.turn", "a") as turn, open(folder / "serial.ring", "a") as ring:
        serial = item.get_closest_marker("serial") is not None
        fcntl.flock(turn, fcntl.LOCK_EX)
        fcntl.flock(ring, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        if not serial:
            fcntl.flock(turn, fcntl.LOCK_UN)
        yield  # (the files' locks go with them when they close)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """Why tests were skipped, one line per reason: "15 skipped: needs an NVIDIA GPU (...)"."""
    reasons = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    for reason, n in reasons.most_common():
        terminalreporter.write_line(f"{n} skipped: {reason}")

# no test reaches the real hub: tests/app/test_hub.py turns this off for its own processes, pointed at a stand-in
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# the tests written before placement by speed meant the split by memory (their spans, their members' layers);
# a test of placement by speed asks for it (--placement speed, or SFCHAT_PLACEMENT=speed in its processes)
os.environ.setdefault("SFCHAT_PLACEMENT", "memory")
# nor do they need each member's second of timing as it joins (tests/unit/compute/test_speed.py times for real)
os.environ.setdefault("SFCHAT_TEST_MS_PER_LAYER", "1.0")
