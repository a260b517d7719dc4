"""Test-server submissions through tools/test.py, on toy data:

* COCO test-dev: an image-info json (``images`` and ``categories`` only, made from the toy val json
  by dropping its annotations, as COCO's ``image_info_test-dev2017.json``) with a ``CocoMetric``
  ``format_only=True, outfile_prefix=...``: passes the pre-flight and writes ``PREFIX.bbox.json``;
* the ADE20K test set: a split of images only, ``IoUMetric(format_only=True)`` with ``--out DIR``
  (mmseg's tool: ``output_dir``): one PNG per image, the model's classes + 1 (``reduce_zero_label``,
  as the ADE20K server reads them).

And the mistakes around them, each one line and exit 2 before the model is built: an image-info file
scored as if it had labels, a format_only evaluator that says nowhere to write.
"""
import json
import os
import os.path as osp
import shutil

import numpy as np
import pytest
from mmengine.config import Config
from PIL import Image

from mmlinattn.training.config import ConfigError
from mmlinattn.training.preflight import check_coco_annotations
from tools import test as test_tool

import compare
from helpers import make_toy_sets
from test_inference import checkpoint_model, reference

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CFG = osp.join(ROOT, 'configs/toy/retinanet_mavit-t_fpn_toy-coco.py')
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')


@pytest.fixture(scope='module')
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp('submission')
    make_toy_sets(r / 'data', seed=6, size=64, train=2, val=3)
    coco = r / 'data/toy_coco/annotations'
    val = json.loads((coco / 'instances_val.json').read_text())
    (coco / 'image_info_test.json').write_text(
        json.dumps(dict(images=val['images'], categories=val['categories'])))
    ade = r / 'data/toy_ade/images'
    shutil.copytree(ade / 'validation', ade / 'test')  # the ADE20K test layout: images, no labels
    return r


def write_cfg(path, base, body):
    path.write_text(f'_base_ = {base!r}\n' + body)
    return str(path)


TEST_DEV = '''
data_root = {root!r}
test_dataloader = dict(dataset=dict(
    data_root=data_root, ann_file='annotations/image_info_test.json', data_prefix=dict(img='val/'),
    pipeline=[dict(type='LoadImageFromFile'),
              dict(type='Resize', scale=(128, 128), keep_ratio=True),
              dict(type='PackDetInputs',
                   meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))]))
test_evaluator = dict(type='CocoMetric', metric='bbox', format_only={format_only},
                      ann_file=data_root + 'annotations/image_info_test.json'{prefix})
model = dict(test_cfg=dict(score_thr=0.0))  # an untrained model: keep its low scores
'''


def make_test_dev_cfg(root, tmp_path, format_only=True, prefix=None):
    body = TEST_DEV.format(root=f'{root}/data/toy_coco/', format_only=format_only,
                           prefix='' if prefix is None else f', outfile_prefix={prefix!r}')
    return write_cfg(tmp_path / 'test_dev.py', DET_CFG, body)


def test_coco_test_dev_submission(root, toy_checkpoints, tmp_path):
    det_ckpt = toy_checkpoints.det
    prefix = str(tmp_path / 'results' / 'test-dev')
    cfg = make_test_dev_cfg(root, tmp_path, prefix=prefix)
    assert test_tool.main([cfg, det_ckpt, '--work-dir', str(tmp_path / 'w')]) == 0
    info = json.loads((root / 'data/toy_coco/annotations/image_info_test.json').read_text())
    results = json.loads(open(prefix + '.bbox.json').read())
    # COCO's detection result format: one record per box, for the file's images and categories
    assert results and {r['image_id'] for r in results} == {im['id'] for im in info['images']}
    assert {r['category_id'] for r in results} <= {c['id'] for c in info['categories']}
    assert all(len(r['bbox']) == 4 and isinstance(r['score'], float) for r in results)


def test_image_info_file_without_format_only_is_one_line(root, toy_checkpoints, tmp_path, capsys):
    det_ckpt = toy_checkpoints.det
    cfg = make_test_dev_cfg(root, tmp_path, format_only=False)
    assert test_tool.main([cfg, det_ckpt, '--work-dir', str(tmp_path / 'w')]) == 2
    err = capsys.readouterr().err
    assert 'image_info_test.json: no "annotations" list' in err
    assert 'test_evaluator.format_only=True' in err and 'outfile_prefix' in err


