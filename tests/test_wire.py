"""The codec alone: frames, tensors, limits. Pure functions, no sockets."""
import cbor2
import pytest
import torch
from hypothesis import given, settings, strategies as st

from peers import tensors, wire

MSG = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(max_size=20) | st.binary(max_size=40),
                   lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)


@given(st.dictionaries(st.text(max_size=8), MSG, max_size=5), st.integers(1, 50))
def test_frames_round_trip_whatever_the_chunking(fields, chunk):
    msg = {**fields, "t": "x"}
    data = wire.encode(msg) * 3
    dec = wire.FrameDecoder()
    out = []
    for i in range(0, len(data), chunk):
        out += dec.feed(data[i:i + chunk])
    assert out == [msg] * 3 and not dec.buf


@given(st.dictionaries(st.text(max_size=8), MSG, max_size=5), st.binary(min_size=1, max_size=20))
def test_reading_what_is_needed_stops_at_the_frame_end(fields, after):
    """A channel reads what the decoder still needs: one frame out, and the bytes after it left unread."""
    msg = {**fields, "t": "x"}
    data = wire.encode(msg) + after
    dec, pos, out = wire.FrameDecoder(), 0, []
    while not out:
        n = dec.needed()
        assert n > 0
        out, pos = dec.feed(data[pos:pos + n]), pos + n
    assert out == [msg] and data[pos:] == after and not dec.buf


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_random_bytes_never_crash_the_decoder(data):
    dec = wire.FrameDecoder(limit=1 << 16)
    try:
        for m in dec.feed(data):
            assert isinstance(m, dict) and isinstance(m["t"], str)
    except wire.WireError:
        pass


def test_size_is_checked_before_the_body():
    with pytest.raises(wire.WireError, match="exceeds"):
        wire.FrameDecoder().feed(b"\xff\xff\xff\xff")  # 4 GB announced, nothing else sent


@pytest.mark.parametrize("body", [cbor2.dumps([1, 2]), cbor2.dumps({"t": 5}), b"\xff\x00", cbor2.dumps({"x": 1})])
def test_non_messages_are_refused(body):
    with pytest.raises(wire.WireError):
        wire.decode_body(body)


def test_deep_nesting_is_refused():
    deep = {"t": "x"}
    for _ in range(100):
        deep = {"t": "x", "d": deep}
    with pytest.raises(wire.WireError):
        wire.decode_body(cbor2.dumps(deep))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_tensor_round_trip(dtype):
    t = (torch.randn(1, 3, 8) * 100).to(dtype)
    back = tensors.unpack_tensor(wire.decode_body(wire.encode({"t": "x", "x": tensors.pack_tensor(t)})[4:])["x"])
    assert back.dtype == dtype and torch.equal(back, t)


def test_wire_dtype_conversion():
    t = torch.randn(1, 2, 4)
    d = tensors.pack_tensor(t, torch.float16)
    assert d["dtype"] == "float16" and torch.allclose(tensors.unpack_tensor(d).float(), t, atol=1e-2)


@pytest.mark.parametrize("bad", [
    {"dtype": "float64", "shape": [1], "data": b"\0" * 8},
    {"dtype": "float32", "shape": [2], "data": b"\0" * 4},
    {"dtype": "float32", "shape": [-1], "data": b""},
    {"dtype": "float32", "shape": "12", "data": b""},
    {"dtype": "float32", "shape": [1 << 20, 1 << 20], "data": b""},
    {"dtype": "float32", "shape": [1], "data": "text"},
    [1, 2, 3],
])
def test_bad_tensors_are_refused(bad):
    with pytest.raises(wire.WireError):
        tensors.unpack_tensor(bad)


@given(st.dictionaries(st.sampled_from(["dtype", "shape", "data", "x"]),
                       st.none() | st.integers() | st.text(max_size=8) | st.binary(max_size=16)
                       | st.lists(st.integers(-3, 1 << 40), max_size=5)))
def test_tensor_decoding_is_total(d):
    try:
        tensors.unpack_tensor(d)
    except wire.WireError:
        pass
