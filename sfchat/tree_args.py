"""The flags that shape a round: its drafts as a tree or a chain, and how many rounds of one conversation are on
the ring at once (ask, host, serve and bench share them)."""
from __future__ import annotations

import argparse

from .arg_types import at_least, in_flight, in_flight_list

IN_FLIGHT_HELP = ("rounds of one conversation on the ring at once: 1 waits for each round before sending the next; "
                  "auto lets the policy choose from the measured round trip and pass costs")


def tree_args(p: argparse.ArgumentParser) -> None:
    from peers import MAX_NODES

    p.add_argument("--tree-nodes", type=at_least(1, MAX_NODES), metavar="N",
                   help="pin the drafted positions a round: a tree of N nodes, or with --no-trees a chain of N "
                   "(default: as many as a pass's cost makes worth it)")
    p.add_argument("--no-trees", action="store_true", help="draft in chains, never trees (to compare the two)")


def in_flight_arg(p: argparse.ArgumentParser) -> None:
    """ask, host and serve: one value."""
    p.add_argument("--in-flight", type=in_flight, metavar="N|auto", help=IN_FLIGHT_HELP + " (default: auto)")


def in_flight_rows_arg(p: argparse.ArgumentParser) -> None:
    """bench: a comma list, a ring-spec row for each value (rounds in flight against one, in the same run)."""
    p.add_argument("--in-flight", type=in_flight_list, default=[None, 1], metavar="N|auto,…",
                   help=IN_FLIGHT_HELP + "; a ring-spec row for each value of the list (default: auto,1: rounds in "
                   "flight and one at a time, in the same run, over the same prompts)")
