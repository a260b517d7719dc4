"""The product: the attention math (:mod:`.ops`), the modules and backbones (:mod:`.models`), the
authors' weights (:mod:`.weights`), the family table (:mod:`.families`), the registration
(:mod:`.registry`). It imports nothing of mmlinattn outside itself; importing it registers the
backbones and loads no toolbox.
"""
from . import models, ops  # noqa: F401  (registers the backbones)

__all__ = ['models', 'ops']
