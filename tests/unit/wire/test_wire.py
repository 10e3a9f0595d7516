"""The codec alone: frames, tensors, limits. Pure functions, no sockets."""
import cbor2
import pytest
import torch
from hypothesis import given, settings, strategies as st

from peers.wire import tensors, codec as wire

MSG = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(max_size=20) | st.binary(max_size=40),
                   lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)
# a message's own fields: "raw" is the codec's (the count of raw bytes after the body), "t" the type set below
FIELDS = st.dictionaries(st.text(max_size=8).filter(lambda k: k not in ("raw", "t")), MSG, max_size=5)


@given(FIELDS, st.integers(1, 50))
def test_frames_round_trip_whatever_the_chunking(fields, chunk):
    msg = {**fields, "t": "x"}
    data = wire.encode(msg) * 3
    dec = wire.FrameDecoder()
    out = []
    for i in range(0, len(data), chunk):
        out += dec.feed(data[i:i + chunk])
    assert out == [msg] * 3 and not dec.buf


@given(FIELDS, st.binary(min_size=1, max_size=20))
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


@given(FIELDS, st.binary(max_size=300), st.integers(1, 50))
def test_raw_bytes_follow_their_frame_whatever_the_chunking(fields, raw, chunk):
    msg = {**fields, "t": "x", "raw": raw}
    data = wire.encode(msg) + wire.encode({"t": "after"})
    dec, out = wire.FrameDecoder(), []
    for i in range(0, len(data), chunk):
        out += dec.feed(data[i:i + chunk])
    assert [bytes(m["raw"]) for m in out[:1]] == [raw] and out[0] == {**msg, "raw": out[0]["raw"]}
    assert out[1] == {"t": "after"} and len(out) == 2 and not dec.buf


def test_raw_bytes_land_where_the_receiver_says_once_it_has_seen_the_body():
    place, seen = bytearray(5), []

    def into(msg, n):
        seen.append((msg["t"], n))
        return place
    dec = wire.FrameDecoder(into=into)
    data = wire.encode({"t": "x", "raw": b"hello"})
    (msg,) = dec.feed(data[:-2]) + dec.feed(data[-2:])
    assert seen == [("x", 5)] and place == b"hello" and msg["raw"].obj is place


@pytest.mark.parametrize("raw", [-1, "5", True, 1 << 27])
def test_a_raw_count_that_is_not_one_or_exceeds_the_frame_is_refused_before_the_bytes(raw):
    with pytest.raises(wire.WireError, match="raw"):
        dec = wire.FrameDecoder(into=lambda msg, n: pytest.fail("asked for a buffer"))
        dec.feed(wire.encode({"t": "x", "raw": raw}))


def test_a_frame_too_big_with_its_raw_bytes_is_not_sent():
    with pytest.raises(wire.WireError, match="exceeds"):
        wire.frame({"t": "x", "raw": memoryview(bytearray(wire.MAX_FRAME))})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_tensor_round_trip(dtype):
    t = (torch.randn(1, 3, 8) * 100).to(dtype)
    header, raw = tensors.host_bytes(t)
    dec = wire.FrameDecoder(into=lambda msg, n: tensors.landing(msg["x"], n))
    (msg,) = dec.feed(wire.encode({"t": "x", "x": header, "raw": raw}))
    back = tensors.from_bytes(msg["x"], msg["raw"])
    assert back.dtype == dtype and torch.equal(back, t)


def test_a_tensor_goes_out_from_its_own_memory_and_in_without_a_copy():
    t = torch.randn(2, 4)
    header, raw = tensors.host_bytes(t)
    assert raw.obj.__array_interface__["data"][0] == t.data_ptr()  # the bytes sent are the tensor's own
    back = tensors.from_bytes(header, raw)
    back[0, 0] = 7.0
    assert t[0, 0] == 7.0  # and the tensor read from them shares them


def test_wire_dtype_conversion():
    t = torch.randn(1, 2, 4)
    header, raw = tensors.host_bytes(t, torch.float16)
    assert header["dtype"] == "float16" and torch.allclose(tensors.from_bytes(header, raw).float(), t, atol=1e-2)


@pytest.mark.parametrize("bad,n", [
    ({"dtype": "float64", "shape": [1]}, 8),
    ({"dtype": "float32", "shape": [2]}, 4),
    ({"dtype": "float32", "shape": [-1]}, 0),
    ({"dtype": "float32", "shape": "12"}, 0),
    ({"dtype": "float32", "shape": [1 << 20, 1 << 20]}, 0),
    ([1, 2, 3], 0),
])
def test_bad_tensors_are_refused(bad, n):
    with pytest.raises(wire.WireError):
        tensors.landing(bad, n)
    with pytest.raises(wire.WireError):
        tensors.from_bytes(bad, bytearray(n))


def test_tensor_bytes_must_come_raw():
    with pytest.raises(wire.WireError, match="raw"):
        tensors.from_bytes({"dtype": "float32", "shape": [1]}, None)


@given(st.dictionaries(st.sampled_from(["dtype", "shape", "x"]),
                       st.none() | st.integers() | st.text(max_size=8) | st.binary(max_size=16)
                       | st.lists(st.integers(-3, 1 << 40), max_size=5)), st.binary(max_size=16))
def test_tensor_decoding_is_total(d, raw):
    try:
        tensors.from_bytes(d, bytearray(raw))
    except wire.WireError:
        pass
