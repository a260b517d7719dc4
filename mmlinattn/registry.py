"""One registration for three toolboxes.

Our modules go into mmengine's root ``MODELS`` registry. mmdet's, mmseg's and mmpretrain's
``MODELS`` registries are its children and fall back to it, so ``dict(type='MAViT')`` builds from
any of their configs once ``mmlinattn`` is imported
(``custom_imports=dict(imports=['mmlinattn'])``).

Importing this module loads no toolbox (mmdet, mmseg, mmpretrain). It gives mmdet and mmseg the
``function`` registry they lack (see :func:`add_function_registries`), which silences the
registry-scope warning of their inferencers: at once to a toolbox already imported, and to one
imported later right after its ``registry`` module runs (:class:`_AfterRegistryImport`, one finder
on ``sys.meta_path`` that only watches those two module names).
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
    with ``imported_only`` so is one that is not imported yet. Returns the scopes added.
    """
    added = []
    for scope in scopes:
        if scope in FUNCTIONS.children or (imported_only and scope not in sys.modules):
            continue
        try:
            toolbox = importlib.import_module(f'{scope}.registry')
        except Exception:  # noqa: BLE001 - not installed, or refusing this mmcv (its own assert)
            continue
        if hasattr(toolbox, 'FUNCTIONS') or scope in FUNCTIONS.children:
            continue
        Registry('function', parent=FUNCTIONS, scope=scope)
        added.append(scope)
    return added


class _AfterRegistryImport:
    """A ``sys.meta_path`` finder that lets the import of ``mmdet.registry`` / ``mmseg.registry``
    happen as usual and then adds that toolbox's function registry. It finds nothing itself."""

    names = {f'{scope}.registry': scope for scope in INFERENCER_SCOPES}

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        for finder in sys.meta_path:  # the finder that would have found it without us
            if finder is self or not hasattr(finder, 'find_spec'):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, 'exec_module'):
                spec.loader = _ThenAddRegistry(spec.loader, self.names[name])
                return spec
            if spec is not None:
                return spec
        return None


class _ThenAddRegistry:
    """A loader that runs ``loader`` and then adds ``scope``'s function registry."""

    def __init__(self, loader, scope):
        self.loader, self.scope = loader, scope

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        sys.modules[module.__name__] = module
        add_function_registries((self.scope,))

    def __getattr__(self, name):
        return getattr(self.loader, name)


add_function_registries(imported_only=True)
if not any(isinstance(f, _AfterRegistryImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterRegistryImport())
