"""Pieces to run the backbones as the authors' ImageNet classifiers under mmpretrain.

* InLine-Swin: backbone (out_indices=(3,), its output norm ``out_norms.3`` = the authors' final
  ``norm``) ->
  GlobalAveragePooling -> LinearClsHead;
* InLine-PVT: backbone (out_indices=(3,), no norm) -> GlobalAveragePooling -> LinearClsHead;
* MAViT: backbone (out_indices=(3,), no output norm) -> :class:`MAViTClsNeck` (Conv1x1 -> BN ->
  Swish -> global average pool) -> LinearClsHead.

:func:`authors_to_classifier` renames an authors' checkpoint to that layout.
"""
from typing import Dict

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from mmlinattn.core.registry import MODELS


@MODELS.register_module()
class MAViTClsNeck(BaseModule):
    """MAViT's classification neck: Conv1x1(C -> projection) -> BN -> Swish -> GAP.

    Args:
        in_channels (int): channels of the last stage.
        projection (int): channels of the projection (2048 for T/S/B, 2560 for L in the releases).
        init_cfg (dict | None): mmengine init config.
    """

    def __init__(self, in_channels: int = 512, projection: int = 2048, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        self.proj = nn.Conv2d(in_channels, projection, 1)
        self.norm = nn.BatchNorm2d(projection)

    def forward(self, inputs):
        x = inputs[-1] if isinstance(inputs, (tuple, list)) else inputs
        x = self.norm(self.proj(x))
        x = x * torch.sigmoid(x)
        return (x.mean(dim=(2, 3)),)


def _layout(family: str):
    from ..families import FAMILIES
    if family not in FAMILIES:
        raise KeyError(f'unknown family {family!r}; choose one of {sorted(FAMILIES)}')
    return FAMILIES[family].backbone.authors_layout


def authors_to_classifier(state: Dict[str, torch.Tensor], family: str) -> Dict[str, torch.Tensor]:
    """Rename the authors' classification state dict to our ImageClassifier's keys (the family's
    :class:`~mmlinattn.core.weights.AuthorsLayout`)."""
    return _layout(family).to_classifier(state)


def classifier_to_authors(state: Dict[str, torch.Tensor], family: str) -> Dict[str, torch.Tensor]:
    """The inverse of :func:`authors_to_classifier`: an mmpretrain ImageClassifier's state dict
    (ours, e.g. trained with ``configs/toy/*_toy-cls.py``) in the authors' key layout, so that it
    loads into a detector or segmentor exactly as their released files do
    (``init_cfg=dict(type='Pretrained', checkpoint=...)``)."""
    return _layout(family).from_classifier(state)
