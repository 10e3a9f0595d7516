"""The flags that shape a round's drafts as a tree or a chain (ask, host, serve and bench share them)."""
from __future__ import annotations

import argparse

from .arg_types import at_least


def tree_args(p: argparse.ArgumentParser) -> None:
    from peers.plan import MAX_NODES

    p.add_argument("--tree-nodes", type=at_least(1, MAX_NODES), metavar="N",
                   help="pin the drafted positions a round: a tree of N nodes, or with --no-trees a chain of N "
                   "(default: as many as a pass's cost makes worth it)")
    p.add_argument("--no-trees", action="store_true", help="draft in chains, never trees (to compare the two)")

