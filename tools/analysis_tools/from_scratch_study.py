"""Why do detectors with our backbones learn slowly from scratch? A controlled comparison on the toy
COCO set: the same Mask R-CNN (toy heads), data, schedule and optimizer, only the backbone (and its
output norms) changing, with mmdet's own Swin-T-shaped SwinTransformer and ResNet-18 as references.

For each variant it prints, at initialisation, the statistics of the feature maps that reach the FPN
(per stage: RMS over all values, and the share of the energy that varies from position to position -
the signal that tells an object from the background), then trains with tools/train.py and reports
bbox / segm AP50.

    python tools/analysis_tools/from_scratch_study.py [--epochs 4]
        [--variants mavit-t,mavit-t-nonorm,...]
        [--lr 2e-4] [--data data] [--work-dir work_dirs/from_scratch_study] [--out table.md]
        [--cfg-options key=value ...] [--tag NAME] [--seeds N]

With ``--seeds N`` every variant trains N times (seeds 1..N) and the table gives each run's AP50
and, per variant, the mean and the spread (min - max): at this budget one run decides nothing.

All variants run one after another (one heavy thing at a time); on a 2-core CPU each takes a few
minutes for 4 epochs of the 160-image toy set.
"""
import argparse
import json
import os
import os.path as osp
import sys
import time

from mmlinattn.core.models import out_channels
from mmlinattn.training.cli import load_config
from mmlinattn.training.config import model_registry
from mmlinattn.training.runs import read_metrics, run_script
from tools.workshop.benchmarking import REFERENCE_BACKBONES, reference_cfg

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CFG = osp.join(ROOT, 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py')

# PVT-T in our arch format: InLine-PVT-T's widths, depths and MLP ratios with PVT-T's heads (1/2/5/8
# against InLine-PVT-T's 2/4/10/16)
PVT_T = dict(embed_dims=[64, 128, 320, 512], depths=[2, 2, 2, 2], num_heads=[1, 2, 5, 8],
             mlp_ratio=[8, 8, 4, 4])
# name -> backbone config; the FPN gets the channels the backbone returns (models.out_channels)
VARIANTS = {
    'mavit-t': dict(type='MAViT', arch='tiny', drop_path_rate=0.0, out_norm=True),
    'mavit-t-nonorm': dict(type='MAViT', arch='tiny', drop_path_rate=0.0, out_norm=False),
    'inline-pvt-t': dict(type='InLinePVT', arch='tiny', drop_path_rate=0.0, out_norm=True),
    'inline-pvt-t-nonorm': dict(type='InLinePVT', arch='tiny', drop_path_rate=0.0, out_norm=False),
    'inline-pvt-t-nonorm-mmdet-init': dict(type='InLinePVT', arch='tiny', drop_path_rate=0.0,
                                           out_norm=False, init_scheme='mmdet_pvt'),
    'inline-swin-t': dict(type='InLineSwin', arch='tiny', drop_path_rate=0.0, out_norm=True),
    'inline-swin-t-softmax': dict(type='InLineSwin', arch='tiny', attn_type='SSSS',
                                  drop_path_rate=0.0,
                                  out_norm=True),
    # PVT-T's scaffold (softmax with spatial reduction in every stage) with InLine-PVT's heads, with
    # our default init and with mmdet's PVT init (docs/design.md, "InLine-PVT's scaffold against
    # mmdet's PVT v1")
    'inline-pvt-t-ssss': dict(type='InLinePVT', arch='tiny', attn_type='SSSS', drop_path_rate=0.0,
                              out_norm=False),
    'inline-pvt-t-ssss-mmdet-init': dict(type='InLinePVT', arch='tiny', attn_type='SSSS',
                                         drop_path_rate=0.0, out_norm=False,
                                         init_scheme='mmdet_pvt'),
    # exactly PVT-T (its heads too: the function mmdet's PVT-T computes,
    # tests/test_pvt_mmdet_oracle.py) from mmdet's init
    'inline-pvt-t-ssss-pvt-heads-mmdet-init': dict(type='InLinePVT', arch=PVT_T, attn_type='SSSS',
                                                   drop_path_rate=0.0, out_norm=False,
                                                   init_scheme='mmdet_pvt'),
}
# mmdet's own backbones as references (tools.workshop.benchmarking): name -> (backbone config,
# channels of its four maps), trained here without drop path
_REF_ARGS = dict(out_indices=(0, 1, 2, 3))
REFERENCES = {
    'mmdet-swin-t': (reference_cfg('Swin-T', drop_path_rate=0.0, **_REF_ARGS),
                     REFERENCE_BACKBONES['Swin-T'][2]),
    'mmdet-pvt-t': (reference_cfg('PVT-T', drop_path_rate=0.0, **_REF_ARGS),
                    REFERENCE_BACKBONES['PVT-T'][2]),
    'mmdet-resnet-18': (reference_cfg('ResNet-18', **_REF_ARGS),
                        REFERENCE_BACKBONES['ResNet-18'][2]),
}


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
    cfg = load_config(CFG)
    models = model_registry(cfg)
    torch.manual_seed(0)
    bb = models.build(dict(backbone_cfg, init_cfg=None))
    bb.init_weights()
    bb.train()  # as the detector sees them while training (BN on batch statistics)
    folder = osp.join(data_root, 'toy_coco', 'train')
    files = sorted(os.listdir(folder))[:n_images]
    mean = torch.tensor([123.675, 116.28, 103.53]).view(1, 3, 1, 1)
    std = torch.tensor([58.395, 57.12, 57.375]).view(1, 3, 1, 1)
    x = torch.stack([torch.from_numpy(np.asarray(Image.open(osp.join(folder, f)).convert('RGB')
                                                 .resize((size, size)))).permute(2, 0, 1).float()
                     for f in files])
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
    keys = ('coco/bbox_mAP_50', 'coco/segm_mAP_50')
    ap = {key.split('/')[1]: found.get(key, float('nan')) for key in keys}
    return ap, wall


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
                   cwd=ROOT,
                   show=False)
    names = [n.strip() for n in args.variants.split(',') if n.strip()]
    unknown = [n for n in names if n not in VARIANTS and n not in REFERENCES]
    if unknown:
        p.error(f'unknown variant(s) {unknown}; choose from {[*VARIANTS, *REFERENCES]}')
    if args.seeds:
        return seeded_table(names, args)
    head = ('| backbone | FPN-input RMS, stages 1-4 | spatially varying share of the energy | '
            'bbox AP50 | segm AP50 | train+val s |\n|---|---|---|---|---|---|')

    def row(name, label, bb, ch):
        stats = feature_stats(bb, args.data)
        rms = ' / '.join(f'{s[0]:.2f}' for s in stats)
        cv = ' / '.join(f'{s[1]:.2f}' for s in stats)
        if args.stats_only:
            return f'| {label} | {rms} | {cv} | - | - | - |'
        ap, wall = train_and_eval(name, bb, ch, args, args.seed)
        return (f'| {label} | {rms} | {cv} | {ap["bbox_mAP_50"]:.3f} | {ap["segm_mAP_50"]:.3f} | '
                f'{wall:.0f} |')
    return _table(names, args, head, row, f'seed={args.seed}')


