"""sfchat: chat with one language model split across several machines."""
import peers  # noqa: F401  the engine's environment defaults, set before anything loads torch

__version__ = "0.1.0"
