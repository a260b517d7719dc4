"""Why do detectors with our backbones learn slowly from scratch? The same toy-COCO Mask R-CNN,
data, schedule and optimizer, only the backbone changing (mmdet's Swin-T, PVT-T and ResNet-18 as
references): the FPN inputs' statistics at initialisation, then bbox / segm AP50
(docs/from_scratch.md).

    python tools/analysis_tools/from_scratch_study.py [--epochs 4] [--variants mavit-t,...]
        [--lr 2e-4] [--data data] [--work-dir DIR] [--out table.md] [--cfg-options k=v ...]
        [--tag NAME] [--seeds N] [--stats-only]
"""
import argparse
import json
import math
import os
import os.path as osp
import sys
import time

from mmlinattn.core.models import out_channels
from mmlinattn.training.cli import load_config
from mmlinattn.training.config import model_registry
from mmlinattn.training.runs import read_metrics, run_script
from tools.workshop.benchmarking import REFERENCE_BACKBONES, reference_cfg, where

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CFG = osp.join(ROOT, 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py')

# PVT-T in our arch format: InLine-PVT-T's widths, depths and MLP ratios with PVT-T's heads (1/2/5/8
# against InLine-PVT-T's 2/4/10/16)
PVT_T = dict(embed_dims=[64, 128, 320, 512], depths=[2, 2, 2, 2], num_heads=[1, 2, 5, 8],
             mlp_ratio=[8, 8, 4, 4])


def _v(kind, out_norm=False, **kw):
    return dict(type=kind, arch='tiny', drop_path_rate=0.0, out_norm=out_norm, **kw)


MMDET_INIT = dict(init_scheme='mmdet_pvt')
# name -> backbone config; the FPN gets the channels the backbone returns (models.out_channels)
VARIANTS = {
    'mavit-t': _v('MAViT', True),
    'mavit-t-nonorm': _v('MAViT'),
    'inline-pvt-t': _v('InLinePVT', True),
    'inline-pvt-t-nonorm': _v('InLinePVT'),
    'inline-pvt-t-nonorm-mmdet-init': _v('InLinePVT', **MMDET_INIT),
    'inline-swin-t': _v('InLineSwin', True),
    'inline-swin-t-softmax': _v('InLineSwin', True, attn_type='SSSS'),
    # PVT-T's scaffold (softmax with spatial reduction in every stage) with InLine-PVT's heads, with
    # our default init and with mmdet's PVT init (docs/design.md, "InLine-PVT's scaffold against
    # mmdet's PVT v1")
    'inline-pvt-t-ssss': _v('InLinePVT', attn_type='SSSS'),
    'inline-pvt-t-ssss-mmdet-init': _v('InLinePVT', attn_type='SSSS', **MMDET_INIT),
    # exactly PVT-T (its heads too: the function mmdet's PVT-T computes,
    # tests/test_pvt_mmdet_oracle.py) from mmdet's init
    'inline-pvt-t-ssss-pvt-heads-mmdet-init': dict(_v('InLinePVT', attn_type='SSSS',
                                                      **MMDET_INIT), arch=PVT_T),
}
# mmdet's own backbones as references (tools.workshop.benchmarking): name -> (backbone config,
# channels of its four maps), trained here without drop path
REFERENCES = {
    f'mmdet-{name.lower()}': (reference_cfg(name, out_indices=(0, 1, 2, 3),
                                            **({} if name == 'ResNet-18' else
                                               dict(drop_path_rate=0.0))),
                              REFERENCE_BACKBONES[name][2])
    for name in ('Swin-T', 'PVT-T', 'ResNet-18')}


def backbone(name):
    """(backbone config, FPN in_channels) of a variant."""
    if name in REFERENCES:
        return REFERENCES[name]
    return VARIANTS[name], out_channels(VARIANTS[name])


def feature_stats(backbone_cfg, data_root, n_images=8, size=128):
    """Per stage, on toy training images with the backbone in training mode: the RMS of the outputs,
    and the share of their energy that varies across positions (per image and channel, the variance
    over positions, over the mean square): 0 means every position carries the same vector, so the
    FPN and the RPN cannot tell an object from the background."""
    import numpy as np
    import torch
    from PIL import Image
    torch.manual_seed(0)
    bb = model_registry(load_config(CFG)).build(dict(backbone_cfg, init_cfg=None))
    bb.init_weights()
    bb.train()  # as the detector sees them while training (BN on batch statistics)
    folder = osp.join(data_root, 'toy_coco', 'train')
    mean = torch.tensor([123.675, 116.28, 103.53]).view(1, 3, 1, 1)
    std = torch.tensor([58.395, 57.12, 57.375]).view(1, 3, 1, 1)
    x = torch.stack([torch.from_numpy(np.asarray(Image.open(osp.join(folder, f)).convert('RGB')
                                                 .resize((size, size)))).permute(2, 0, 1).float()
                     for f in sorted(os.listdir(folder))[:n_images]])
    with torch.no_grad():
        outs = bb((x - mean) / std)
    stats = []
    for o in outs:
        o = o.double()
        total = o.pow(2).mean()
        spatial = o.var(dim=(2, 3), unbiased=False).mean()  # per image and channel, over positions
        stats.append((total.sqrt().item(), (spatial / total).item()))
    return stats


def train_and_eval(name, backbone_cfg, in_channels, args, seed):
    work = osp.join(args.work_dir, name + (f'-{args.tag}' if args.tag else '') +
                    (f'-seed{seed}' if args.seeds else ''))
    ann = f'{args.data}/toy_coco/annotations/instances_val.json'
    opts = [f'{k}.dataset.data_root={args.data}/toy_coco/'
            for k in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
    opts += [f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}',
             f'train_cfg.max_epochs={args.epochs}', f'train_cfg.val_interval={args.epochs}',
             f'param_scheduler.1.end={args.epochs}',
             f'param_scheduler.1.milestones=[{args.epochs}]',
             f'optim_wrapper.optimizer.lr={args.lr}', f'randomness.seed={seed}',
             f'model.neck.in_channels={json.dumps(in_channels)}'] + list(args.cfg_options or [])
    # the backbone is replaced as a whole through a small derived config
    derived = osp.join(work, 'config.py')
    os.makedirs(work, exist_ok=True)
    with open(derived, 'w') as f:
        f.write(f"_base_ = {CFG!r}\nmodel = dict(backbone=dict(_delete_=True, init_cfg=None, "
                f"**{backbone_cfg!r}))\n")
    t0 = time.time()
    run_script(osp.join(ROOT, 'tools/train.py'),
               [derived, '--work-dir', work, '--cfg-options', *opts],
               cwd=ROOT, log=osp.join(work, 'train.log'), show=False)
    wall = time.time() - t0
    found = read_metrics(work)  # its last validation
    return {k: found.get(f'coco/{k}', float('nan')) for k in ('bbox_mAP_50', 'segm_mAP_50')}, wall


def spread(values):
    """'mean (min - max)' of the finite values."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return 'nan'
    return f'{sum(vals) / len(vals):.3f} ({min(vals):.3f} - {max(vals):.3f})'


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--variants', default=','.join([*VARIANTS, *REFERENCES]),
                   help='comma-separated names of VARIANTS and REFERENCES')
    p.add_argument('--epochs', type=int, default=4)
    p.add_argument('--lr', type=float, default=2e-4)
    p.add_argument('--seed', type=int, default=0, help='the seed of a single run per variant')
    p.add_argument('--seeds', type=int, default=0,
                   help='train every variant N times, seeds 1..N, and report mean and spread')
    p.add_argument('--data', default=osp.join(ROOT, 'data'))
    p.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'from_scratch_study'))
    p.add_argument('--stats-only', action='store_true', help='print the feature statistics only')
    p.add_argument('--out', help='also write the table (markdown) here')
    p.add_argument('--cfg-options', nargs='+', help='extra key=value overrides for every variant '
                   '(e.g. optim_wrapper.clip_grad.max_norm=1.0)')
    p.add_argument('--tag', default='', help='suffix of the work dirs (and table rows) of this run')
    args = p.parse_args(argv)
    if not osp.isdir(osp.join(args.data, 'toy_coco')):
        run_script(osp.join(ROOT, 'tools/misc/make_toy_datasets.py'), ['--out', args.data],
                   cwd=ROOT, show=False)
    names = [n.strip() for n in args.variants.split(',') if n.strip()]
    unknown = [n for n in names if n not in VARIANTS and n not in REFERENCES]
    if unknown:
        p.error(f'unknown variant(s) {unknown}; choose from {[*VARIANTS, *REFERENCES]}')
    seeds = list(range(1, args.seeds + 1))
    if seeds:  # every variant with seeds 1..N: per-run AP50s, then mean and spread per variant
        note = f'seeds={seeds}'
        head = ('| backbone | bbox AP50 per seed (' + ', '.join(map(str, seeds)) + ') | bbox '
                'AP50 mean (min - max) | segm AP50 mean (min - max) | train+val s per run '
                '|\n|---|---|---|---|---|')
    else:
        note = f'seed={args.seed}'
        head = ('| backbone | FPN-input RMS, stages 1-4 | spatially varying share of the energy | '
                'bbox AP50 | segm AP50 | train+val s |\n|---|---|---|---|---|---|')

    def row(name, label, bb, ch):
        if seeds:
            runs = [train_and_eval(name, bb, ch, args, seed) for seed in seeds]
            bbox, segm = ([ap[k] for ap, _ in runs] for k in ('bbox_mAP_50', 'segm_mAP_50'))
            return (f'| {label} | {", ".join(f"{v:.3f}" for v in bbox)} | {spread(bbox)} | '
                    f'{spread(segm)} | {sum(w for _, w in runs) / len(runs):.0f} |')
        stats = feature_stats(bb, args.data)
        rms = ' / '.join(f'{s[0]:.2f}' for s in stats)
        cv = ' / '.join(f'{s[1]:.2f}' for s in stats)
        if args.stats_only:
            return f'| {label} | {rms} | {cv} | - | - | - |'
        ap, wall = train_and_eval(name, bb, ch, args, args.seed)
        return (f'| {label} | {rms} | {cv} | {ap["bbox_mAP_50"]:.3f} | {ap["segm_mAP_50"]:.3f} | '
                f'{wall:.0f} |')
    rows = []
    print(f'{where()}\n\n{head}', flush=True)
    for name in names:
        rows.append(row(name, f'{name}{" " + args.tag if args.tag else ""}', *backbone(name)))
        print(rows[-1], flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(f'epochs={args.epochs} lr={args.lr} {note}; {where()}\n\n{head}\n'
                    + '\n'.join(rows) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
