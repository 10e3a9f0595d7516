"""The wire format: length-prefixed CBOR frames, tensors as raw bytes, frame schemas."""
