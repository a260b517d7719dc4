"""Your own dataset (docs/custom_dataset.md): the guide's example configs train and evaluate on a
set the test writes, and a head's ``num_classes`` that disagrees with the dataset's classes stops
before any model is built.

The set: 5 classes, non-square images of mixed sizes, as a COCO-format instance set (polygons) and
an ADE20K-layout segmentation set whose label 0 is a class (``reduce_zero_label=False``). The
configs run are the files in configs/custom/, the very ones the guide shows
(``test_guide_shows_the_tested_configs`` checks that every config block of the guide is a verbatim
excerpt of the file it links), with ``--cfg-options`` that a user would pass to try them on a small
machine: the data root, a smaller image scale, 2 iterations, no workers, no ImageNet file
(``init_cfg=None``).

The class-count expectations come from the toolboxes' definitions, not from our code: mmdet's heads
(RetinaNet's sigmoid head, Mask R-CNN's box and mask heads, each of Cascade's box heads) and mmseg's
decode / auxiliary heads take ``num_classes`` = the number of the dataset's classes; mmdet's
``CocoDataset`` defaults to COCO's 80 classes and mmseg's ``ADE20KDataset`` to ADE20K's 150.
"""
import json
import os
import os.path as osp
import re
import sys

import numpy as np
import pytest
from PIL import Image, ImageDraw

from mmlinattn.training.cli import load_config
from mmlinattn.training.config import ConfigError
from mmlinattn.training.preflight import check_num_classes
from mmlinattn.training.runs import read_metrics
from tools import train as train_tool

import warm
from helpers import run_checks, work_dir_files

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CUSTOM = osp.join(ROOT, 'configs', 'custom')
DOC = osp.join(ROOT, 'docs', 'custom_dataset.md')
CLASSES = ('crack', 'dent', 'scratch', 'rust', 'hole')
SEG_CLASSES = ('background', 'road', 'building', 'vegetation', 'water')
# (width, height) of the generated images: non-square, mixed
TRAIN_SIZES = [(128, 80), (96, 128), (112, 64), (80, 104)]
VAL_SIZES = [(120, 88), (72, 112)]
COLOURS = [(230, 40, 40), (40, 200, 60), (50, 80, 230), (230, 200, 40), (200, 60, 220)]
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


