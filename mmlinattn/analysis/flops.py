"""FLOPs of a backbone or of a whole detector / segmentor, counted the way the papers count them
(docs/benchmarks.md section 3): one multiply-add is one FLOP (fvcore's convention), counted by
mmengine's ``FlopAnalyzer`` with the two handles it lacks, ``scaled_dot_product_attention`` (QK^T
and AV) and ``baddbmm`` (InLine's output GEMM). A whole model runs as the papers' ``forward_dummy``
did (:class:`WholeModel`) on one image of the paper's size; :data:`CONVENTIONS` are what each paper
counts (``'inline'``: every matmul, as our ``'all'``; ``'mala'``: the layers only, no attention
core product).
"""
import glob
import os.path as osp
from dataclasses import dataclass
from math import prod
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from mmlinattn.core.families import FAMILIES, backbone_classes
from mmlinattn.paths import resource_root

from .benchmarking import build_untrained, family_in_name


@dataclass(frozen=True)
class Convention:
    """What a FLOP count includes: the QK^T / AV of ``scaled_dot_product_attention``
    (``softmax_matmuls``), the products written as tensor ops (``core_matmuls``: matmul, bmm,
    baddbmm, einsum - only the attention cores run them; layers run linear / addmm / conv), a
    two-stage detector's RoI heads (``roi_heads``) on ``num_proposals`` boxes, the mask heads on
    the first ``num_mask_rois``."""
    softmax_matmuls: bool = True
    core_matmuls: bool = True
    roi_heads: bool = True
    num_proposals: int = 1000
    num_mask_rois: int = 100


CONVENTIONS: Dict[str, Convention] = {
    'all': Convention(),
    'inline': Convention(),
    'mala': Convention(softmax_matmuls=False, core_matmuls=False),
}
#: the paper each family's numbers come from, and so how its FLOPs are counted, by config folder
FAMILY_CONVENTION = {'inline_pvt': 'inline', 'inline_swin': 'inline', 'mavit': 'mala'}

#: the papers' whole-model GFLOPs by config name (InLine Tab. 7 and 9; MALA Tab. 3, 4 and 5)
PAPER_GFLOPS = {
    **{f'mask-rcnn_inline-pvt-{a}_fpn_1x_coco': g for a, g in zip('tsml', (211, 250, 310, 377))},
    **{f'fpn_inline-pvt-{a}_80k_ade20k-512x512': g for a, g in zip('tsml', (127, 168, 229, 298))},
    **{f'cascade-mask-rcnn_inline-swin-{a}_fpn_ms-3x_coco': g for a, g in zip('sb', (835, 978))},
    'upernet_inline-swin-t_160k_ade20k-512x512': 941,
    **{f'mask-rcnn_mavit-{a}_fpn_1x_coco': g for a, g in zip('tsbl', (219, 262, 372, 501))},
    **{f'mask-rcnn_mavit-{a}_fpn_ms-3x_coco': g for a, g in zip('sbl', (262, 372, 501))},
    **{f'cascade-mask-rcnn_mavit-{a}_fpn_ms-3x_coco': g for a, g in zip('sbl', (741, 851, 979))},
    **{f'retinanet_mavit-{a}_fpn_1x_coco': g for a, g in zip('tsbl', (201, 244, 353, 482))},
    **{f'fpn_mavit-{a}_80k_ade20k-512x512': g for a, g in zip('tsbl', (136, 180, 292, 424))},
    **{f'upernet_mavit-{a}_160k_ade20k-512x512': g for a, g in zip('tsbl', (893, 937, 1050, 1182))},
}
#: the papers' backbone GFLOPs at 224x224 (InLine Tab. 5, MALA Tab. 2), by (class name, arch)
PAPER_BACKBONE_GFLOPS = {
    **{('InLinePVT', a): g for a, g in zip(('tiny', 'small', 'medium', 'large'),
                                           (2.0, 3.9, 6.9, 10.2))},
    **{('InLineSwin', a): g for a, g in zip(('tiny', 'small', 'base'), (4.5, 8.7, 15.4))},
    **{('MAViT', a): g for a, g in zip(('tiny', 'small', 'base', 'large'), (2.5, 4.6, 9.9, 16.1))},
}
#: the ops of :attr:`Convention.core_matmuls`
CORE_MATMULS = ('aten::matmul', 'aten::bmm', 'aten::baddbmm', 'aten::einsum')
_ZERO = lambda inputs, outputs: 0  # noqa: E731  (a handle of None keeps the default handle)
BACKBONES = backbone_classes()
#: the papers' whole-model input sizes (H, W) by task (ImageNet classification: 224)
PAPER_SIZES = {'mmdet': (800, 1280), 'mmseg': (512, 2048), 'mmpretrain': (224, 224)}


