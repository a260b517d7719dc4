"""The main job: toy data -> train a detector and a segmentor -> evaluate with COCO AP and mIoU.

    make demo            # (installs first) or:  .venv/bin/python tools/demo.py [--quick]

1. writes the toy datasets under data/ if they are missing (tools/misc/make_toy_datasets.py);
2. for a toy Mask R-CNN (MAViT-T) and a toy Semantic FPN (MAViT-T):
   a. evaluates the *untrained* model (random init) with tools/test.py - the chance level;
   b. trains it with tools/train.py (mmengine logs and progress);
   c. evaluates the final checkpoint with tools/test.py (the real CocoMetric / IoUMetric);
3. prints a table: untrained vs trained bbox/segm AP and mIoU, and the wall time.

Everything runs on the CPU. The terminal shows the commands, the training / testing progress lines
and the final table; the full logs are in work_dirs/demo_det and work_dirs/demo_seg (*.log).
"""
import argparse
import os
import os.path as osp
import re
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
PY = sys.executable
DET = 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py'
SEG = 'configs/toy/fpn_mavit-t_toy-ade.py'


def run(cmd, log=None):
    print('$ ' + ' '.join(cmd), flush=True)
    out = []
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, 'w') if log else open(os.devnull, 'w') as f:
        for line in proc.stdout:
            f.write(line)
            out.append(line)
            if any(k in line for k in ('Epoch(', 'Iter(', 'coco/', 'mIoU', 'Error', 'error:')):
                print('   ' + line.rstrip()[:200], flush=True)
    if proc.wait() != 0:
        tail = ''.join(out[-30:])
        raise SystemExit(f'command failed ({proc.returncode}): {" ".join(cmd)}\n{tail}')
    return ''.join(out)


def metrics(text, keys=('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50',
                         'mIoU', 'aAcc')):
    """The last value of each metric in ``keys`` that an mmengine log ``text`` reports."""
    found = {}
    for key in keys:
        m = re.findall(re.escape(key) + r"'?:\s*([-0-9.]+)", text)
        if m:
            found[key] = float(m[-1])
    return found


def untrained_checkpoint(config, path):
    """Save the randomly initialised model: the 'chance level' is measured on it."""
    import torch
    from mmengine.config import Config
    sys.path.insert(0, ROOT)
    from mmlinattn.runtime import model_registry
    cfg = Config.fromfile(osp.join(ROOT, config))
    models = model_registry(cfg)
    torch.manual_seed(0)
    model = models.build(cfg.model)
    model.init_weights()
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, osp.join(ROOT, path))


def job(name, config, work_dir, extra):
    os.makedirs(osp.join(ROOT, work_dir), exist_ok=True)
    ckpt0 = osp.join(work_dir, 'untrained.pth')
    # in its own process, logged to a file: building and initialising the model prints mmengine's
    # per-parameter init report (thousands of lines)
    run([PY, 'tools/demo.py', '--save-untrained', config, ckpt0],
        log=osp.join(ROOT, work_dir, 'untrained.log'))
    before = metrics(run([PY, 'tools/test.py', config, ckpt0, '--work-dir', work_dir + '/untrained'],
                         log=osp.join(ROOT, work_dir, 'test_untrained.log')))
    run([PY, 'tools/train.py', config, '--work-dir', work_dir] + extra,
        log=osp.join(ROOT, work_dir, 'train.log'))
    with open(osp.join(ROOT, work_dir, 'last_checkpoint')) as f:
        last = f.read().strip()
    after = metrics(run([PY, 'tools/test.py', config, last, '--work-dir', work_dir + '/trained'],
                        log=osp.join(ROOT, work_dir, 'test_trained.log')))
    return before, after


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--quick', action='store_true', help='a much shorter run (smoke test, no learning claim)')
    p.add_argument('--save-untrained', nargs=2, metavar=('CONFIG', 'PATH'), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.save_untrained:
        untrained_checkpoint(*args.save_untrained)
        return 0
    t0 = time.time()
    run([PY, 'tools/misc/make_toy_datasets.py'])
    det_extra, seg_extra = [], []
    if args.quick:
        det_extra = ['--cfg-options', 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1']
        seg_extra = ['--cfg-options', 'train_cfg.max_iters=20', 'train_cfg.val_interval=20']
    det = job('det', DET, 'work_dirs/demo_det', det_extra)
    seg = job('seg', SEG, 'work_dirs/demo_seg', seg_extra)
    wall = time.time() - t0
    rows = [('toy Mask R-CNN, MAViT-T', 'bbox AP50', 'coco/bbox_mAP_50', det, 1),
            ('toy Mask R-CNN, MAViT-T', 'bbox AP', 'coco/bbox_mAP', det, 1),
            ('toy Mask R-CNN, MAViT-T', 'segm AP50', 'coco/segm_mAP_50', det, 1),
            ('toy Semantic FPN, MAViT-T', 'mIoU', 'mIoU', seg, 1)]
    print('\n' + '=' * 72)
    print(f'{"model":28s} {"metric":10s} {"untrained":>10s} {"trained":>10s}')
    for model, label, key, (before, after), _ in rows:
        print(f'{model:28s} {label:10s} {before.get(key, float("nan")):10.3f} '
              f'{after.get(key, float("nan")):10.3f}')
    print(f'wall time: {wall / 60:.1f} min (logs and checkpoints in work_dirs/demo_det, demo_seg)')
    print('=' * 72)
    if args.quick:
        return 0
    # learning checks, set from measured runs (README): far above the untrained models
    problems = []
    if not seg[1].get('mIoU', 0) >= 50:
        problems.append(f'toy mIoU {seg[1].get("mIoU")} < 50')
    if not det[1].get('coco/bbox_mAP_50', 0) >= 0.5:
        problems.append(f'toy bbox AP50 {det[1].get("coco/bbox_mAP_50")} < 0.5')
    if problems:
        print('demo: the models did not learn as expected: ' + '; '.join(problems))
        return 1
    print('demo: both models learned (bbox AP50 >= 0.5, mIoU >= 50; untrained: ~0.01 and ~22)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
