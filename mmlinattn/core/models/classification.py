"""The backbones as the authors' ImageNet classifiers under mmpretrain: backbone (out_indices=(3,);
InLine-Swin's ``out_norms.3`` is their final ``norm``) -> GlobalAveragePooling (MAViT:
:class:`MAViTClsNeck`) -> LinearClsHead. :func:`authors_to_classifier` renames a checkpoint so.
"""
from typing import Dict

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from mmlinattn.core.registry import MODELS


@MODELS.register_module()
class MAViTClsNeck(BaseModule):
    """MAViT's classification neck: Conv1x1(in_channels -> projection) -> BN -> Swish -> GAP."""

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
    """The authors' classification state dict with our ImageClassifier's keys."""
    return _layout(family).to_classifier(state)


def classifier_to_authors(state: Dict[str, torch.Tensor], family: str) -> Dict[str, torch.Tensor]:
    """The inverse of :func:`authors_to_classifier`."""
    return _layout(family).from_classifier(state)