def test_coco_format_only_needs_outfile_prefix(root, toy_checkpoints, tmp_path, capsys):
    det_ckpt = toy_checkpoints.det
    cfg = make_test_dev_cfg(root, tmp_path)
    assert test_tool.main([cfg, det_ckpt, '--work-dir', str(tmp_path / 'w')]) == 2
    err = capsys.readouterr().err
    assert 'test_evaluator: format_only=True' in err and 'test_evaluator.outfile_prefix' in err


def test_check_coco_annotations_image_info(root):
    path = str(root / 'data/toy_coco/annotations/image_info_test.json')
    assert check_coco_annotations(path, labels=False) == []
    with pytest.raises(ConfigError, match='no "annotations" list'):
        check_coco_annotations(path)
    with pytest.raises(ConfigError, match='test_evaluator.format_only=True'):
        check_coco_annotations(path, ds_key='test_dataloader.dataset')


# --------------------------------------------------------------------------- ADE20K test set
ADE_TEST = '''
test_dataloader = dict(dataset=dict(
    data_root={root!r}, data_prefix=dict(_delete_=True, img_path='images/test'),
    pipeline=[dict(type='LoadImageFromFile'),
              dict(type='Resize', scale=(128, 128), keep_ratio=True),
              dict(type='PackSegInputs')]))
test_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'], format_only={format_only})
'''


def make_ade_test_cfg(root, tmp_path, format_only=True):
    body = ADE_TEST.format(root=f'{root}/data/toy_ade', format_only=format_only)
    return write_cfg(tmp_path / 'ade_test.py', SEG_CFG, body)


@pytest.mark.slow  # 5-24 s measured on the 2-core machine
def test_ade20k_test_set_submission(root, toy_checkpoints, tmp_path):
    ckpt = toy_checkpoints.seg
    model = checkpoint_model(Config.fromfile(SEG_CFG), ckpt)
    cfg = make_ade_test_cfg(root, tmp_path)
    out = tmp_path / 'ade_submission'
    assert test_tool.main([cfg, ckpt, '--work-dir', str(tmp_path / 'w'), '--out', str(out)]) == 0
    images = sorted(os.listdir(root / 'data/toy_ade/images/test'))
    assert sorted(os.listdir(out)) == sorted(osp.splitext(n)[0] + '.png' for n in images)
    ref_cfg = Config.fromfile(cfg)
    for name in images:
        pred = np.asarray(Image.open(out / (osp.splitext(name)[0] + '.png')))
        # the model's own prediction, + 1: ADE20K's label 0 is "other" (reduce_zero_label). The
        # tool's run and this one sum alike (one image, same pipeline) but are two runs: a pixel
        # whose two best logits tie within compare.RTOL may go either way
        expected = reference(ref_cfg, model, str(root / 'data/toy_ade/images/test' / name))
        assert pred.shape == (64, 64), name
        compare.assert_same_label_maps(pred.astype(np.int64) - 1, expected.seg_logits.data,
                                       expected.pred_sem_seg.data.squeeze(0).numpy())


def test_ade_images_only_without_format_only_is_one_line(root, toy_checkpoints, tmp_path, capsys):
    seg_ckpt = toy_checkpoints.seg
    cfg = make_ade_test_cfg(root, tmp_path, format_only=False)
    assert test_tool.main([cfg, seg_ckpt, '--work-dir', str(tmp_path / 'w')]) == 2
    err = capsys.readouterr().err
    assert 'test_dataloader.dataset lists no label maps' in err
    assert 'test_evaluator.format_only=True' in err and 'output_dir' in err


def test_ade_format_only_needs_output_dir(root, toy_checkpoints, tmp_path, capsys):
    seg_ckpt = toy_checkpoints.seg
    cfg = make_ade_test_cfg(root, tmp_path)
    assert test_tool.main([cfg, seg_ckpt, '--work-dir', str(tmp_path / 'w')]) == 2
    err = capsys.readouterr().err
    assert 'test_evaluator: format_only=True' in err and 'test_evaluator.output_dir' in err


def test_seg_out_dir_is_refused_for_detection(root, toy_checkpoints, tmp_path, capsys):
    det_ckpt = toy_checkpoints.det
    d = f'{root}/data/toy_coco/'
    assert test_tool.main([DET_CFG, det_ckpt, '--out', str(tmp_path / 'preds'), '--cfg-options',
                           f'test_dataloader.dataset.data_root={d}',
                           f'test_evaluator.ann_file={d}annotations/instances_val.json']) == 2
    assert '--out' in capsys.readouterr().err
