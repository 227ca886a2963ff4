"""The error types that several modules raise, kept apart so that no module imports another
only for its exception (and none imports in a circle)."""


class ConfigError(ValueError):
    """A mistake in the user's input, reported as one line and exit code 2."""


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: corrupted, or of another model (exit code 2)."""


EXIT_NONFINITE = 65  # sysexits.h's EX_DATAERR: the run diverged, or its data holds a NaN


class NonFinite(Exception):
    """A step's loss was NaN or infinite (--nonfinite stop, or too many skipped in a row); the message is
    the line to print, and the process exits with EXIT_NONFINITE."""
