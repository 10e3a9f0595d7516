"""Tokens per round and tokens/s of a serving ring with and without a JSON schema, on the same prompts, requests
alternating (with, without, with, ...). Medians over the prompts, and their ratio.

Usage: python scripts/grammar_rounds.py URL API_KEY [--rounds N] [--max-tokens M]
(against `sfchat serve ... --api-key KEY`; URL like http://127.0.0.1:8000/v1)
"""
from __future__ import annotations

import argparse
import json
import statistics

import openai

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "city": {"type": "string", "maxLength": 40},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}},
    "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}
TOPICS = ["a chef", "a pilot", "a painter", "a sailor", "a doctor", "a farmer", "a teacher", "a poet"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("key")
    ap.add_argument("--max-tokens", type=int, default=120)
    args = ap.parse_args()
    c = openai.OpenAI(base_url=args.url, api_key=args.key, max_retries=0)
    model = c.models.list().data[0].id
    rows = {"schema": [], "free": []}
    for topic in TOPICS:
        messages = [{"role": "user", "content": f"Describe {topic} as JSON with name, age, city and hobbies."}]
        for kind in ("schema", "free"):
            fmt = {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}} \
                if kind == "schema" else {}
            r = c.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens, temperature=0,
                                          **fmt)
            s = r.model_extra["sfchat"]
            if kind == "schema":
                json.loads(r.choices[0].message.content)  # (it must parse)
            rows[kind].append((s["tokens_per_round"], s["tokens_per_second"], r.usage.completion_tokens))
    med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in rows.items()}
    for k, (tpr, tps, n) in med.items():
        print(f"{k:>6}: {tpr:.2f} tokens/round, {tps:.1f} tokens/s, {n:.0f} tokens (medians of {len(rows[k])})")
    print(f"schema / free: tokens/round {med['schema'][0] / med['free'][0]:.2f}x, "
          f"tokens/s {med['schema'][1] / med['free'][1]:.2f}x")


if __name__ == "__main__":
    main()
