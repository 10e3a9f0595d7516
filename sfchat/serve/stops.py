"""Stop strings: text goes out only once it cannot be the start of a stop string, and nothing from the first
stop string on ever goes out."""
from __future__ import annotations


class StopFilter:
    def __init__(self, stops: tuple[str, ...]):
        self.stops, self.held, self.hit = stops, "", False

    def push(self, text: str) -> str:
        """The part of the text so far that is safe to send now."""
        if self.hit:
            return ""
        if not self.stops:
            return text
        self.held += text
        cut = min((i for s in self.stops if (i := self.held.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            out, self.held = self.held[:cut], ""
            return out
        # hold back the longest tail that some stop string begins with
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(self.held)), 0, -1)
                    if self.held.endswith(s[:n])), default=0)
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def flush(self) -> str:
        """At the end of the answer: what was held back did not turn into a stop string."""
        out, self.held = ("" if self.hit else self.held), ""
        return out