def sdpa_flop(inputs, outputs) -> int:
    """q (..., L, E), k (..., S, E), v (..., S, Ev): L*S*E for QK^T plus L*S*Ev for AV."""
    q, k, v = (list(i.type().sizes()) for i in inputs[:3])
    return prod(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])


def baddbmm_flop(inputs, outputs) -> int:
    """baddbmm(c, a (B, n, k), b (B, k, m)): B*n*k*m (the added c is elementwise)."""
    return prod(inputs[1].type().sizes()) * list(inputs[2].type().sizes())[-1]


def _convention(convention) -> Convention:
    return CONVENTIONS[convention] if isinstance(convention, str) else convention


def count(model: nn.Module, inputs: tuple, convention='all') -> Tuple[int, Dict[str, int]]:
    """FLOPs of ``model(*inputs)`` under ``convention`` (a name of :data:`CONVENTIONS` or a
    :class:`Convention`), and the ops seen but not counted (name -> calls)."""
    from mmengine.analysis import FlopAnalyzer
    conv = _convention(convention)
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle(**{
        'aten::scaled_dot_product_attention': sdpa_flop if conv.softmax_matmuls else _ZERO,
        'aten::baddbmm': baddbmm_flop})
    if not conv.core_matmuls:
        analyzer.set_op_handle(**dict.fromkeys(CORE_MATMULS, _ZERO))
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    return analyzer.total(), dict(analyzer.unsupported_ops())


def backbone_flops(name: str, arch: str, shape: Sequence[int] = (224, 224), convention='all'):
    """(parameters, FLOPs, ops not counted) of backbone class ``name`` (e.g. ``'MAViT'``) at
    ``shape`` (H, W), batch 1."""
    model = BACKBONES[name](arch=arch).eval()
    params = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        flops, skipped = count(model, (torch.randn(1, 3, *shape),), convention)
    return params, flops, skipped


