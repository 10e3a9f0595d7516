"""The host's side of the ring: rounds and long passes, its own stage, the return link, batching and turns."""
