"""mmlinattn: InLine and MALA linear attention for OpenMMLab detection and segmentation.

``import mmlinattn`` registers the backbones ``InLinePVT``, ``InLineSwin`` and ``MAViT`` in mmengine's
root model registry, visible from mmdet, mmseg and mmpretrain configs.
"""
from .version import __version__
from . import compat

compat.apply()
from . import ops  # noqa: F401,E402
from . import models  # noqa: F401,E402  (registers the backbones)
from . import distributed  # noqa: F401,E402  (registers the CPU DDP wrapper)
from . import hooks  # noqa: F401,E402  (registers PlainParamGroupsHook)

__all__ = ['__version__', 'ops', 'models']
