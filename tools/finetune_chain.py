"""Fine-tuning from a pretrained backbone, shown end to end on data the project generates.

    python tools/finetune_chain.py [--backbone mavit-t|inline-pvt-t] [--out table.md] [--quick]

The chain a user follows with the authors' ImageNet files, at toy scale on the CPU:

1. **pretrain**: the backbone as an mmpretrain ``ImageClassifier`` (the authors' classification neck
   and head) on the toy classification set (``data/toy_cls``: which shape is in the middle of the
   image, the shapes drawn as in the toy detection set), with ``tools/train.py
   configs/toy/<backbone>_toy-cls.py``;
2. **save**: the trained classifier is rewritten in the authors' checkpoint layout
   (``{'model': {<backbone keys>, <neck keys>, 'head.*'}}``, the same keys as their released files);
3. **fine-tune**: the toy Mask R-CNN (toy COCO) and the toy Semantic FPN (toy ADE20K layout) are
   trained twice with the same data, schedule and seed: once from random initialisation, once with
   ``model.backbone.init_cfg=dict(type='Pretrained', checkpoint=<the file of step 2>)`` - the line a
   user adds to use the authors' weights;
4. prints (and with ``--out`` writes) fine-tuned vs from-scratch bbox / segm AP and mIoU.

Fine-tuning uses a small part of the toy training sets (``--finetune-images``, 24 of 160) and a
short budget (``--det-epochs`` 8, ``--seg-iters`` 48; warm-up the first eighth), the regime where a
pretrained backbone matters: on all 160 images both starts reach the same accuracy within a few
epochs. Other options: ``--pretrain-epochs`` (10), ``--pretrained FILE`` (skip steps 1-2, e.g. with
the authors' file), ``--data`` (data/, the toy sets are written there if missing), ``--work-dir``
(work_dirs/finetune_chain), ``--seed`` (0), ``--skip-scratch``.
``--quick`` runs the same chain on a few images and iterations: it checks the plumbing only (used by
the test suite), its numbers mean nothing. Every step is a ``tools/train.py`` run whose full log is
``<work-dir>/<step>/train.log``.
"""
import argparse
import os
import os.path as osp
import sys
import time

from mmlinattn.training.fileio import last_checkpoint
from mmlinattn.training.runs import read_metrics, run_script

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

# name -> (family of the checkpoint layout, classifier config, detector config, segmentor config)
BACKBONES = {
    'mavit-t': ('mavit', 'configs/toy/mavit-t_toy-cls.py',
                'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py',
                'configs/toy/fpn_mavit-t_toy-ade.py'),
    'inline-pvt-t': ('inline_pvt', 'configs/toy/inline-pvt-t_toy-cls.py',
                     'configs/toy/mask-rcnn_inline-pvt-t_fpn_toy-coco.py',
                     'configs/toy/fpn_inline-pvt-t_toy-ade.py'),
}


def train(config, work_dir, options):
    """``tools/train.py config`` in a subprocess; returns (its last validation's metrics, wall
    seconds)."""
    t0 = time.time()
    run_script(osp.join(ROOT, 'tools/train.py'),
               [config, '--work-dir', work_dir, '--cfg-options', *options], cwd=ROOT,
               log=osp.join(work_dir, 'train.log'), echo=('Epoch(val', 'Iter(val'))
    return read_metrics(work_dir), time.time() - t0


def export_authors_layout(classifier_ckpt, family, dst):
    """Step 2: the classifier's weights under the authors' keys, as ``{'model': state}``."""
    import torch

    from mmlinattn.core.models import classifier_to_authors
    ck = torch.load(classifier_ckpt, map_location='cpu', weights_only=True)
    state = classifier_to_authors(ck['state_dict'], family)
    torch.save({'model': state}, dst)
    return dst


def derived_config(base, work_dir, checkpoint=None):
    """A config that is ``base`` with (optionally) the backbone initialised from ``checkpoint``, as
    a user writes it for the authors' files."""
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, 'config.py')
    with open(path, 'w') as f:
        f.write(f'_base_ = {osp.join(ROOT, base)!r}\n')
        if checkpoint:
            f.write(f"model = dict(backbone=dict(init_cfg=dict(type='Pretrained', "
                    f"checkpoint={osp.abspath(checkpoint)!r})))\n")
    return path


