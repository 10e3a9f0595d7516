"""Errors the application shows the user in one line."""


class ModelError(Exception):
    """A model that cannot be found or loaded; the message is one line for the user."""


class RingError(Exception):
    """A pass around the ring failed (a member is lost or refused the frame)."""


class MemberLeft(RingError):
    """A member of the ring said bye (its user stopped it): the pass is re-planned around it like a loss, and said
    as the departure it is."""


class ConversationLost(RingError):
    """A member left one conversation out of a pass: it no longer holds that conversation's caches (their row went
    to another conversation, say). That conversation replays; the ring is whole, and nothing is re-planned."""


class FitError(RingError):
    """The ring cannot hold the model; the message is one line with the numbers and what would help. host_short:
    the host cannot hold even its own part (embedding, head, drafter, a pass), which no joiner changes."""

    def __init__(self, message: str, *, host_short: bool = False):
        super().__init__(message)
        self.host_short = host_short


class CannotServe(RingError):
    """A member cannot take the span it was given (the model cannot be fetched or loaded, or does not fit): it
    tells the host, which plans without it, and `sfchat join` exits with this line (or retries, with --stay).
    `other_model`: the host runs another model or revision, which no waiting fixes."""

    def __init__(self, message: str, *, oom: bool = False, other_model: bool = False):
        super().__init__(message)
        self.oom, self.other_model = oom, other_model


class OtherModel(ModelError):
    """This member's model (or revision) is not the host's."""