class WholeModel(nn.Module):
    """A detector's / segmentor's forward as the papers' FLOP counters ran it: a segmentor's
    backbone, neck and decode head; a one-stage detector's backbone, neck and dense head; a
    two-stage detector's backbone, neck, RPN head, then every RoI bbox head on ``num_proposals``
    fixed boxes and every mask head on the first ``num_mask_rois`` (mmdet 3's tensor mode takes the
    boxes from the RPN's NMS instead, which depends on the image)."""

    def __init__(self, model: nn.Module, convention: Convention):
        super().__init__()
        self.model, self.convention = model, convention

    def _proposals(self, hw):
        """``num_proposals`` boxes spread over the image (their values do not change the count)."""
        n = self.convention.num_proposals
        h, w = hw
        g = torch.linspace(0, 1, n)
        x1, y1 = g * (w * 0.6), torch.roll(g, n // 3) * (h * 0.6)
        boxes = torch.stack([x1, y1, x1 + w * 0.1 + 16, y1 + h * 0.1 + 16], dim=1)
        return torch.cat([boxes.new_zeros(n, 1), boxes], dim=1)     # rois: (batch index, box)

    def forward(self, x):
        m = self.model
        if hasattr(m, 'decode_head'):                      # segmentor: mmseg's tensor forward
            return m.decode_head(m.extract_feat(x))
        if not hasattr(m, 'bbox_head') and not hasattr(m, 'roi_head'):  # mmpretrain classifier
            return m(x, mode='tensor')
        feats = m.extract_feat(x)
        if not hasattr(m, 'rpn_head'):                     # one-stage detector
            return m.bbox_head(feats)
        outs = m.rpn_head(feats)
        if not self.convention.roi_heads:
            return outs
        head = m.roi_head
        rois = self._proposals(x.shape[-2:]).to(x)
        mask_rois = rois[:self.convention.num_mask_rois]
        stages = range(head.num_stages) if hasattr(head, 'num_stages') else [None]
        for s in stages:
            args = () if s is None else (s,)
            if head.with_bbox:
                r = head._bbox_forward(*args, feats, rois)
                outs = outs + (r['cls_score'], r['bbox_pred'])
            if head.with_mask:
                outs = outs + (head._mask_forward(*args, feats, mask_rois)['mask_preds'],)
        return outs


def build_model(config):
    """The model of ``config`` (a path or a Config), untrained, in eval mode, SyncBN reverted."""
    from mmengine.config import Config
    if isinstance(config, str):
        if not osp.exists(config) and osp.exists(osp.join(resource_root(), config)):
            config = osp.join(resource_root(), config)  # a zoo_configs() name, from any folder
    cfg = Config.fromfile(config) if isinstance(config, str) else config
    return build_untrained(cfg).eval(), cfg


def model_flops(config, shape: Optional[Sequence[int]] = None, convention='all'):
    """(parameters, FLOPs, ops not counted, (H, W)) of the whole model of ``config`` (a path or a
    Config) on one image of ``shape`` (H, W; default the paper's size for the task)."""
    model, cfg = build_model(config)
    shape = tuple(shape or PAPER_SIZES[cfg.get('default_scope', 'mmdet')])
    params = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        flops, skipped = count(WholeModel(model, _convention(convention)),
                               (torch.randn(1, 3, *shape),), convention)
    return params, flops, skipped, shape


def dataset_flops(config, num_images: int, convention='all'):
    """(parameters, mean FLOPs, ops not counted, the (H, W) of every image) of the whole model of
    ``config`` over the first ``num_images`` images of its validation set, each at the size its
    test pipeline and data preprocessor give it (batch 1), as mmdet's ``get_flops.py
    --num-images`` counts."""
    import copy

    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner
    model, cfg = build_model(config)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    loader_cfg = copy.deepcopy(cfg.val_dataloader)
    loader_cfg.update(batch_size=1, num_workers=0, persistent_workers=False)
    loader = Runner.build_dataloader(loader_cfg)
    params = sum(p.numel() for p in model.parameters())
    total, shapes, skipped = 0, [], {}
    with torch.no_grad():
        for batch in loader:
            if len(shapes) == num_images:
                break
            x = model.data_preprocessor(batch, False)['inputs']
            flops, seen = count(WholeModel(model, _convention(convention)), (x,), convention)
            total += flops
            shapes.append(tuple(x.shape[-2:]))
            for k, v in seen.items():
                skipped[k] = skipped.get(k, 0) + v
    if not shapes:
        raise ValueError(f'{getattr(config, "filename", config)}: the validation set has no image')
    return params, total // len(shapes), skipped, shapes


def zoo_configs(families: Optional[Sequence[str]] = None) -> list:
    """Every config of the zoo folders ``configs/<family>/``, sorted, as paths from the folder that
    holds ``configs/`` (the checkout, or an installed wheel's ``mmlinattn/.mim``); ``families``:
    every family of the family table by default."""
    root = resource_root()
    paths = [p for fam in (FAMILIES if families is None else families)
             for p in glob.glob(osp.join(root, 'configs', fam, '*.py'))]
    return sorted(osp.relpath(p, root) for p in paths)


def paper_convention(config: str) -> str:
    """The convention of the paper that reports ``config``'s family (:data:`FAMILY_CONVENTION`),
    the family read from the config's name (``mask-rcnn_mavit-t_...``) as :data:`PAPER_GFLOPS`
    is, wherever the file lies. Raises ``KeyError`` for a family whose paper the table does not
    list, rather than comparing under another paper's rules."""
    found = family_in_name(osp.basename(config))
    family = found[0].name if found else None
    if family not in FAMILY_CONVENTION:
        raise KeyError(f'{config}: no paper convention for its family ({family or "none found"}); '
                       f'FAMILY_CONVENTION lists {sorted(FAMILY_CONVENTION)}')
    return FAMILY_CONVENTION[family]


def zoo_row(config: str, shape: Optional[Sequence[int]] = None) -> dict:
    """One config's counts: ours (``'all'``) and under its paper's convention, with the paper's
    number where the paper reports the model (GFLOPs; ``paper`` None otherwise)."""
    name = osp.splitext(osp.basename(config))[0]
    params, flops, _, shape = model_flops(config, shape, 'all')
    conv = paper_convention(config)
    paper_flops = flops if CONVENTIONS[conv] == CONVENTIONS['all'] else \
        model_flops(config, shape, conv)[1]
    paper = PAPER_GFLOPS.get(name)
    return dict(config=name, params=params, flops=flops, convention=conv,
                paper_convention_flops=paper_flops, paper_gflops=paper,
                diff=None if paper is None else (paper_flops / 1e9 - paper) / paper,
                input=f'{shape[1]}x{shape[0]}')
