"""The flags that shape a round's drafts as a tree or a chain (ask, host, serve and bench share them)."""
from __future__ import annotations

import argparse


def tree_args(p: argparse.ArgumentParser) -> None:
    from peers.plan import MAX_NODES

    p.add_argument("--tree-nodes", type=_in_int_range(1, MAX_NODES), metavar="N",
                   help="pin the drafted positions a round: a tree of N nodes, or with --no-trees a chain of N "
                   "(default: as many as a pass's cost makes worth it)")
    p.add_argument("--no-trees", action="store_true", help="draft in chains, never trees (to compare the two)")


def _in_int_range(low: int, high: int):
    def check(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"must be in {low}..{high}, got {text}")
        return n
    return check
