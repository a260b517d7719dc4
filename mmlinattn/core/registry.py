"""One registration for three toolboxes.

Our modules go into mmengine's root ``MODELS`` registry. mmdet's, mmseg's and mmpretrain's
``MODELS`` registries are its children and fall back to it, so ``dict(type='MAViT')`` builds from
any of their configs once ``mmlinattn`` is imported
(``custom_imports=dict(imports=['mmlinattn'])``).

Importing this module loads no toolbox (mmdet, mmseg, mmpretrain) and changes nothing outside
our own modules: no import hook, no registry of theirs touched. Where we build an inferencer
(:func:`mmlinattn.apis.inference.build_inferencer`, ``tools/image_demo.py``) its scope is
resolved explicitly: :func:`add_function_registries` gives mmdet / mmseg the ``function`` registry
they lack, which silences the registry-scope warning their inferencers log for every config (theirs
too). A user building ``DetInferencer`` / ``MMSegInferencer`` directly may call it the same way.
"""
import importlib
import sys

from mmengine.registry import FUNCTIONS, MODELS, Registry

__all__ = ['MODELS', 'model_registry', 'add_function_registries']

def model_registry(cfg):
    """The ``MODELS`` registry of a config's toolbox (its ``default_scope``: ``mmdet``, ``mmseg``,
    ``mmpretrain``), with that scope set as mmengine's default; our backbones build from it through
    the root registry above."""
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    return importlib.import_module(cfg.default_scope + '.registry').MODELS


#: the toolboxes whose inferencers (``DetInferencer``, ``MMSegInferencer``) run our configs
INFERENCER_SCOPES = ('mmdet', 'mmseg')


def add_function_registries(scopes=INFERENCER_SCOPES, imported_only: bool = False):
    """Add an (empty) child of mmengine's ``FUNCTIONS`` registry for each toolbox that has none.

    mmengine's ``BaseInferencer._init_collate`` looks up ``test_dataloader.collate_fn`` in
    ``FUNCTIONS.switch_scope_and_registry(scope)``; mmdet 3.3 and mmseg 1.2 define no ``FUNCTIONS``
    registry, so for every config - theirs as well as ours - the switch finds no ``mmdet`` /
    ``mmseg`` child and logs "Failed to search registry with scope "mmdet" in the "function"
    registry tree" before falling back to mmengine's registry. An empty child under the toolbox's
    own scope name is what mmdet / mmseg would have registered: lookups fall through to mmengine's
    functions (``pseudo_collate``, ``default_collate``) exactly as before, without the warning. A
    toolbox that is not installed, or that defines its own ``FUNCTIONS`` registry, is left alone;
    with ``imported_only`` so is one that is not imported yet. Idempotent (a second call, or one
    after ``importlib.reload`` of this module, adds nothing). Returns the scopes added.
    """
    added = []
    for scope in scopes:
        if scope in FUNCTIONS.children or (imported_only and scope not in sys.modules):
            continue
        try:
            toolbox = importlib.import_module(f'{scope}.registry')
        except (ImportError, AssertionError):  # not installed, or refusing this mmcv (its own
            continue  # assert): nothing to add; building its inferencer stops at the same error
        if hasattr(toolbox, 'FUNCTIONS') or scope in FUNCTIONS.children:
            continue
        Registry('function', parent=FUNCTIONS, scope=scope)
        added.append(scope)
    return added
