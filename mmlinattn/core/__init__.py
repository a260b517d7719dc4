"""The product: the attention math (:mod:`.ops`), the attention modules and backbones
(:mod:`.models`), reading and fitting the authors' weights (:mod:`.weights`), the per-family table
(:mod:`.families`) and the registration (:mod:`.registry`).

The core imports nothing of mmlinattn outside itself (``tests/test_structure.py`` keeps it so):
training support (:mod:`mmlinattn.training`) and the tools (``tools/``, with their workshop)
stand on it, never the other way. Importing it registers the backbones in mmengine's root
``MODELS`` registry and loads no toolbox (mmdet, mmseg, mmpretrain).
"""
from . import models, ops  # noqa: F401  (registers the backbones)

__all__ = ['models', 'ops']
