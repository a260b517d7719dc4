"""mmlinattn: InLine and MALA linear attention for OpenMMLab detection and segmentation.

``import mmlinattn`` registers the backbones ``InLinePVT``, ``InLineSwin`` and ``MAViT`` in
mmengine's root model registry, visible from mmdet, mmseg and mmpretrain configs.
"""
from . import compat
from .version import __version__

compat.apply()
# after the stack fixes: models registers the backbones, distributed the CPU DDP wrapper, hooks
# PlainParamGroupsHook
from . import distributed, hooks, models, ops  # noqa: E402,F401

__all__ = ['__version__', 'ops', 'models']
