"""Parameters and FLOPs of a whole config or of a backbone, counted as the papers count them.

    python tools/analysis_tools/get_flops.py configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py
    python tools/analysis_tools/get_flops.py CONFIG --shape 512 512 --convention mala
    python tools/analysis_tools/get_flops.py CONFIG --num-images 100   # mean over the val set
    python tools/analysis_tools/get_flops.py CONFIG --cfg-options model.backbone.arch=small
    python tools/analysis_tools/get_flops.py --backbone InLineSwin tiny --shape 512 512
    python tools/analysis_tools/get_flops.py --all-backbones     # backbones at 224 vs the papers
    python tools/analysis_tools/get_flops.py --zoo [--json OUT]  # every zoo config vs the papers

A config is counted whole on one image of the paper's size unless --shape is given. The rules:
mmlinattn.analysis.flops, docs/benchmarks.md section 3.
"""
import argparse
import json
import logging
import os.path as osp
import sys

from mmengine.logging import MMLogger

import mmlinattn  # noqa: F401
from mmlinattn.analysis import flops as F
from mmlinattn.training.cli import load_config
from mmlinattn.training.config import ConfigError
from mmlinattn.training.preflight import CfgOptionsAction, preflight


def _pct(x):
    return '-' if x is None else f'{x * 100:+.1f} %'


def all_backbones():
    print('| backbone | params (M) | GFLOPs @224, all matmuls | diff | layers only (mala) '
          '| diff | paper |\n|---|---|---|---|---|---|---|')
    for (name, arch), paper in F.PAPER_BACKBONE_GFLOPS.items():
        params, flops, _ = F.backbone_flops(name, arch)
        g, gn = flops / 1e9, F.backbone_flops(name, arch, convention='mala')[1] / 1e9
        print(f'| {name}-{arch} | {params / 1e6:.2f} | {g:.2f} | {_pct((g - paper) / paper)} '
              f'| {gn:.2f} | {_pct((gn - paper) / paper)} | {paper} |', flush=True)


def zoo(out=None):
    MMLogger.get_current_instance().setLevel(logging.ERROR)   # scope switches mmdet <-> mmseg
    rows = []
    print('| config | input | params (M) | GFLOPs (ours) | convention '
          '| GFLOPs (paper convention) | paper | diff |\n|---|---|---|---|---|---|---|---|')
    for config in F.zoo_configs():
        r = F.zoo_row(config)
        rows.append(r)
        print(f"| {r['config']} | {r['input']} | {r['params'] / 1e6:.2f} "
              f"| {r['flops'] / 1e9:.1f} | {r['convention']} "
              f"| {r['paper_convention_flops'] / 1e9:.1f} "
              f"| {r['paper_gflops'] or '-'} | {_pct(r['diff'])} |", flush=True)
    if out:
        with open(out, 'w') as f:
            json.dump(rows, f, indent=1)


def count_config(p, args, shape):
    """A config's whole model; returns the ops not counted."""
    try:
        cfg = load_config(args.config, args.cfg_options)
        if args.num_images:
            preflight(cfg, ('val_dataloader',))
    except ConfigError as e:
        p.exit(2, f'{p.prog}: error: {e}\n')
    name, conv = osp.splitext(osp.basename(args.config))[0], args.convention
    if args.num_images:
        params, flops, skipped, shapes = F.dataset_flops(cfg, args.num_images, conv)
        sizes = sorted(set(shapes))
        print(f'{name} over {len(shapes)} validation image(s), input sizes (H, W) '
              f'{", ".join(map(str, sizes[:5]))}{" ..." if len(sizes) > 5 else ""}: params '
              f'{params / 1e6:.2f} M, mean FLOPs {flops / 1e9:.1f} G (whole model, convention '
              f'{conv!r})')
        return skipped
    params, flops, skipped, shape = F.model_flops(cfg, shape, conv)
    print(f'{name} @ {shape[1]}x{shape[0]}: params {params / 1e6:.2f} M, '
          f'FLOPs {flops / 1e9:.1f} G (whole model, convention {conv!r})')
    paper = F.PAPER_GFLOPS.get(name)
    if paper is not None and args.shape is None and not args.cfg_options:
        pconv = F.paper_convention(args.config)
        pf = (F.model_flops(cfg, shape, pconv)[1] if pconv != conv else flops) / 1e9
        print(f'paper: {paper} G; ours under its convention {pconv!r}: {pf:.1f} G '
              f'({_pct((pf - paper) / paper)})')
    return skipped


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config', nargs='?')
    p.add_argument('--backbone', nargs=2, metavar=('TYPE', 'ARCH'))
    p.add_argument('--shape', nargs='+', type=int, metavar='H [W]',
                   help='input size; one value: square (default: the paper\'s size)')
    p.add_argument('--num-images', type=int, metavar='N',
                   help='mean over the first N images of the validation set, each at its test '
                        'pipeline size (as mmdet\'s get_flops.py)')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction,
                   help='override config settings, key=value')
    p.add_argument('--convention', choices=sorted(F.CONVENTIONS), default='all',
                   help='what is counted (mmlinattn.analysis.flops.CONVENTIONS); default: all')
    p.add_argument('--all-backbones', action='store_true')
    p.add_argument('--zoo', action='store_true')
    p.add_argument('--json', metavar='OUT', help='with --zoo: also write the rows as JSON')
    args = p.parse_args(argv)
    if args.shape and len(args.shape) > 2:
        p.error(f'--shape takes H or H W, got {len(args.shape)} values')
    if args.num_images is not None and (args.num_images < 1 or args.shape):
        p.error('--num-images takes N >= 1 and no --shape (each image has its own size)')
    shape = (tuple(args.shape) * 2)[:2] if args.shape else None
    if args.all_backbones:
        return all_backbones() or 0
    if args.zoo:
        return zoo(args.json) or 0
    if args.backbone:
        name, arch = args.backbone
        shape = shape or (224, 224)
        params, flops, skipped = F.backbone_flops(name, arch, shape, args.convention)
        print(f'{name}-{arch} @ {shape}: params {params / 1e6:.2f} M, FLOPs {flops / 1e9:.2f} G '
              f'({args.convention})')
    elif args.config:
        skipped = count_config(p, args, shape)
    else:
        p.error('give a config, --backbone TYPE ARCH, --all-backbones or --zoo')
    if skipped:
        print('ops not counted (elementwise, as fvcore): ' +
              ', '.join(f'{k} x{v}' for k, v in sorted(skipped.items())))
    return 0


if __name__ == '__main__':
    sys.exit(main())
