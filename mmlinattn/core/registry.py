"""One registration for three toolboxes: our modules go into mmengine's root ``MODELS``, whose
children (mmdet's, mmseg's, mmpretrain's) fall back to it, so ``dict(type='MAViT')`` builds from
their configs once ``mmlinattn`` is imported. Importing this module loads no toolbox and touches
no registry of theirs.
"""
import importlib
import sys

from mmengine.registry import FUNCTIONS, MODELS, Registry

__all__ = ['MODELS', 'model_registry', 'add_function_registries']


def model_registry(cfg):
    """The ``MODELS`` registry of a config's ``default_scope``, set as mmengine's default scope."""
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    return importlib.import_module(cfg.default_scope + '.registry').MODELS


#: the toolboxes whose inferencers (``DetInferencer``, ``MMSegInferencer``) run our configs
INFERENCER_SCOPES = ('mmdet', 'mmseg')


def add_function_registries(scopes=INFERENCER_SCOPES, imported_only: bool = False):
    """An empty child of mmengine's ``FUNCTIONS`` for each toolbox without one (mmdet 3.3, mmseg
    1.2), silencing their inferencers' "Failed to search registry" warning; returns the scopes
    added."""
    added = []
    for scope in scopes:
        if scope in FUNCTIONS.children or (imported_only and scope not in sys.modules):
            continue
        try:
            toolbox = importlib.import_module(f'{scope}.registry')
        except (ImportError, AssertionError):  # not installed, or refusing this mmcv
            continue
        if hasattr(toolbox, 'FUNCTIONS') or scope in FUNCTIONS.children:
            continue
        Registry('function', parent=FUNCTIONS, scope=scope)
        added.append(scope)
    return added
