"""Run images through a trained detector or segmentor and save the drawn pictures and the
predictions.

    python tools/image_demo.py IMAGE CONFIG CHECKPOINT [--out-dir outputs] [--score-thr 0.3]
                               [--device cpu]

IMAGE is an image file or a folder of images. The config's ``default_scope`` picks the inferencer:
mmdet's ``DetInferencer`` for detection configs (Mask R-CNN, Cascade, RetinaNet), mmseg's
``MMSegInferencer`` for segmentation configs (Semantic FPN, UperNet). Writes, per image:

- ``OUT/vis/<image name>``: the picture drawn by mmdet's / mmseg's visualizer (boxes and masks with
  score >= --score-thr; the class overlay);
- ``OUT/preds/<image stem>.json``: the predictions. Detection: mmdet's own format (``labels``,
  ``scores``, ``bboxes`` as x1, y1, x2, y2 in image pixels, ``masks`` as COCO RLE). Segmentation:
  ``classes``, the image ``height``/``width``, ``pixels`` per predicted class and ``label_map``, the
  file ``OUT/preds/<image stem>.png`` that holds the class index of every pixel.

Bad input (an image path that does not exist, a file that is not a readable image, a folder with no
image, a config of another toolbox, a checkpoint that is missing, unreadable or of another model)
stops with one message naming it, exit code 2, before anything is written; the results are moved
into OUT only once every image has been processed.
"""
import argparse
import json
import os
import os.path as osp
import shutil
import sys
import tempfile

import mmlinattn  # noqa: F401  (registers our modules, applies the stack fixes)
from mmlinattn.checkpoint import (
    CheckpointError,
    check_model_checkpoint,
    local_checkpoint,
    read_checkpoint,
)
from mmlinattn.visualization import ScopeError, build_inferencer, config_scope, load_config

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


class InputError(ValueError):
    """Bad input to image_demo.py; the message names it."""


def image_list(path):
    """The image files to run: ``path`` itself, or the images in the folder ``path`` (sorted); each
    must decode."""
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
    unreadable = []
    for f in files:
        try:
            ok = mmcv.imread(f) is not None
        except Exception:  # noqa: BLE001 - any decoder error means the same to the user
            ok = False
        if not ok:
            unreadable.append(f)
    if unreadable:
        raise InputError('cannot read as an image (not an image file, or corrupt): '
                         + ', '.join(unreadable))
    return files


def seg_predictions(samples, files, classes, pred_dir):
    """Our JSON (and the label map PNG) for each segmentation prediction."""
    import numpy as np
    from PIL import Image
    os.makedirs(pred_dir, exist_ok=True)
    for sample, path in zip(samples, files):
        stem = osp.splitext(osp.basename(path))[0]
        label = sample.pred_sem_seg.data[0].cpu().numpy().astype(np.uint8)
        Image.fromarray(label).save(osp.join(pred_dir, stem + '.png'))
        ids, counts = np.unique(label, return_counts=True)
        record = dict(img_path=path, classes=list(classes), height=int(label.shape[0]),
                      width=int(label.shape[1]),
                      pixels={classes[i]: int(c) for i, c in zip(ids, counts)},
                      label_map=stem + '.png')
        with open(osp.join(pred_dir, stem + '.json'), 'w') as f:
            json.dump(record, f, indent=1)


def run(files, inferencer, scope, out_dir, score_thr):
    """Everything is written into ``out_dir``/vis and ``out_dir``/preds."""
    if scope == 'mmdet':
        inferencer(files, out_dir=out_dir, no_save_pred=False, pred_score_thr=score_thr)
    else:
        samples = predict_to(inferencer, files, out_dir)
        seg_predictions(samples, files, inferencer.model.dataset_meta['classes'],
                        osp.join(out_dir, 'preds'))


def predict_to(inferencer, files, out_dir):
    """mmseg: the data samples, with the drawings saved under ``out_dir/vis`` on the way."""
    out = inferencer(files, return_datasamples=True, out_dir=out_dir, img_out_dir='vis',
                     pred_out_dir='')
    return out if isinstance(out, list) else [out]


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
    p.add_argument('checkpoint', help="the trained model's checkpoint")
    p.add_argument('--out-dir', default='outputs',
                   help='where vis/ and preds/ go (default: outputs)')
    p.add_argument('--score-thr', type=float, default=0.3,
                   help='detection: boxes drawn from this score')
    p.add_argument('--device', default='cpu')
    args = p.parse_args(argv)
    try:
        files = image_list(args.image)
        if not osp.isfile(args.config):
            raise InputError(f'config not found: {args.config}')
        cfg = load_config(args.config)
        scope = config_scope(cfg, args.config)
        # a URL: fetched once (torch's hub cache)
        args.checkpoint = local_checkpoint(args.checkpoint)
        if not osp.isfile(args.checkpoint):
            raise InputError(f'checkpoint not found: {args.checkpoint}')
        read_checkpoint(args.checkpoint)  # a file that is no checkpoint: CheckpointError naming it
        inferencer = build_inferencer(cfg, args.checkpoint, args.device)
        # the inferencers load non-strictly (a checkpoint of another model would run half-random)
        check_model_checkpoint(inferencer.model, args.checkpoint)
    except (InputError, ScopeError, CheckpointError) as e:
        print(f'image_demo.py: error: {e}', file=sys.stderr)
        return 2
    parent = osp.dirname(osp.abspath(args.out_dir))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix='.image_demo-', dir=parent)
    try:
        run(files, inferencer, scope, work, args.score_thr)
        moved = move_into(work, args.out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    pictures = [m for m in moved if osp.basename(osp.dirname(m)) == 'vis']
    print(f'{len(files)} image(s), {"detection" if scope == "mmdet" else "segmentation"}: '
          f'{len(pictures)} picture(s) in {osp.join(args.out_dir, "vis")}, predictions in '
          f'{osp.join(args.out_dir, "preds")}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
