"""Errors a user can fix. The CLI prints these as one clear message, without a traceback."""


class GroundupError(Exception):
    """Base class for user-facing errors (bad config, bad input file, missing checkpoint)."""


class ConfigError(GroundupError):
    """A configuration key is unknown, ill-typed, or inconsistent with another key."""

    def __init__(self, message: str, key: str = ""):
        super().__init__(message)
        self.key = key


class DataError(GroundupError):
    """An input file is missing, empty, malformed, or incompatible with the run."""


class CheckpointError(GroundupError):
    """A checkpoint is missing, incomplete, corrupt, or made by an incompatible config."""


class TrainingError(GroundupError):
    """A run cannot go on: it diverged past what rollbacks can repair."""
