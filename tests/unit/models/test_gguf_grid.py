"""A GGUF's 4-bit matrices taken on their own grid: the codes, offsets and steps gguf's blocks hold, and an int4
layer filled from them with no float copy."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T, dequantize, quantize
from safetensors.numpy import save_file

from peers.compute import cpu_quant as cq
from peers.models.gguf_grid import GRID_FILE, grid_of, on_grid, stored_grid


def q4_k_blocks(rows: int, cols: int, rng) -> np.ndarray:
    """Random Q4_K super-blocks (256 weights, 144 bytes: d, dmin, 12 bytes of 6-bit scales and mins, 128 of
    codes) with positive scales, as a quantizer leaves them."""
    b = rng.integers(0, 256, (rows, cols // 256, 144), dtype=np.uint8)
    b[..., 0:4] = np.frombuffer(rng.uniform(0.001, 0.02, (rows, cols // 256, 2)).astype(np.float16).tobytes(),
                                np.uint8).reshape(rows, cols // 256, 4)
    return b.reshape(rows, -1)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q4_K])
def test_codes_offsets_and_steps_give_back_gguf_s_own_weights_exactly(qtype):
    rng = np.random.default_rng(int(qtype))
    rows, cols = 48, 512
    if qtype == T.Q4_K:
        data = q4_k_blocks(rows, cols, rng)
    else:
        data = quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, qtype)
    codes, offset, step = grid_of(data, qtype)
    assert codes.shape == (rows, cols) and offset.shape == step.shape == (rows, cols // 32)
    assert codes.max() == 15 and codes.min() == 0
    assert np.array_equal(on_grid(codes, offset, step), dequantize(data, qtype))
    if qtype == T.Q4_0:
        assert np.array_equal(offset, -8 * step)  # Q4_0: w = d (q - 8)


def test_weights_off_any_grid_are_refused():
    data = quantize(np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32), T.Q8_0)
    with pytest.raises(KeyError):
        grid_of(data, T.Q8_0)  # not a 4-bit type: never asked
    q41 = quantize(np.random.default_rng(4).standard_normal((16, 64)).astype(np.float32), T.Q4_1)
    bad = q41.copy()
    bad[:, 0:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)  # a block's d is no number
    assert grid_of(bad, T.Q4_1) is None


def test_an_int4_layer_filled_from_the_grid_multiplies_by_gguf_s_matrix(tmp_path):
    rng = np.random.default_rng(5)
    rows, cols = 64, 256
    data = quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.05, T.Q4_1)
    codes, offset, step = grid_of(data, T.Q4_1)
    save_file({"m.weight.codes": codes[:, 0::2] | (codes[:, 1::2] << 4), "m.weight.offset": offset,
               "m.weight.step": step}, tmp_path / GRID_FILE)
    layer = cq.Int4Linear(cols, rows)
    cq.take_grid(layer, stored_grid(tmp_path)["m.weight"])
    assert layer.weight is None and layer.packed.dtype == torch.uint8
    w = torch.from_numpy(dequantize(data, T.Q4_1))
    # the kernel's scale and zero are bfloat16: the matrix is gguf's within their rounding
    grid = torch.from_numpy(codes).float().reshape(rows, -1, 32)
    s, z = layer.scales_zeros[..., 0].t().float()[..., None], layer.scales_zeros[..., 1].t().float()[..., None]
    assert torch.equal(s[..., 0], torch.from_numpy(step).to(torch.bfloat16).float())
    torch.testing.assert_close(((grid - 8) * s + z).reshape(rows, cols), w, rtol=0, atol=float(w.abs().max()) / 64)
    assert torch.equal(cq.dequantize(layer), ((grid - 8) * s + z).reshape(rows, cols).to(torch.bfloat16).float())
