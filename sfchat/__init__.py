"""sfchat: chat with one language model split across several machines."""
import os

# Ring stages take turns on the same cores: OpenMP threads that spin-wait after their work would steal the
# next stage's CPU (docs/benchmarks.md). Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
