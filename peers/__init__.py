"""The sfchat engine: wire codec, shards, peer server, ring, drafting, verification."""
