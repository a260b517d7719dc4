"""Write small, learnable toy datasets in COCO, ADE20K and mmpretrain layout, deterministically.

    python tools/misc/make_toy_datasets.py                 # -> data/toy_coco, data/toy_ade
    python tools/misc/make_toy_datasets.py --out DIR --seed 0 --train 160 --val 40 --size 128

Three shape classes (circle, square, triangle; each its own colour range) on textured backgrounds.
``toy_coco``: 1-3 instances per image, polygon / RLE masks, some cut by the border. ``toy_ade``:
label 1 = background, 2-4 = the shapes, 0 = a thin unlabelled rim ("ignore" after
``reduce_zero_label``). ``toy_cls`` (``--only cls`` / ``--with-cls``, the pretraining set of
docs/finetuning.md): which shape is in the middle, in mmpretrain's CustomDataset folders. Each
set is written to a temporary folder and renamed into place when complete (a ``COMPLETE`` file).
"""
import argparse
import json
import math
import os
import os.path as osp
import shutil
import sys
import tempfile

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CLASSES = ('circle', 'square', 'triangle')
# base colour per class (RGB); each instance jitters it
COLOURS = ((220, 60, 50), (50, 170, 70), (60, 90, 220))
# (train, val, size) per dataset
DEFAULTS = dict(coco=(160, 40, 128), ade=(160, 40, 128), cls=(600, 150, 64))


def _background(rng, size):
    """Grey, low-contrast texture: smooth blobs + stripes + a little colour noise."""
    h = w = size
    base = rng.uniform(95, 150)
    coarse = rng.normal(0, 14, size=(h // 8 + 1, w // 8 + 1, 1))
    coarse = np.kron(coarse, np.ones((8, 8, 1)))[:h, :w]
    yy, xx = np.mgrid[0:h, 0:w]
    ang, freq = rng.uniform(0, math.pi), rng.uniform(0.1, 0.4)
    stripes = 8 * np.sin(freq * (xx * math.cos(ang) + yy * math.sin(ang)))[..., None]
    img = base + coarse + stripes + rng.normal(0, 5, size=(h, w, 3))
    img = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    return img.filter(ImageFilter.GaussianBlur(0.6))


def _regular_polygon(cls, cx, cy, r, rot):
    """The vertices of class ``cls``'s shape (circle: a 24-gon, square, triangle)."""
    n = (24, 4, 3)[cls]
    return [(cx + r * math.cos(rot + 2 * math.pi * i / n),
             cy + r * math.sin(rot + 2 * math.pi * i / n)) for i in range(n)]


def _shape_polygon(rng, cls, size):
    """A polygon (list of (x, y)) of class ``cls``; centres may lie near or on the border."""
    r = rng.uniform(0.14, 0.28) * size
    cx, cy = rng.uniform(-0.05, 1.05, size=2) * size
    rot = rng.uniform(0, 2 * math.pi)
    # clamped to the image: the drawn shape and the stored polygon are the same region
    return [(min(max(x, 0.0), size - 1.0), min(max(y, 0.0), size - 1.0))
            for x, y in _regular_polygon(cls, cx, cy, r, rot)]


def _mask(poly, size, fill=1):
    m = Image.new('L', (size, size), 0)
    ImageDraw.Draw(m).polygon(poly, fill=fill)
    return m


def _area(poly):
    xs, ys = np.array(poly).T
    return 0.5 * abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1)))


def _colour(rng, cls):
    return tuple(int(np.clip(c + rng.normal(0, 15), 0, 255)) for c in COLOURS[cls])


def _sample_scene(rng, size, max_tries=30):
    """1-3 shapes with at least 60 px^2 each; later shapes may occlude earlier ones."""
    shapes = []
    for _ in range(int(rng.integers(1, 4))):
        for _ in range(max_tries):
            cls = int(rng.integers(0, 3))
            poly = _shape_polygon(rng, cls, size)
            if _area(poly) >= 60:
                shapes.append((cls, poly, _colour(rng, cls)))
                break
    return shapes