def data_options(kind, data, quick, train_images=None):
    if kind == 'cls':
        opts = [f'{k}.dataset.data_root={data}/toy_cls/'
                for k in ('train_dataloader', 'val_dataloader')]
    elif kind == 'det':
        ann = f'{data}/toy_coco/annotations/instances_val.json'
        opts = [f'{k}.dataset.data_root={data}/toy_coco/'
                for k in ('train_dataloader', 'val_dataloader')]
        opts += [f'val_evaluator.ann_file={ann}']
    else:
        opts = [f'{k}.dataset.data_root={data}/toy_ade'
                for k in ('train_dataloader', 'val_dataloader')]
    if quick:
        opts += ['train_dataloader.dataset.indices=8', 'val_dataloader.dataset.indices=4']
    elif train_images:
        opts += [f'train_dataloader.dataset.indices={train_images}']
    return opts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--backbone', choices=sorted(BACKBONES), default='mavit-t')
    p.add_argument('--pretrain-epochs', type=int, default=10)
    p.add_argument('--pretrain-lr', type=float, default=3e-4)
    p.add_argument('--pretrained',
                   help="skip steps 1-2: fine-tune from this backbone checkpoint (e.g. "
                   "the authors' ImageNet file of the same backbone)")
    p.add_argument('--finetune-images', type=int, default=24,
                   help='fine-tune on the first N training images of the toy sets (0: all 160)')
    p.add_argument('--det-epochs', type=int, default=8)
    p.add_argument('--seg-iters', type=int, default=48)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--data', default=osp.join(ROOT, 'data'))
    p.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'finetune_chain'))
    p.add_argument('--out', help='also write the table (markdown) to this file')
    p.add_argument('--quick', action='store_true',
                   help='a few images and iterations per step: plumbing only, the numbers mean '
                        'nothing')
    p.add_argument('--skip-scratch', action='store_true',
                   help='train only the fine-tuned models (the from-scratch column stays empty)')
    args = p.parse_args(argv)
    data, work = osp.abspath(args.data), osp.abspath(args.work_dir)
    if args.quick:
        args.pretrain_epochs, args.det_epochs, args.seg_iters = 1, 1, 2
    family, cls_cfg, det_cfg, seg_cfg = BACKBONES[args.backbone]
    t0 = time.time()

    for name in ('coco', 'ade', 'cls'):
        if not osp.isfile(osp.join(data, f'toy_{name}', 'COMPLETE')):  # written last, when complete
            run_script(osp.join(ROOT, 'tools/misc/make_toy_datasets.py'),
                       ['--out', data, '--only', name], cwd=ROOT)

    seed = [f'randomness.seed={args.seed}']
    if args.pretrained:
        pretrained, cls_metrics, cls_s = osp.abspath(args.pretrained), {}, 0.0
    else:
        # 1. pretrain the classifier
        e = args.pretrain_epochs
        cls_dir = osp.join(work, 'pretrain')
        cls_opts = data_options('cls', data, args.quick) + seed + [
            f'train_cfg.max_epochs={e}', f'train_cfg.val_interval={e}',
            f'param_scheduler.1.end={e}',
            f'optim_wrapper.optimizer.lr={args.pretrain_lr}']
        cls_metrics, cls_s = train(osp.join(ROOT, cls_cfg), cls_dir, cls_opts)
        # 2. save it in the authors' layout
        pretrained = export_authors_layout(
            last_checkpoint(cls_dir), family,
            osp.join(work, f'{args.backbone}_toy-cls_authors-layout.pth'))
        print(f'pretrained backbone (authors\' layout): {pretrained}', flush=True)

    # 3. fine-tune vs from scratch, same budget
    e, n = args.det_epochs, args.seg_iters
    det_iters = e * -(-(8 if args.quick else (args.finetune_images or 160)) // 4)  # batch 4
    det_opts = data_options('det', data, args.quick, args.finetune_images) + seed + [
        f'train_cfg.max_epochs={e}', f'train_cfg.val_interval={e}',
        f'param_scheduler.0.end={max(1, det_iters // 8)}',  # warm-up iterations
        f'param_scheduler.1.end={e}', f'param_scheduler.1.milestones=[{e}]']
    seg_opts = data_options('seg', data, args.quick, args.finetune_images) + seed + [
        f'train_cfg.max_iters={n}', f'train_cfg.val_interval={n}',
        f'param_scheduler.0.end={max(1, n // 8)}',
        f'param_scheduler.1.begin={max(1, n // 8)}', f'param_scheduler.1.end={n}',
        f'default_hooks.checkpoint.interval={n}']
    results = {}
    for task, base, opts in (('det', det_cfg, det_opts), ('seg', seg_cfg, seg_opts)):
        for start, ckpt in (('scratch', None), ('pretrained', pretrained)):
            if start == 'scratch' and args.skip_scratch:
                results[task, start] = ({}, 0.0)
                continue
            wd = osp.join(work, f'{task}-{start}')
            results[task, start] = train(derived_config(base, wd, ckpt), wd, opts)

    rows = []
    for task, model, keys in (('det', 'Mask R-CNN', ('coco/bbox_mAP_50', 'coco/bbox_mAP',
                                                     'coco/segm_mAP_50')),
                              ('seg', 'Semantic FPN', ('mIoU',))):
        for key in keys:
            rows.append((f'toy {model}, {args.backbone}', key.split('/')[-1],
                         results[task, 'scratch'][0].get(key),
                         results[task, 'pretrained'][0].get(key)))

    def fmt(v):
        return '-' if v is None else f'{v:.3f}'
    acc = cls_metrics.get('accuracy/top1')
    n_img = 8 if args.quick else (args.finetune_images or 'all')
    start = (f'pretrained: {args.pretrained}' if args.pretrained else
             f'pretraining {args.pretrain_epochs} epochs ({cls_s:.0f} s, toy_cls val top-1 '
             f'{"-" if acc is None else f"{acc:.1f}"} %)')
    budget = (f'{start}; fine-tuning on {n_img} training images: {args.det_epochs} epochs (Mask '
              f'R-CNN) / {args.seg_iters} iterations (Semantic FPN), batch 4, seed {args.seed}'
              + (' - QUICK: plumbing only, the numbers mean nothing' if args.quick else ''))
    table = ['| model | metric | from scratch | fine-tuned from the pretrained backbone |',
             '|---|---|---|---|'] + [f'| {m} | {k} | {fmt(a)} | {fmt(b)} |' for m, k, a, b in rows]
    text = '\n'.join([budget, ''] + table) + '\n'
    print('\n' + text + f'wall time {(time.time() - t0) / 60:.1f} min; logs under {work}')
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
