"""The error every checkpoint function raises."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable or does not fit the model."""
