"""A CPU's big float32 linear layers computed as W @ x^T (peers/compute/cpu_linear.py): the same products as F.linear on
every shape a pass gives them, and only where they apply."""
import pytest
import torch
import torch.nn.functional as F

from peers.compute import cpu_linear
from peers.compute.cpu_linear import BIG, ColumnsLinear, columns_win, use_columns
from peers.base.span import Span
from peers.compute.shard import Shard
from tiny import make_model, one

IN = 64
OUT = BIG // IN + 1  # just past BIG: a head's shape


@pytest.fixture(scope="module")
def big():
    torch.manual_seed(0)
    return torch.nn.Linear(IN, OUT, bias=True)


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (1, 3), (2, 4), (1, 8), (1, 9), (1, 0)])
@pytest.mark.parametrize("bias", [False, True])
def test_same_products_as_linear(big, shape, bias):
    lin = torch.nn.Linear(IN, OUT, bias=bias)
    lin.load_state_dict({"weight": big.weight, **({"bias": big.bias} if bias else {})})
    use_columns(lin, win=True)
    assert type(lin) is ColumnsLinear
    x = torch.randn(*shape, IN)
    with torch.inference_mode():
        y = lin(x)
    assert y.shape == (*shape, OUT)
    torch.testing.assert_close(y, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_only_big_plain_float32_linears_on_a_cpu(big):
    class Own(torch.nn.Linear):
        pass

    m = torch.nn.ModuleDict({"big": big, "small": torch.nn.Linear(IN, 4),
                             "bf16": torch.nn.Linear(IN, OUT).to(torch.bfloat16), "own": Own(IN, OUT)})
    use_columns(m, None, win=True)
    assert type(m["big"]) is ColumnsLinear
    assert type(m["small"]) is torch.nn.Linear and type(m["bf16"]) is torch.nn.Linear and type(m["own"]) is Own
    use_columns(m, win=True)  # again: nothing changes
    assert type(m["big"]) is ColumnsLinear


def test_only_on_cpus_where_it_was_measured_to_win(tmp_path, big):
    for vendor, wins in (("AuthenticAMD", True), ("GenuineIntel", False)):
        (tmp_path / vendor).write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu avx2\n")
        assert columns_win(str(tmp_path / vendor)) is wins
    assert columns_win(str(tmp_path / "none")) is False
    lin = torch.nn.Linear(IN, OUT, bias=False)
    use_columns(lin, win=False)
    assert type(lin) is torch.nn.Linear


def test_a_cpu_shard_computes_its_head_so_and_gives_the_same_logits(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_linear, "columns_win", lambda: True)
    model = make_model(tmp_path / "m", "llama", layers=2, vocab_pad=OUT)  # a vocabulary past BIG
    shard = Shard(model, Span(0, 2, 2), embed=True, head=True)
    assert type(shard.lm_head) is ColumnsLinear
    ids = torch.arange(5)[None] + 3
    h = one(shard, shard.new_session(), 0, ids)
    _, logits = shard.finish([(h[0], 3)])[0]
    want = F.linear(shard.norm(h[0])[-3:], shard.lm_head.weight)
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
