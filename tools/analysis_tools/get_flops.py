"""Parameters and FLOPs of a backbone or of a whole config, counting the attention matmuls.

    python tools/analysis_tools/get_flops.py --backbone MAViT tiny            # 224x224
    python tools/analysis_tools/get_flops.py --backbone InLineSwin tiny --shape 512 512
    python tools/analysis_tools/get_flops.py configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py
    python tools/analysis_tools/get_flops.py --all-backbones               # table vs the papers

FLOPs follow the papers' (fvcore) convention: one multiply-add = one FLOP. mmengine's analyzer is
used, with handles added for the ops it would silently skip: ``scaled_dot_product_attention``
(softmax blocks), ``baddbmm`` (InLine's output GEMM) and ``addcmul`` / elementwise ops are not
counted (as fvcore). Whole configs are measured at their test size (COCO 1280x800, ADE20K 2048x512)
through the backbone + neck + dense heads' ``_forward``.
"""
import argparse
import os.path as osp
import sys
from math import prod

import torch

import mmlinattn  # noqa: F401
from mmlinattn.models import InLinePVT, InLineSwin, MAViT

PAPER_GFLOPS = {('InLineSwin', 'tiny'): 4.5, ('InLineSwin', 'small'): 8.7, ('InLineSwin', 'base'): 15.4,
                ('InLinePVT', 'tiny'): 2.0, ('InLinePVT', 'small'): 3.9, ('InLinePVT', 'medium'): 6.9,
                ('InLinePVT', 'large'): 10.2, ('MAViT', 'tiny'): 2.5, ('MAViT', 'small'): 4.6,
                ('MAViT', 'base'): 9.9, ('MAViT', 'large'): 16.1}
BACKBONES = {'InLineSwin': InLineSwin, 'InLinePVT': InLinePVT, 'MAViT': MAViT}


def _shape(v):
    return list(v.type().sizes())


def sdpa_flop(inputs, outputs):
    """q (..., L, E), k (..., S, E), v (..., S, Ev): QK^T and AV."""
    q, k, v = (_shape(i) for i in inputs[:3])
    batch = prod(q[:-2])
    return batch * q[-2] * k[-2] * q[-1] + batch * q[-2] * k[-2] * v[-1]


def baddbmm_flop(inputs, outputs):
    a, b = _shape(inputs[1]), _shape(inputs[2])
    return prod(a) * b[-1]


def count(model, inputs, softmax_matmuls=True):
    """FLOPs of ``model(*inputs)``; ``softmax_matmuls=False`` leaves out the QK^T / AV products of
    the softmax blocks (the convention the MALA paper's numbers match, see docs/benchmarks.md)."""
    from mmengine.analysis import FlopAnalyzer
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle(**{
        'aten::scaled_dot_product_attention': sdpa_flop if softmax_matmuls else (lambda i, o: 0),
        'aten::baddbmm': baddbmm_flop})
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    flops = analyzer.total()
    skipped = analyzer.unsupported_ops()
    return flops, skipped


def backbone_flops(name, arch, shape=(224, 224), softmax_matmuls=True):
    model = BACKBONES[name](arch=arch).eval()
    params = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        flops, skipped = count(model, (torch.randn(1, 3, *shape),), softmax_matmuls)
    return params, flops, skipped


class _DenseForward(torch.nn.Module):
    """backbone + neck + heads' tensor forward of a detector / segmentor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        m = self.model
        if hasattr(m, 'extract_feat') and hasattr(m, 'rpn_head'):        # two-stage detector
            feats = m.extract_feat(x)
            return m.rpn_head(feats)
        if hasattr(m, 'bbox_head'):                                       # one-stage
            return m.bbox_head(m.extract_feat(x))
        feats = m.extract_feat(x)                                         # segmentor
        return m.decode_head(feats)


def config_flops(path, shape=None):
    from mmengine.config import Config

    from mmlinattn.apis import model_registry
    cfg = Config.fromfile(path)
    models = model_registry(cfg)
    cfg.model.backbone.init_cfg = None
    model = models.build(cfg.model).eval()
    if shape is None:
        shape = (800, 1280) if cfg.default_scope == 'mmdet' else (512, 2048)
    params = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        flops, skipped = count(_DenseForward(model), (torch.randn(1, 3, *shape),))
    return params, flops, skipped, shape


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config', nargs='?')
    p.add_argument('--backbone', nargs=2, metavar=('TYPE', 'ARCH'))
    p.add_argument('--shape', nargs=2, type=int, metavar=('H', 'W'))
    p.add_argument('--all-backbones', action='store_true')
    args = p.parse_args(argv)
    shape = tuple(args.shape) if args.shape else None
    if args.all_backbones:
        print('| backbone | params (M) | GFLOPs @224, all matmuls | diff | without softmax QK/AV | '
              'diff | paper |')
        print('|---|---|---|---|---|---|---|')
        for (name, arch), paper in PAPER_GFLOPS.items():
            params, flops, _ = backbone_flops(name, arch)
            _, flops_ns, _ = backbone_flops(name, arch, softmax_matmuls=False)
            g, gn = flops / 1e9, flops_ns / 1e9
            print(f'| {name}-{arch} | {params / 1e6:.2f} | {g:.2f} | {(g - paper) / paper * 100:+.1f} % '
                  f'| {gn:.2f} | {(gn - paper) / paper * 100:+.1f} % | {paper} |')
        return 0
    if args.backbone:
        name, arch = args.backbone
        params, flops, skipped = backbone_flops(name, arch, shape or (224, 224))
        print(f'{name}-{arch} @ {shape or (224, 224)}: params {params / 1e6:.2f} M, '
              f'FLOPs {flops / 1e9:.2f} G')
    elif args.config:
        params, flops, skipped, shape = config_flops(args.config, shape)
        print(f'{osp.basename(args.config)} @ {shape}: params {params / 1e6:.2f} M, '
              f'FLOPs {flops / 1e9:.1f} G (backbone + neck + dense heads)')
    else:
        p.error('give a config, --backbone TYPE ARCH or --all-backbones')
    if skipped:
        print('ops not counted (elementwise, as fvcore): ' +
              ', '.join(f'{k} x{v}' for k, v in sorted(skipped.items())))
    return 0


if __name__ == '__main__':
    sys.exit(main())
