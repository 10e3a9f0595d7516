"""The soak (scripts/soak): a ring of real processes killed, fuzzed and loaded at once, every answer checked."""
