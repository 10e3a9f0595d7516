"""Errors the application shows the user in one line."""


class RingError(Exception):
    """A pass around the ring failed (a member is lost or refused the frame)."""


class FitError(RingError):
    """The ring cannot hold the model; the message is one line with the numbers and what would help."""
