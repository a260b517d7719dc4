"""The error a bad config raises; the model registry of a config's toolbox lives beside ``MODELS``
(:func:`mmlinattn.core.registry.model_registry`) and is handed on from here."""
from mmlinattn.core.registry import model_registry

__all__ = ['ConfigError', 'model_registry']


class ConfigError(ValueError):
    """A config that cannot run as given; the message names the key to set."""
