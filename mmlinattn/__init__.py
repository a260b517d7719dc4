"""mmlinattn: InLine and MALA linear attention for OpenMMLab detection and segmentation.

The package has three parts (docs/design.md, section 5):

* :mod:`mmlinattn.core` - the product: attention math, attention modules, backbones, the authors'
  weights, the family table, registration. It imports nothing else of mmlinattn.
* :mod:`mmlinattn.training` - training support (pre-flight, runner set-up, hooks, checkpoint
  files, the fixes for upstream breakage).
* :mod:`mmlinattn.workshop` - what the tools share (benchmarks, profiling, FLOPs, analysis,
  ONNX export, demo pictures).

``import mmlinattn`` registers our modules and changes nothing else in the process: the backbones
``InLinePVT``, ``InLineSwin`` and ``MAViT`` (and the ImageNet classifier parts) in mmengine's root
model registry, visible from mmdet, mmseg and mmpretrain configs; the hooks
(``SafeCheckpointHook``, ``NonFiniteLossHook``, ``PreemptionHook``, ``PlainParamGroupsHook``) in its
hook registry; the CPU DDP wrapper in its model-wrapper registry. The fixes for upstream breakage
are applied by :mod:`mmlinattn.upstream_fixes` (our tools import it, our configs list it in
``custom_imports``).

``mmlinattn.ops``, ``mmlinattn.models`` and ``mmlinattn.registry`` (the core's paths before
release 0.2) still name the same modules: the entries of :data:`MOVED` are set in ``sys.modules``
(our own names only) so that ``from mmlinattn.ops import ...`` keeps working for one release.
"""
import sys

from . import core
from .core import models, ops, registry  # noqa: F401  (the old paths, see MOVED)
from .training import distributed, hooks  # noqa: F401  (register the hooks and the DDP wrapper)
from .version import __version__

#: old module path -> the module it names now (kept for one release; docs/changelog.md)
MOVED = {'mmlinattn.ops': 'mmlinattn.core.ops', 'mmlinattn.models': 'mmlinattn.core.models',
         'mmlinattn.registry': 'mmlinattn.core.registry'}


def _alias_moved_modules():
    for old, new in MOVED.items():
        for name, module in list(sys.modules.items()):
            if name == new or name.startswith(new + '.'):
                sys.modules.setdefault(old + name[len(new):], module)


_alias_moved_modules()

__all__ = ['__version__', 'core', 'ops', 'models', 'registry']
