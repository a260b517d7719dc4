"""Run images through a trained detector or segmentor; save the drawn pictures and predictions.

    python tools/image_demo.py IMAGE CONFIG CHECKPOINT [--out-dir outputs] [--score-thr 0.3]

IMAGE is an image or a folder of images; the config's ``default_scope`` picks mmdet's
``DetInferencer`` or mmseg's ``MMSegInferencer``. Writes ``OUT/vis/<image>`` (the picture) and
``OUT/preds/<stem>.json`` (detection: mmdet's format; segmentation: ``classes``, ``height``,
``width``, ``pixels`` per class and ``label_map``, the class-index PNG ``<stem>.png``). Bad input
(image, config, checkpoint, ``--device``) stops with one message, exit code 2, before anything is
written; results move into OUT only once every image is done. mmdet's and mmseg's demo flags work
too (``--weights``, ``--pred-score-thr``, ``--out-file``, ``--opacity``, ``--with-labels``).
"""
import argparse
import json
import os
import os.path as osp
import shutil
import sys
import tempfile

import mmlinattn  # noqa: F401  (registers our modules)
import mmlinattn.upstream_fixes  # noqa: F401  (mmengine on torch >= 2.6: see the module)
from mmlinattn.apis.inference import ScopeError, build_inferencer, config_scope, load_config
from mmlinattn.core import settings, weights
from mmlinattn.training.cli import tool_error

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


class InputError(ValueError):
    """Bad input to image_demo.py; the message names it."""


def image_list(path):
    """{image file: (height, width)} of ``path`` or of the images in the folder ``path`` (sorted);
    each must decode."""
    import mmcv
    if not osp.exists(path):
        raise InputError(f'image not found: {path}')
    if osp.isdir(path):
        files = sorted(osp.join(path, f) for f in os.listdir(path)
                       if f.lower().endswith(IMAGE_SUFFIXES) and osp.isfile(osp.join(path, f)))
        if not files:
            raise InputError(f'no image ({", ".join(IMAGE_SUFFIXES)}) in the folder {path}')
    else:
        files = [path]
    sizes = {}
    for f in files:
        try:
            img = mmcv.imread(f)
        except Exception:  # cv2 returns None, PIL and turbojpeg raise types of their own
            img = None
        if img is not None:
            sizes[f] = img.shape[:2]
    unreadable = [f for f in files if f not in sizes]
    if unreadable:
        raise InputError('cannot read as an image (not an image file, or corrupt): '
                         + ', '.join(unreadable))
    return sizes


def check_device(device):
    """:class:`InputError` for a ``--device`` this machine cannot run (before any work)."""
    if device is None:
        return
    import torch
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f'--device {device}: not a device name torch knows; give cpu, cuda or '
                         'cuda:N, or leave --device out') from None
    if dev.type != 'cuda':
        return
    if not torch.cuda.is_available():
        why = ('this torch is built without CUDA' if torch.version.cuda is None else
               f'this torch (CUDA {torch.version.cuda}) finds no usable GPU or driver')
        raise InputError(f'--device {device}: torch sees no CUDA GPU here ({why}); use --device '
                         'cpu, or leave --device out (cuda:0 where torch sees a GPU, else cpu)')
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise InputError(f'--device {device}: torch sees {count} CUDA GPU(s), cuda:0 ... '
                         f'cuda:{count - 1}')


def check_unique_stems(files):
    """:class:`InputError` listing the images whose preds/ files (by stem) would clash."""
    by_stem = {}
    for f in files:
        by_stem.setdefault(osp.splitext(osp.basename(f))[0], []).append(osp.basename(f))
    clashes = [', '.join(names) for names in by_stem.values() if len(names) > 1]
    if clashes:
        raise InputError("preds/ names each prediction by its image's name without the suffix (as "
                         "mmdet's demo does), and these images would overwrite each other's: "
                         f'{"; ".join(clashes)}. Rename them, run them into separate --out-dir '
                         'folders, or pass --no-save-pred')


def seg_predictions(samples, files, classes, pred_dir=None):
    """Our JSON record of each segmentation prediction (its label map PNG into ``pred_dir``)."""
    import numpy as np
    from PIL import Image
    records = []
    for sample, path in zip(samples, files):
        stem = osp.splitext(osp.basename(path))[0]
        label = sample.pred_sem_seg.data[0].cpu().numpy().astype(np.uint8)
        ids, counts = np.unique(label, return_counts=True)
        records.append(dict(img_path=path, classes=list(classes), height=int(label.shape[0]),
                            width=int(label.shape[1]),
                            pixels={classes[i]: int(c) for i, c in zip(ids, counts)},
                            label_map=stem + '.png'))
        if pred_dir:
            os.makedirs(pred_dir, exist_ok=True)
            Image.fromarray(label).save(osp.join(pred_dir, stem + '.png'))
            with open(osp.join(pred_dir, stem + '.json'), 'w') as f:
                json.dump(records[-1], f, indent=1)
    return records


def run(sizes, inferencer, scope, out_dir, args):
    """Write into ``out_dir``/vis and /preds (vis/ is drawn for ``--out-file`` either way)."""
    files = list(sizes)
    draw = not args.no_save_vis or args.out_file
    shown = dict(show=args.show, wait_time=args.wait_time, batch_size=args.batch_size)
    if scope == 'mmdet':
        inferencer(files, out_dir=out_dir, no_save_pred=args.no_save_pred, no_save_vis=not draw,
                   pred_score_thr=args.score_thr, print_result=args.print_result, **shown)
        return
    extra = {} if args.opacity is None else dict(opacity=args.opacity)
    # mmseg's data preprocessor batches images of one size only at test time: one call per size
    groups, by_file = {}, {}
    for f, size in sizes.items():
        groups.setdefault(1 if args.batch_size == 1 else size, []).append(f)
    for group in groups.values():  # (class labels are drawn by default; mmseg 1.2.1 has no flag)
        out = inferencer(group, return_datasamples=True, out_dir=out_dir if draw else '',
                         img_out_dir='vis', pred_out_dir='', **extra, **shown)
        by_file.update(zip(group, out if isinstance(out, list) else [out]))
    records = seg_predictions([by_file[f] for f in files], files,
                              inferencer.model.dataset_meta['classes'],
                              None if args.no_save_pred else osp.join(out_dir, 'preds'))
    for record in records if args.print_result else []:
        print(json.dumps(record))


