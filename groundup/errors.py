"""Errors a user can fix. The CLI prints these as one clear message, without a traceback."""

import errno


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


class DiskFullError(GroundupError, OSError):
    """A write found its file system full (or the user's quota spent). It names the file: everything finished
    before is intact, since every output is renamed into place only once whole (a run resumes from its last
    checkpoint). An OSError too (errno ENOSPC or EDQUOT), for code that handles those."""

    def __init__(self, path, reason: str = "No space left on device", code: int = errno.ENOSPC):
        OSError.__init__(self, code, reason, str(path))
        self.path, self.reason = str(path), reason

    def __str__(self) -> str:
        return f"disk full writing {self.path}: {self.reason}; free some space and run it again"

    def __reduce__(self):  # a worker process's error arrives whole
        return type(self), (self.path, self.reason, self.errno)
