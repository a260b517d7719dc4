"""mmlinattn: InLine and MALA linear attention for OpenMMLab detection and segmentation.

``import mmlinattn`` registers our modules and changes nothing else in the process: the backbones
``InLinePVT``, ``InLineSwin`` and ``MAViT`` (and the ImageNet classifier parts) in mmengine's root
model registry, visible from mmdet, mmseg and mmpretrain configs; the hooks (``SafeCheckpointHook``,
``NonFiniteLossHook``, ``PreemptionHook``, ``PlainParamGroupsHook``) in its hook registry; the CPU
DDP wrapper in its model-wrapper registry. The fixes for upstream breakage are applied by
:mod:`mmlinattn.upstream_fixes` (our tools import it, our configs list it in ``custom_imports``).
"""
from . import distributed, hooks, models, ops  # noqa: F401
from .version import __version__

__all__ = ['__version__', 'ops', 'models']
