import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

# the real SmolLM2 is pulled once into a cache that survives test runs; nothing touches the user's own dirs
os.environ.setdefault("SFCHAT_MODELS_DIR", str(ROOT / ".cache" / "models"))


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("SFCHAT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SFCHAT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SFCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SFCHAT_MODELS_DIR", os.environ["SFCHAT_MODELS_DIR"])
    for name in ("TMUX", "DISPLAY", "WAYLAND_DISPLAY"):  # copying never reaches the user's tmux or clipboard
        monkeypatch.delenv(name, raising=False)


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
    from peers import models
    return models.resolve("smollm2-135m", say=lambda *a: None)


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` run where a GPU is (scripts/gpu_check); elsewhere they skip, saying why."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (scripts/gpu_check runs these)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)

# no test reaches the real hub: tests/test_hub.py turns this off for its own processes, pointed at a stand-in
os.environ.setdefault("HF_HUB_OFFLINE", "1")
