"""One registration for three toolboxes.

Our modules go into mmengine's root ``MODELS`` registry. mmdet's, mmseg's and mmpretrain's ``MODELS``
registries are its children and fall back to it, so ``dict(type='MAViT')`` builds from any of their
configs once ``mmlinattn`` is imported (``custom_imports=dict(imports=['mmlinattn'])``).
"""
from mmengine.registry import MODELS

__all__ = ['MODELS']