def _table(names, args, head, row, seed_note):
    """Print ``head``, then ``row(name, label, backbone cfg, FPN channels)`` per variant as it
    comes; write the table to ``--out``."""
    rows = []
    print(head, flush=True)
    for name in names:
        bb, ch = backbone(name)
        rows.append(row(name, f'{name}{" " + args.tag if args.tag else ""}', bb, ch))
        print(rows[-1], flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(f'epochs={args.epochs} lr={args.lr} {seed_note}\n\n{head}\n'
                    + '\n'.join(rows) + '\n')
    return 0


def spread(values):
    """'mean (min - max)' of the finite values."""
    import math
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return 'nan'
    return f'{sum(vals) / len(vals):.3f} ({min(vals):.3f} - {max(vals):.3f})'


def seeded_table(names, args):
    """Every variant with seeds 1..N: per-run AP50s, then mean and spread per variant."""
    seeds = list(range(1, args.seeds + 1))
    head = ('| backbone | bbox AP50 per seed (' + ', '.join(map(str, seeds)) + ') | bbox AP50 mean '
            '(min - max) | segm AP50 mean (min - max) | train+val s per run '
            '|\n|---|---|---|---|---|')

    def row(name, label, bb, ch):
        runs = [train_and_eval(name, bb, ch, args, seed) for seed in seeds]
        bbox = [ap['bbox_mAP_50'] for ap, _ in runs]
        segm = [ap['segm_mAP_50'] for ap, _ in runs]
        walls = [w for _, w in runs]
        return (f'| {label} | {", ".join(f"{v:.3f}" for v in bbox)} | {spread(bbox)} | '
                f'{spread(segm)} | {sum(walls) / len(walls):.0f} |')
    return _table(names, args, head, row, f'seeds={seeds}')


if __name__ == '__main__':
    sys.exit(main())