# --------------------------------------------------------------------------- the set
def _scene(rng, w, h):
    """An image with 2-3 axis-aligned shapes of distinct classes: (image, [(class, x0, y0, x1,
    y1)])."""
    img = Image.fromarray((rng.random((h, w, 3)) * 60 + 90).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    objs = []
    for c in rng.choice(len(CLASSES), size=int(rng.integers(2, 4)), replace=False):
        bw, bh = int(rng.integers(w // 5, w // 2)), int(rng.integers(h // 5, h // 2))
        x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
        draw.rectangle([x0, y0, x0 + bw - 1, y0 + bh - 1], fill=COLOURS[c])
        objs.append((int(c), x0, y0, x0 + bw, y0 + bh))
    return img, objs


def _write_sets(root, seed=3):
    rng = np.random.default_rng(seed)
    coco, seg = root / 'my_coco', root / 'my_seg'
    os.makedirs(coco / 'annotations')
    ann_id = 1
    for split, sizes, seg_split in (('train', TRAIN_SIZES, 'training'),
                                    ('val', VAL_SIZES, 'validation')):
        os.makedirs(coco / split)
        os.makedirs(seg / 'images' / seg_split)
        os.makedirs(seg / 'annotations' / seg_split)
        images, anns = [], []
        for i, (w, h) in enumerate(sizes):
            img, objs = _scene(rng, w, h)
            name = f'{split}_{i}.jpg'
            img.save(coco / split / name, quality=95)
            img.save(seg / 'images' / seg_split / name, quality=95)
            label = np.zeros((h, w), np.uint8)  # 0 = background, a class of its own
            images.append(dict(id=len(images) + 1, file_name=name, width=w, height=h))
            for c, x0, y0, x1, y1 in objs:
                anns.append(dict(id=ann_id, image_id=len(images), category_id=c + 1,
                                 bbox=[x0, y0, x1 - x0, y1 - y0], area=(x1 - x0) * (y1 - y0),
                                 iscrowd=0, segmentation=[[x0, y0, x1, y0, x1, y1, x0, y1]]))
                ann_id += 1
                label[y0:y1, x0:x1] = 1 + c % (len(SEG_CLASSES) - 1)
            Image.fromarray(label).save(seg / 'annotations' / seg_split / f'{split}_{i}.png')
        cats = [dict(id=i + 1, name=n) for i, n in enumerate(CLASSES)]
        with open(coco / 'annotations' / f'instances_{split}.json', 'w') as f:
            json.dump(dict(images=images, annotations=anns, categories=cats), f)
    return coco, seg


@pytest.fixture(scope='module')
def my_data(tmp_path_factory):
    return _write_sets(tmp_path_factory.mktemp('my_data'))


# --------------------------------------------------------------------------- the guide's configs
def _config(name):
    return osp.join(CUSTOM, name)


MASK_RCNN = 'mask-rcnn_mavit-t_fpn_my-coco.py'
CASCADE = 'cascade-mask-rcnn_inline-swin-t_fpn_ms-3x_my-coco.py'
RETINANET = 'retinanet_inline-pvt-t_fpn_my-coco.py'
SEM_FPN = 'fpn_inline-pvt-t_my-seg.py'
UPERNET = 'upernet_mavit-t_my-seg.py'
ALL_CONFIGS = (MASK_RCNN, CASCADE, RETINANET, SEM_FPN, UPERNET)


def test_guide_shows_the_tested_configs():
    """Every config of configs/custom/ is linked by the guide, and every python block that follows a
    link to one of them is a verbatim excerpt of that file (so the guide cannot drift from what
    the tests below run)."""
    text = open(DOC).read()
    assert sorted(os.listdir(CUSTOM)) == sorted(ALL_CONFIGS + ('README.md',))
    shown = re.findall(r'\]\(\.\./configs/custom/([\w.-]+\.py)\)[^\n]*\n\n```python\n(.*?)```',
                       text, re.S)
    linked = set(re.findall(r'\.\./configs/custom/([\w.-]+\.py)', text))
    assert linked == set(ALL_CONFIGS)
    assert len(shown) >= len(ALL_CONFIGS)
    for name, block in shown:
        source = open(_config(name)).read()
        assert block in source, f'docs/custom_dataset.md shows a block for {name} not in the file'
    whole = {name for name, block in shown if block == open(_config(name)).read()}
    assert {MASK_RCNN, SEM_FPN} <= whole  # one detection and one segmentation config in full


def _data_args(name, coco, seg):
    det = 'coco' in name
    root = coco if det else seg
    args = [f'{k}.dataset.data_root={root}/' for k in LOADERS]
    if det:
        ann = f'{coco}/annotations/instances_val.json'
        args += [f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}']
    return args


def _small_args(name):
    """What a user passes to try a config on a small machine: small images, 2 iterations."""
    args = ['model.backbone.init_cfg=None']
    for k in LOADERS:
        args += [f'{k}.num_workers=0', f'{k}.persistent_workers=False']
    if 'coco' in name:
        resize = ('train_dataloader.dataset.pipeline.2.scales=[(128,80),(128,96)]'
                  if name == CASCADE
                  else 'train_dataloader.dataset.pipeline.2.scale=(128,96)')
        args += [resize, 'val_dataloader.dataset.pipeline.1.scale=(128,96)',
                 'test_dataloader.dataset.pipeline.1.scale=(128,96)',
                 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1']  # 4 images x batch 2
        if name == RETINANET:  # after 2 iterations no sigmoid score reaches 0.05: keep every box
            args.append('model.test_cfg.score_thr=0.0')
        else:  # fewer proposals and sampled RoIs: the RoI heads dominate a CPU step at this size
            args += ['model.train_cfg.rpn_proposal.max_per_img=100',
                     'model.test_cfg.rpn.max_per_img=30']
            stages = ['.0', '.1', '.2'] if name == CASCADE else ['']
            args += [f'model.train_cfg.rcnn{s}.sampler.num=32' for s in stages]
    else:
        args += ['train_dataloader.dataset.pipeline.2.scale=(128,96)',
                 'train_dataloader.dataset.pipeline.3.crop_size=(64,64)',
                 'model.data_preprocessor.size=(64,64)',
                 'val_dataloader.dataset.pipeline.1.scale=(128,96)',
                 'test_dataloader.dataset.pipeline.1.scale=(128,96)',
                 'train_cfg.max_iters=2', 'train_cfg.val_interval=2']
    return args


# measured on the 2-core machine (another job beside it): Cascade 82 s, Mask R-CNN 55 s, UperNet 53
# s (marked heavy: `make test-all` runs them, `make test` keeps the suite near 20 minutes), Semantic
# FPN 38 s, RetinaNet 33 s
_SLOW = pytest.mark.heavy
RUNS = [
    pytest.param(MASK_RCNN, ('coco/bbox_mAP', 'coco/segm_mAP'), id='mask-rcnn-mavit-t',
                 marks=_SLOW),
    pytest.param(RETINANET, ('coco/bbox_mAP',), id='retinanet-inline-pvt-t'),
    pytest.param(SEM_FPN, ('mIoU',), id='semantic-fpn-inline-pvt-t'),
    pytest.param(UPERNET, ('mIoU',), id='upernet-mavit-t', marks=_SLOW),
    pytest.param(CASCADE, ('coco/bbox_mAP', 'coco/segm_mAP'), id='cascade-inline-swin-t',
                 marks=_SLOW),
]


@pytest.mark.parametrize('name,metrics', RUNS)
def test_guide_config_trains_and_evaluates(my_data, tmp_path, name, metrics):
    coco, seg = my_data
    work = tmp_path / 'work'
    r = warm.run([sys.executable, osp.join(ROOT, 'tools', 'train.py'), _config(name),
                  '--work-dir', work, '--auto-scale-lr', '--cfg-options',
                  *_data_args(name, coco, seg), *_small_args(name)], cwd=ROOT, merge=True)
    out = r.stdout
    assert r.returncode == 0, out[-3000:]
    got = read_metrics(str(work))
    for m in metrics:
        assert m in got, f'{name}: no {m} in the evaluation {got}'
    # --auto-scale-lr (on in the config anyway): mmengine's own line, base batch 16 -> 2
    assert 'LR is set based on batch size of 16 and the current batch size is 2. Scaling the ' \
           'original LR by 0.125.' in out
    assert 'Scaling the original LR by 0.125' in out  # mmengine's own line: it did scale


# --------------------------------------------------------------------------- class counts
def _build(my_data, tmp_path, name, *options):
    coco, seg = my_data
    args = train_tool.parse_args([_config(name), '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                                  *_data_args(name, coco, seg), 'model.backbone.init_cfg=None',
                                  *options])
    return run_checks(train_tool.build_cfg(args))


@pytest.mark.parametrize('name,option,expected', [
    # Mask R-CNN: the mask head left smaller
    (MASK_RCNN, 'model.roi_head.mask_head.num_classes=3',
     r'model\.roi_head\.mask_head\.num_classes=3'),
    # Cascade: one of the three box stages
    (CASCADE, 'model.roi_head.bbox_head.1.num_classes=4',
     r'model\.roi_head\.bbox_head\.1\.num_classes=4'),
    # RetinaNet: a head for the first classes only
    (RETINANET, 'model.bbox_head.num_classes=2', r'model\.bbox_head\.num_classes=2'),
    # Semantic FPN: one class too few (label 4 would be out of range)
    (SEM_FPN, 'model.decode_head.num_classes=4', r'model\.decode_head\.num_classes=4'),
    # UperNet: the auxiliary head
    (UPERNET, 'model.auxiliary_head.num_classes=3', r'model\.auxiliary_head\.num_classes=3'),
], ids=['mask-rcnn-mask-head', 'cascade-stage-2', 'retinanet', 'semantic-fpn', 'upernet-auxiliary'])
def test_a_head_with_fewer_classes_stops_before_work(my_data, tmp_path, name, option, expected):
    """The labels above the head's range would fail its loss, later (test_one_run.py: mmengine's
    plain Runner fails on it too); here, one error before any work."""
    with pytest.raises(ConfigError) as e:
        _build(my_data, tmp_path, name, option)
    msg = str(e.value)
    assert re.search(expected, msg), msg
    assert 'train_dataloader.dataset.metainfo.classes has 5' in msg
    assert work_dir_files(tmp_path / 'w') == {}  # no checkpoint, no config dump


def test_config_as_shipped_passes_the_class_check(my_data, tmp_path):
    for name in ALL_CONFIGS:
        cfg = _build(my_data, tmp_path, name)
        assert cfg.train_dataloader.dataset.metainfo.classes


@pytest.mark.parametrize('name,options', [
    (MASK_RCNN, ('model.roi_head.bbox_head.num_classes=80',
                 'model.roi_head.mask_head.num_classes=80')),  # COCO's heads on a 5-class set
    (UPERNET, ('model.decode_head.num_classes=8', 'model.auxiliary_head.num_classes=8')),
], ids=['mask-rcnn-coco-heads', 'upernet'])
def test_a_larger_head_stops_before_work_unless_meant(my_data, tmp_path, name, options):
    """A head with more classes than the dataset (5 classes, written by my_data) stops before any
    work, naming each head key with its value and the dataset's count: under mmdet's own tools
    such a Mask R-CNN trains an epoch, then CocoMetric dies at the first prediction of a class
    with no category id (mmdet's NumClassCheckHook asserts the same equality).
    allow_extra_classes=True (a head pre-sized for later data): one warning, no stop; a head with
    fewer classes is never allowed."""
    with pytest.raises(ConfigError) as e:
        _build(my_data, tmp_path, name, *options)
    msg = str(e.value)
    assert all(o in msg for o in options), msg
    assert 'train_dataloader.dataset.metainfo.classes has 5' in msg
    assert 'allow_extra_classes=True' in msg
    cfg = _build(my_data, tmp_path, name, *options, 'allow_extra_classes=True')
    (line,) = check_num_classes(cfg)
    assert all(o in line for o in options), line
    with pytest.raises(ConfigError, match=r'decode_head\.num_classes=3'):
        _build(my_data, tmp_path, UPERNET, 'model.decode_head.num_classes=3',
               'model.auxiliary_head.num_classes=3', 'allow_extra_classes=True')


def test_dataset_default_classes_when_metainfo_is_missing():
    """Without metainfo.classes: mmdet's CocoDataset means COCO's 80, mmseg's ADE20KDataset 150
    (with reduce_zero_label=True: label 0 ignored, not a class)."""
    cfg = load_config(_config(MASK_RCNN))
    for k in LOADERS:
        cfg[k].dataset.pop('metainfo')
    with pytest.raises(ConfigError) as e:
        check_num_classes(cfg)
    msg = str(e.value)
    assert 'bbox_head.num_classes=5' in msg and 'mask_head.num_classes=5' in msg
    assert 'CocoDataset, no metainfo.classes) has its default 80 classes' in msg
    assert 'set train_dataloader.dataset.metainfo.classes' in msg

    cfg = load_config(osp.join(ROOT, 'configs/mavit/upernet_mavit-t_160k_ade20k-512x512.py'))
    check_num_classes(cfg)  # ADE20K's 150 heads on ADE20KDataset's 150 classes
    cfg.model.auxiliary_head.num_classes = 151  # "plus the background": wrong, 0 is ignored
    with pytest.raises(ConfigError) as e:  # a larger head: a stop too
        check_num_classes(cfg)
    line = str(e.value)
    assert re.search(r'auxiliary_head\.num_classes=151 .*ADE20KDataset.*150 classes.*'
                     r'reduce_zero_label=True', line), line
