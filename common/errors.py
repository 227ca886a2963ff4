"""The error types that several modules raise, kept apart so that no module imports another
only for its exception (and none imports in a circle)."""


class ConfigError(ValueError):
    """A mistake in the user's input, reported as one line and exit code 2."""


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: corrupted, or of another model (exit code 2)."""