def _write_coco(root, split, n, size, rng, start_id):
    img_dir = osp.join(root, split)
    os.makedirs(img_dir)
    images, anns = [], []
    ann_id = start_id
    for i in range(n):
        img = _background(rng, size)
        draw = ImageDraw.Draw(img)
        shapes = _sample_scene(rng, size)
        for cls, poly, col in shapes:
            draw.polygon(poly, fill=col)
        masks = [np.array(_mask(poly, size), dtype=bool) for _, poly, _ in shapes]
        # visible part of each shape after later ones are drawn on top of it
        visible = [m & ~np.any(masks[j + 1:] + [np.zeros_like(m)], axis=0)
                   for j, m in enumerate(masks)]
        name = f'{split}_{i:05d}.jpg'
        img.save(osp.join(img_dir, name), quality=92)
        image_id = start_id + i
        images.append(dict(id=image_id, file_name=name, width=size, height=size))
        for (cls, poly, _), m, v in zip(shapes, masks, visible):
            if v.sum() < 0.5 * m.sum() or v.sum() < 40:
                continue  # mostly hidden: unlabelled (COCO annotates visible objects)
            ys, xs = np.nonzero(v)
            x0, y0, x1, y1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
            if v.sum() != m.sum():  # partly occluded: the visible region as an RLE
                from pycocotools import mask as mask_utils
                rle = mask_utils.encode(np.asfortranarray(v.astype(np.uint8)))
                seg = dict(size=[size, size], counts=rle['counts'].decode('ascii'))
            else:
                seg = [[round(c, 2) for xy in poly for c in xy]]
            anns.append(dict(id=ann_id, image_id=image_id, category_id=cls + 1,
                             bbox=[float(x0), float(y0), float(x1 - x0), float(y1 - y0)],
                             area=float(v.sum()), segmentation=seg, iscrowd=0))
            ann_id += 1
    cats = [dict(id=i + 1, name=c, supercategory='shape') for i, c in enumerate(CLASSES)]
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    with open(osp.join(root, 'annotations', f'instances_{split}.json'), 'w') as f:
        json.dump(dict(images=images, annotations=anns, categories=cats,
                       info=dict(description='mmlinattn toy COCO')), f)
    return ann_id


def _write_ade(root, split, n, size, rng):
    img_dir, ann_dir = osp.join(root, 'images', split), osp.join(root, 'annotations', split)
    os.makedirs(img_dir)
    os.makedirs(ann_dir)
    for i in range(n):
        img = _background(rng, size)
        label = Image.new('L', (size, size), 1)  # 1 = background class
        draw, ldraw = ImageDraw.Draw(img), ImageDraw.Draw(label)
        for cls, poly, col in _sample_scene(rng, size):
            draw.polygon(poly, fill=col)
            ldraw.polygon(poly, fill=0, outline=0, width=1)  # unlabelled rim
            label.paste(cls + 2, mask=_mask(poly, size, 255).filter(ImageFilter.MinFilter(3)))
        name = f'ADE_toy_{split}_{i:05d}'
        img.save(osp.join(img_dir, name + '.jpg'), quality=92)
        label.save(osp.join(ann_dir, name + '.png'))


def _write_cls(root, split, n, size, rng):
    """Classes in turn: one shape centred in the middle third; in 30 % a smaller distractor."""
    for c in CLASSES:
        os.makedirs(osp.join(root, split, c))
    for i in range(n):
        cls = i % len(CLASSES)
        img = _background(rng, size)
        draw = ImageDraw.Draw(img)
        if rng.random() < 0.3:  # distractor: smaller, another class, anywhere
            other = int((cls + rng.integers(1, len(CLASSES))) % len(CLASSES))
            poly = _shape_polygon(rng, other, size)
            cx, cy = np.mean(poly, axis=0)
            poly = [(cx + 0.4 * (x - cx), cy + 0.4 * (y - cy)) for x, y in poly]
            draw.polygon(poly, fill=_colour(rng, other))
        r = rng.uniform(0.2, 0.34) * size
        cx, cy = rng.uniform(0.35, 0.65, size=2) * size
        rot = rng.uniform(0, 2 * math.pi)
        draw.polygon(_regular_polygon(cls, cx, cy, r, rot), fill=_colour(rng, cls))
        img.save(osp.join(root, split, CLASSES[cls], f'{split}_{i:05d}.jpg'), quality=92)


