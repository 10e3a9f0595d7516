"""A peer process: its control plane (join, offer, load, ping) and its data plane (passes)."""
