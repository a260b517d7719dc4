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

from mmlinattn.registry import MODELS


@MODELS.register_module()
class MAViTClsNeck(BaseModule):
    """MAViT's classification neck: Conv1x1(C -> projection) -> BN -> Swish -> GAP."""

    def __init__(self, in_channels: int = 512, projection: int = 2048, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        self.proj = nn.Conv2d(in_channels, projection, 1)
        self.norm = nn.BatchNorm2d(projection)

    def forward(self, inputs):
        x = inputs[-1] if isinstance(inputs, (tuple, list)) else inputs
        x = self.norm(self.proj(x))
        x = x * torch.sigmoid(x)
        return (x.mean(dim=(2, 3)),)


def authors_to_classifier(state: Dict[str, torch.Tensor], family: str) -> Dict[str, torch.Tensor]:
    """Rename the authors' classification state dict to our ImageClassifier's keys."""
    out = {}
    for k, v in state.items():
        last = k.rsplit('.', 1)[-1]
        if last in ('relative_position_index', 'attn_mask'):
            continue
        if k.startswith('head.'):
            out['head.fc.' + k[5:]] = v.flatten(1) if (family == 'mavit' and v.dim() == 4) else v
        elif family == 'mavit' and k.startswith(('proj.', 'norm.')):
            out['neck.' + k] = v
        elif family == 'inline_swin' and k.startswith('norm.'):
            out['backbone.out_norms.3.norm.' + k[5:]] = v
        else:
            out['backbone.' + k] = v
    return out


def classifier_to_authors(state: Dict[str, torch.Tensor], family: str) -> Dict[str, torch.Tensor]:
    """The inverse of :func:`authors_to_classifier`: an mmpretrain ImageClassifier's state dict (ours,
    e.g. trained with ``configs/toy/*_toy-cls.py``) in the authors' key layout, so that it loads into
    a detector or segmentor exactly as their released files do (``init_cfg=dict(type='Pretrained',
    checkpoint=...)``)."""
    out = {}
    for k, v in state.items():
        if k.startswith('head.fc.'):
            out['head.' + k[8:]] = v[:, :, None, None] if (family == 'mavit' and v.dim() == 2) else v
        elif family == 'mavit' and k.startswith(('neck.proj.', 'neck.norm.')):
            out[k[5:]] = v
        elif family == 'inline_swin' and k.startswith('backbone.out_norms.3.norm.'):
            out['norm.' + k[len('backbone.out_norms.3.norm.'):]] = v
        elif k.startswith('backbone.'):
            out[k[9:]] = v
        else:
            raise KeyError(f'{k}: not a key of a {family} ImageClassifier built from configs/classification')
    return out
