"""mmlinattn: InLine and MALA linear attention for OpenMMLab detection and segmentation.

The package has two parts (docs/design.md, section 5):

* :mod:`mmlinattn.core` - the product: attention math, attention modules, backbones, the authors'
  weights, the family table, registration. It imports nothing else of mmlinattn.
* :mod:`mmlinattn.training` - training support that configs name (hooks, atomic checkpoint
  files, the CPU DDP wrapper, the fixes for upstream breakage).

What the tools share (the pre-flight and Runner set-up of tools/train.py and tools/test.py,
benchmarks, profiling, FLOPs, analysis, ONNX export, demo pictures) is not part of the package:
it lives beside them, in ``tools/workshop`` (a checkout's, or the one the wheel ships under
``mmlinattn/.mim/tools``), imported as ``tools.workshop`` with the folder above ``tools/`` on
``sys.path``.

``import mmlinattn`` registers our modules and changes nothing else in the process: the backbones
``InLinePVT``, ``InLineSwin`` and ``MAViT`` (and the ImageNet classifier parts) in mmengine's root
model registry, visible from mmdet, mmseg and mmpretrain configs; the hooks
(``SafeCheckpointHook``, ``NonFiniteLossHook``, ``PreemptionHook``, ``PlainParamGroupsHook``) in its
hook registry; the CPU DDP wrapper in its model-wrapper registry. The fixes for upstream breakage
are applied by :mod:`mmlinattn.upstream_fixes` (our tools import it, our configs list it in
``custom_imports``).

The core's modules live under ``mmlinattn.core`` only (the 0.1 paths ``mmlinattn.ops``,
``mmlinattn.models`` and ``mmlinattn.registry`` were removed in 0.3.0; docs/changelog.md).
"""
from . import core  # noqa: F401  (registers the backbones)
from .training import distributed, hooks  # noqa: F401  (register the hooks and the DDP wrapper)
from .version import __version__

__all__ = ['__version__', 'core']
