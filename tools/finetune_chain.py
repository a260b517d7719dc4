"""Fine-tuning from a pretrained backbone, shown end to end on data the project generates: pretrain
the backbone as a classifier on toy_cls, save it in the authors' layout, fine-tune the toy Mask
R-CNN and Semantic FPN from it and from scratch, print the table (docs/finetuning.md).

    python tools/finetune_chain.py [--backbone mavit-t|inline-pvt-t] [--out table.md] [--quick]
"""
import argparse
import os
import os.path as osp
import sys
import time

from mmlinattn.training.fileio import last_checkpoint
from mmlinattn.training.runs import read_metrics, run_script

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

# name -> family of the checkpoint layout; the configs: configs/toy/{<name>_toy-cls,
# mask-rcnn_<name>_fpn_toy-coco, fpn_<name>_toy-ade}.py
BACKBONES = {'mavit-t': 'mavit', 'inline-pvt-t': 'inline_pvt'}


def train(config, work_dir, options):
    """``tools/train.py config`` in a subprocess: (its last validation's metrics, wall seconds)."""
    t0 = time.time()
    run_script(osp.join(ROOT, 'tools/train.py'),
               [config, '--work-dir', work_dir, '--cfg-options', *options], cwd=ROOT,
               log=osp.join(work_dir, 'train.log'), echo=('Epoch(val', 'Iter(val'))
    return read_metrics(work_dir), time.time() - t0


def export_authors_layout(classifier_ckpt, family, dst):
    """Step 2: the classifier's weights under the authors' keys, as ``{'model': state}``."""
    import torch

    from mmlinattn.core.models import classifier_to_authors
    from mmlinattn.core.weights import load_runner_checkpoint  # weights-only, mmengine's types
    ck = load_runner_checkpoint(classifier_ckpt)
    torch.save({'model': classifier_to_authors(ck['state_dict'], family)}, dst)
    return dst


def derived_config(base, work_dir, checkpoint=None):
    """``base``, its backbone initialised from ``checkpoint`` (if given) as a user writes it."""
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, 'config.py')
    with open(path, 'w') as f:
        f.write(f'_base_ = {osp.join(ROOT, base)!r}\n')
        if checkpoint:
            f.write(f"model = dict(backbone=dict(init_cfg=dict(type='Pretrained', "
                    f"checkpoint={osp.abspath(checkpoint)!r})))\n")
    return path


def data_options(kind, data, quick, train_images=None):
    root = {'cls': 'toy_cls/', 'det': 'toy_coco/', 'seg': 'toy_ade'}[kind]
    opts = [f'{k}.dataset.data_root={data}/{root}' for k in ('train_dataloader', 'val_dataloader')]
    if kind == 'det':
        opts += [f'val_evaluator.ann_file={data}/toy_coco/annotations/instances_val.json']
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
    b, family = args.backbone, BACKBONES[args.backbone]
    cls_cfg, det_cfg, seg_cfg = (f'configs/toy/{b}_toy-cls.py', f'configs/toy/mask-rcnn_{b}_fpn_'
                                 'toy-coco.py', f'configs/toy/fpn_{b}_toy-ade.py')
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
        e, cls_dir = args.pretrain_epochs, osp.join(work, 'pretrain')
        cls_metrics, cls_s = train(osp.join(ROOT, cls_cfg), cls_dir, data_options(
            'cls', data, args.quick) + seed + [
            f'train_cfg.max_epochs={e}', f'train_cfg.val_interval={e}',
            f'param_scheduler.1.end={e}', f'optim_wrapper.optimizer.lr={args.pretrain_lr}'])
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
            wd = osp.join(work, f'{task}-{start}')
            results[task, start] = (({}, 0.0) if start == 'scratch' and args.skip_scratch else
                                    train(derived_config(base, wd, ckpt), wd, opts))

    rows = [(f'toy {model}, {args.backbone}', key.split('/')[-1],
             *(results[task, start][0].get(key) for start in ('scratch', 'pretrained')))
            for task, model, keys in (('det', 'Mask R-CNN', ('coco/bbox_mAP_50', 'coco/bbox_mAP',
                                                             'coco/segm_mAP_50')),
                                      ('seg', 'Semantic FPN', ('mIoU',))) for key in keys]
    acc = cls_metrics.get('accuracy/top1')
    n_img = 8 if args.quick else (args.finetune_images or 'all')
    start = (f'pretrained: {args.pretrained}' if args.pretrained else
             f'pretraining {args.pretrain_epochs} epochs ({cls_s:.0f} s, toy_cls val top-1 '
             f'{"-" if acc is None else f"{acc:.1f}"} %)')
    budget = (f'{start}; fine-tuning on {n_img} training images: {args.det_epochs} epochs (Mask '
              f'R-CNN) / {args.seg_iters} iterations (Semantic FPN), batch 4, seed {args.seed}'
              + (' - QUICK: plumbing only, the numbers mean nothing' if args.quick else ''))
    table = ['| model | metric | from scratch | fine-tuned from the pretrained backbone |',
             '|---|---|---|---|'] + [f'| {m} | {k} | ' + ' | '.join(
                 '-' if v is None else f'{v:.3f}' for v in ab) + ' |' for m, k, *ab in rows]
    text = '\n'.join([budget, ''] + table) + '\n'
    print('\n' + text + f'wall time {(time.time() - t0) / 60:.1f} min; logs under {work}')
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
