"""`sfchat serve`: an OpenAI-compatible HTTP endpoint on the ring (see server.py)."""
