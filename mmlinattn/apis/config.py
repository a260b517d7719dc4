"""The two things every part of :mod:`mmlinattn.apis` needs: the error a bad config raises, and the
model registry of a config's toolbox."""
import importlib

from mmengine.config import Config


class ConfigError(ValueError):
    """A config that cannot run as given; the message names the key to set."""


def model_registry(cfg: Config):
    """The ``MODELS`` registry of the config's toolbox (``default_scope``), with that scope set."""
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    return importlib.import_module(cfg.default_scope + '.registry').MODELS