def move_into(src, dst):
    """Move every file under ``src`` to the same place under ``dst`` (replacing older ones)."""
    moved = []
    for folder, _, names in os.walk(src):
        target = osp.join(dst, osp.relpath(folder, src))
        os.makedirs(target, exist_ok=True)
        for name in names:
            os.replace(osp.join(folder, name), osp.join(target, name))
            moved.append(osp.join(target, name))
    return moved


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('image', help='an image file or a folder of images')
    p.add_argument('config', help='a detection (mmdet) or segmentation (mmseg) config')
    p.add_argument('checkpoint', nargs='?', help="the trained model's checkpoint")
    p.add_argument('--weights', help="the checkpoint, as mmdet's demo names it")
    p.add_argument('--out-dir', default='outputs',
                   help='where vis/ and preds/ go (default: outputs)')
    p.add_argument('--score-thr', '--pred-score-thr', dest='score_thr', type=float, default=0.3,
                   help='detection: boxes drawn from this score')
    p.add_argument('--device', default=None,
                   help="default: cuda:0 when torch sees a GPU, else cpu (as mmdet's demo)")
    p.add_argument('--batch-size', type=int, default=1, help='images per forward')
    p.add_argument('--no-save-vis', action='store_true', help='no vis/ pictures')
    p.add_argument('--no-save-pred', action='store_true', help='no preds/ files')
    p.add_argument('--print-result', action='store_true', help='print the predictions')
    p.add_argument('--show', action='store_true', help='show each picture (needs a display)')
    p.add_argument('--wait-time', type=float, default=0, help='--show: seconds per picture')
    p.add_argument('--out-file', help='one image: write its picture to this file too')
    p.add_argument('--opacity', type=float, help='segmentation: opacity of the class overlay')
    p.add_argument('--with-labels', action='store_true',
                   help='segmentation: class names on the picture (drawn anyway here)')
    args = p.parse_args(argv)
    if args.weights and args.checkpoint and args.weights != args.checkpoint:
        p.error(f'two checkpoints: {args.checkpoint} and --weights {args.weights}')
    args.checkpoint = args.checkpoint or args.weights
    if not args.checkpoint:
        p.error('give the checkpoint (IMAGE CONFIG CHECKPOINT, or --weights CHECKPOINT)')
    if args.opacity is not None and not 0 < args.opacity <= 1:
        p.error(f'--opacity {args.opacity}: give a value in (0, 1]')
    if args.batch_size < 1:
        p.error('--batch-size must be at least 1')
    try:
        settings.check_all()  # a bad MMLINATTN_* value: one line, before any work
        check_device(args.device)
        sizes = image_list(args.image)
        files = list(sizes)
        if args.out_file and len(files) != 1:
            raise InputError(f'--out-file takes one image; {args.image} holds {len(files)}')
        if not args.no_save_pred:
            check_unique_stems(files)
        if not osp.isfile(args.config):
            raise InputError(f'config not found: {args.config}')
        cfg = load_config(args.config)
        scope = config_scope(cfg, args.config)
        # a URL: fetched once (torch's hub cache)
        args.checkpoint = weights.local_checkpoint(args.checkpoint)
        if not osp.isfile(args.checkpoint):
            raise InputError(f'checkpoint not found: {args.checkpoint}')
        weights.read_checkpoint(args.checkpoint)  # no checkpoint: CheckpointError naming it
        if args.device is None:
            import torch
            args.device = 'cuda:0' if torch.cuda.is_available() else 'cpu'
        inferencer = build_inferencer(cfg, args.checkpoint, args.device)
        # the inferencers load non-strictly (a checkpoint of another model would run half-random)
        weights.check_model_checkpoint(inferencer.model, args.checkpoint,
                                       backbone_cfg=cfg.model.get('backbone'),
                                       allow_attention_change=bool(cfg.get('allow_attention_change')))
    except (InputError, ScopeError, weights.CheckpointError, settings.SettingError) as e:
        return tool_error('image_demo.py', e)
    parent = osp.dirname(osp.abspath(args.out_dir))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix='.image_demo-', dir=parent)
    try:
        run(sizes, inferencer, scope, work, args)
        if args.out_file:
            os.makedirs(osp.dirname(osp.abspath(args.out_file)), exist_ok=True)
            shutil.copyfile(osp.join(work, 'vis', osp.basename(files[0])), args.out_file)
        if args.no_save_vis:
            shutil.rmtree(osp.join(work, 'vis'), ignore_errors=True)
        moved = move_into(work, args.out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    pictures = [m for m in moved if osp.basename(osp.dirname(m)) == 'vis']
    saved = [f'{len(pictures)} picture(s) in {osp.join(args.out_dir, "vis")}'] * (
        not args.no_save_vis) + [f'predictions in {osp.join(args.out_dir, "preds")}'] * (
        not args.no_save_pred) + [f'picture in {args.out_file}'] * bool(args.out_file)
    print(f'{len(files)} image(s), {"detection" if scope == "mmdet" else "segmentation"}: '
          f'{", ".join(saved) or "nothing saved"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
