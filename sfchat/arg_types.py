"""Argument types of sfchat's commands: each refuses a bad value in argparse's one line."""
from __future__ import annotations

import argparse
import math


def at_least(low: int, high: int | None = None):
    """A whole number of at least `low` (and at most `high`)."""
    def check(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < low or (high is not None and n > high):
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {n}" if high is None
                                             else f"must be in {low}..{high}, got {n}")
        return n
    return check


def in_range(low: float, high: float):
    def check(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= x <= high:
            raise argparse.ArgumentTypeError(f"must be in {low:g}..{high:g}, got {text}")
        return x
    return check


def gigabytes(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GB") from None
    if not (math.isfinite(x) and x >= 0):
        raise argparse.ArgumentTypeError(f"must be 0 or more GB, got {text}")
    return x


def in_flight(text: str) -> int | None:
    """--in-flight: `auto` (None: the policy chooses) or a whole number of at least 1."""
    text = text.strip()
    if text == "auto":
        return None
    try:
        return at_least(1)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be auto or a whole number of 1 or more, got {text!r}") from None


def in_flight_list(text: str) -> list[int | None]:
    """bench's --in-flight: a comma list of in_flight values, a row for each."""
    values = [in_flight(x) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("needs at least one value: auto or a whole number of 1 or more")
    return list(dict.fromkeys(values))  # each once, in the order given


def duration(text: str) -> float:
    """Seconds, from `90`, `90s`, `5m` or `1h`."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        x = float(number) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (90, 90s, 5m or 1h)") from None
    if not (math.isfinite(x) and x >= 0):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return x
