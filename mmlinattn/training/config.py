"""The error a bad config raises, and reading a config file; the model registry of a config's
toolbox lives beside ``MODELS`` (:func:`mmlinattn.core.registry.model_registry`) and is handed on
from here.

Which OpenMMLab toolboxes are installed, and the one line that names the extra installing a
missing one: ``pip install mmlinattn`` brings mmengine and mmcv only; mmdet, mmsegmentation and
mmpretrain come with the extras ``[det]``, ``[seg]`` and ``[cls]`` (``[all]``: the three). A config
of a toolbox that is not installed, through its ``default_scope`` or a ``_base_ = 'PACKAGE::...'``
entry, stops with that line instead of an ``ImportError`` deep in a registry or mmengine's
``... is not installed, please install ... manually``. Whether a toolbox is installed is asked of
the import system (``importlib.util.find_spec``), which loads nothing.
"""
import importlib.util
import os.path as osp
import warnings
from typing import Optional

from mmlinattn.core.registry import model_registry

__all__ = ['ConfigError', 'model_registry', 'read_config_file', 'TOOLBOXES', 'installed',
           'missing_toolbox', 'check_toolboxes', 'missing_base_toolbox']


def read_config_file(path: str):
    """``mmengine.config.Config.fromfile(path)`` without the ``pkg_resources is deprecated``
    warnings it prints: mmengine 0.10 resolves config paths through ``pkg_resources``, which
    setuptools >= 81 deprecates at each import (four times per config), nothing a user can act
    on. A ``_base_ = 'PACKAGE::...'`` entry of a toolbox that is not installed (mmengine:
    ``PACKAGE is not installed, please install PACKAGE manually``) is a :class:`ConfigError`
    naming the extra that installs it (:func:`missing_base_toolbox`)."""
    from mmengine.config import Config
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='pkg_resources is deprecated',
                                    category=UserWarning)
            return Config.fromfile(path)
    except ModuleNotFoundError:
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


#: a toolbox's scope (its module) -> (its distribution on PyPI, our extra that installs it)
TOOLBOXES = {'mmdet': ('mmdet', 'det'), 'mmseg': ('mmsegmentation', 'seg'),
             'mmpretrain': ('mmpretrain', 'cls')}


def installed(scope: str) -> bool:
    """Whether the toolbox module ``scope`` can be imported (found; nothing is imported)."""
    try:
        return importlib.util.find_spec(scope) is not None
    except (ImportError, ValueError):  # a finder refusing it; a half-removed package
        return False


def missing_toolbox(scope: str, what: str) -> Optional[str]:
    """``'WHAT needs PACKAGE, which is not installed: pip install "mmlinattn[EXTRA]"'`` for a
    toolbox scope of :data:`TOOLBOXES` that is not installed; ``None`` otherwise (installed, or not
    a toolbox of ours)."""
    if scope not in TOOLBOXES or installed(scope):
        return None
    package, extra = TOOLBOXES[scope]
    return f'{what} needs {package}, which is not installed: pip install "mmlinattn[{extra}]"'


def check_toolboxes(cfg, name: str = 'the config') -> None:
    """:class:`ConfigError` in one line when the config's ``default_scope`` is a toolbox that is
    not installed (``name``: how the message calls the config, e.g. its path)."""
    scope = cfg.get('default_scope')
    message = missing_toolbox(scope, f'{name}: default_scope={scope!r}') \
        if isinstance(scope, str) else None
    if message:
        raise ConfigError(message)


def missing_base_toolbox(path: str) -> Optional[str]:
    """For the first ``_base_ = 'PACKAGE::...'`` entry under ``path`` (followed through local bases)
    whose toolbox is not installed: the one line naming the config that lists it and the extra;
    ``None`` where there is none. mmengine reads such an entry from the installed package, so
    without it the config cannot be read at all."""
    for current, base in package_bases(path):
        message = missing_toolbox(base.split('::', 1)[0], f'{current}: _base_ {base!r}')
        if message:
            return message
    return None


def package_bases(path: str):
    """``(file, entry)`` for each ``_base_ = 'PACKAGE::...'`` entry of ``path`` and of the local
    files it inherits, in order; where the entries of a file cannot be read (any error) it stops:
    mmengine's own error stands."""
    from mmengine.config import Config
    todo, seen = [path], set()
    while todo:
        current = todo.pop(0)
        if current in seen:
            continue
        seen.add(current)
        try:
            bases = Config._get_base_files(current)  # mmengine's reading of the entries
        except Exception:
            return
        for base in bases:
            if '::' in base:
                yield current, base
            else:
                todo.append(osp.normpath(osp.join(osp.dirname(current), base)))
