"""The error a bad config raises, and reading a config file; the model registry of a config's
toolbox lives beside ``MODELS`` (:func:`mmlinattn.core.registry.model_registry`) and is handed on
from here."""
import warnings

from mmlinattn.core.registry import model_registry

__all__ = ['ConfigError', 'model_registry', 'read_config_file']


def read_config_file(path: str):
    """``mmengine.config.Config.fromfile(path)`` without the ``pkg_resources is deprecated``
    warnings it prints: mmengine 0.10 resolves config paths through ``pkg_resources``, which
    setuptools >= 81 deprecates at each import (four times per config), nothing a user can act
    on. A ``_base_ = 'PACKAGE::...'`` entry of a toolbox that is not installed (mmengine:
    ``PACKAGE is not installed, please install PACKAGE manually``) is a :class:`ConfigError`
    naming the extra that installs it (:mod:`mmlinattn.training.toolboxes`)."""
    from mmengine.config import Config
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='pkg_resources is deprecated',
                                    category=UserWarning)
            return Config.fromfile(path)
    except ModuleNotFoundError:
        from .toolboxes import missing_base_toolbox
        message = missing_base_toolbox(path)
        if message is None:
            raise
        raise ConfigError(message) from None


class ConfigError(ValueError):
    """A config that cannot run as given; the message names the key to set."""

    @classmethod
    def listing(cls, head: str, problems, advice: str = '') -> 'ConfigError':
        """One error for every problem a check found: ``head:``, then one indented line per
        problem, then the ``advice`` line(s) if any."""
        return cls(f'{head}:\n  ' + '\n  '.join(problems) + (f'\n{advice}' if advice else ''))