def _atomic_dataset(final_dir, writer, params):
    """Write with ``writer(tmp_dir)`` then rename into ``final_dir`` (replacing an older copy)."""
    parent = osp.dirname(osp.abspath(final_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix='.' + osp.basename(final_dir) + '.tmp-', dir=parent)
    try:
        writer(tmp)
        with open(osp.join(tmp, 'COMPLETE'), 'w') as f:
            json.dump(params, f, sort_keys=True)
        if osp.exists(final_dir):
            shutil.rmtree(final_dir)
        os.replace(tmp, final_dir)
    finally:
        if osp.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def is_complete(path, params=None):
    """True if ``path`` holds a finished dataset (made with ``params``, if given)."""
    try:
        with open(osp.join(path, 'COMPLETE')) as f:
            return params is None or json.load(f) == params
    except (OSError, ValueError):
        return False


def _two_splits(out, kind, write_split, seed, train, val, size, offset=0):
    """The dataset ``kind`` of ``write_split(tmp, i, n, rng)`` for split 0 (train) and 1 (val), the
    generator of split i seeded with ``seed + offset + i``."""
    params = dict(kind=kind, seed=seed, train=train, val=val, size=size)
    _atomic_dataset(out, lambda tmp: [write_split(tmp, i, n, np.random.default_rng(
        seed + offset + i)) for i, n in enumerate((train, val))], params)
    return params


def make_toy_coco(out, seed=0, train=160, val=40, size=128):
    last = [1]  # the val ids follow the train ones (+ 100000)

    def write(tmp, i, n, rng):
        last[0] = _write_coco(tmp, ('train', 'val')[i], n, size, rng, 100000 * i + last[0])
    return _two_splits(out, 'coco', write, seed, train, val, size)


def make_toy_ade(out, seed=0, train=160, val=40, size=128):
    return _two_splits(out, 'ade', lambda tmp, i, n, rng: _write_ade(
        tmp, ('training', 'validation')[i], n, size, rng), seed, train, val, size, 10)


def make_toy_cls(out, seed=0, train=600, val=150, size=64):
    return _two_splits(out, 'cls', lambda tmp, i, n, rng: _write_cls(
        tmp, ('train', 'val')[i], n, size, rng), seed, train, val, size, 20)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', default='data', help='parent folder of toy_coco/ and toy_ade/')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--train', type=int, help='training images (default 160; toy_cls: 600)')
    p.add_argument('--val', type=int, help='validation images (default 40; toy_cls: 150)')
    p.add_argument('--size', type=int, help='image side in pixels (default 128; toy_cls: 64)')
    p.add_argument('--force', action='store_true', help='rewrite even if complete')
    p.add_argument('--only', choices=['coco', 'ade', 'cls'], help='write only this one')
    p.add_argument('--with-cls', action='store_true',
                   help='also write toy_cls (the classification set)')
    args = p.parse_args(argv)
    for name, fn in (('coco', make_toy_coco), ('ade', make_toy_ade), ('cls', make_toy_cls)):
        if args.only not in (None, name) or (name == 'cls' and not (args.only or args.with_cls)):
            continue
        kw = {k: getattr(args, k) or d for k, d in zip(('train', 'val', 'size'), DEFAULTS[name])}
        path = osp.join(args.out, f'toy_{name}')
        if is_complete(path, dict(kind=name, seed=args.seed, **kw)) and not args.force:
            print(f'{path}: complete, kept (use --force to rewrite)')
            continue
        fn(path, seed=args.seed, **kw)
        print(f'{path}: written')
    return 0


if __name__ == '__main__':
    sys.exit(main())
