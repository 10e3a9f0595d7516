"""Errors the application shows the user in one line."""


class ModelError(Exception):
    """A model that cannot be found or loaded; the message is one line for the user."""


class RingError(Exception):
    """A pass around the ring failed (a member is lost or refused the frame)."""


class FitError(RingError):
    """The ring cannot hold the model; the message is one line with the numbers and what would help."""
