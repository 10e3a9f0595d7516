"""The sfchat engine: wire codec, shards, peer server, ring, drafting, verification."""
import os

# Ring stages take turns on the same cores: OpenMP threads that spin-wait after their work would steal the
# next stage's CPU (docs/benchmarks.md). Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# transformers' from_pretrained swaps in kernels fetched from the hub on CUDA by default; the ring runs
# transformers' own layers, so drafts and bench's baseline must too (same numerics, nothing fetched at load).
os.environ.setdefault("USE_HUB_KERNELS", "0")
