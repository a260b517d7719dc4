"""Bad input gets one clear cause before any work starts (each case reproduces a user report on data
the test makes): a checkpoint of another model, a truncated latest checkpoint, label maps out of
range or of the wrong size, COCO records mmdet would drop, a neck that does not fit the backbone,
backbone arguments out of range, and --cfg-options values that cannot apply.

The expected causes come from the definitions, not from our code: mmseg's ``reduce_zero_label`` maps
a stored label v to v - 1 (0 to the ignore index 255); mmdet's ``filter_empty_gt`` drops every image
without an annotation of the dataset's classes; MAViT-T/S stage channels are the papers'
64-128-256-512 and 64-128-320-512.
"""
import json
import logging
import os
import os.path as osp
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from mmlinattn.core.weights import CheckpointError, check_model_checkpoint
from mmlinattn.training.config import ConfigError
from mmlinattn.training.preflight import check_coco_annotations
from mmlinattn.training.resume import latest_intact_checkpoint
from tools import test as test_tool
from tools import train as train_tool

from helpers import run_checks

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
DET_CFG = osp.join(ROOT, 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py')
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


def _copy(toy_data, tmp_path, sub):
    dst = tmp_path / sub
    shutil.copytree(toy_data / sub, dst)
    return dst


def _seg_args(root):
    return [f'{k}.dataset.data_root={root}/' for k in LOADERS]


def _det_args(root):
    ann = f'{root}/annotations/instances_val.json'
    return [f'{k}.dataset.data_root={root}/' for k in LOADERS] + \
        [f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}']


# -------------------- whole-model checkpoints
def _save_model_checkpoint(cfg_path, path):
    """A checkpoint as mmengine's Runner writes it, of the model the config builds."""
    from mmlinattn.training.cli import load_config
    from mmlinattn.training.config import model_registry
    cfg = load_config(cfg_path)
    model = model_registry(cfg).build(cfg.model)
    torch.save({'meta': {'epoch': 1, 'iter': 2}, 'state_dict': model.state_dict()}, path)


def test_checkpoint_of_another_size_is_never_evaluated(toy_data, tmp_path, capsys):
    ade = toy_data / 'toy_ade'
    ckpt = tmp_path / 'mavit-t.pth'
    _save_model_checkpoint(SEG_CFG, ckpt)  # MAViT-T weights
    capsys.readouterr()
    rc = test_tool.main([SEG_CFG, str(ckpt), '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                         *_seg_args(ade), 'model.backbone.arch=small',       # ... a MAViT-S config
                         'model.neck.in_channels=[64,128,320,512]'])
    out = capsys.readouterr()
    assert rc == 2
    assert 'mavit-t.pth does not fit' in out.err
    # stage 3 has 256 channels in T and 320 in S; stage 1 has 2 blocks in T and 3 in S
    assert 'checkpoint (256,) vs model (320,)' in out.err
    assert 'missing from the checkpoint' in out.err and 'backbone.layers.0.blocks.2.' in out.err
    assert "'mIoU':" not in out.out  # nothing was evaluated


def test_fitting_checkpoint_is_accepted_and_partial_load_only_warns(tmp_path, caplog):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    good = tmp_path / 'good.pth'
    torch.save({'state_dict': model.state_dict()}, good)
    assert check_model_checkpoint(model, str(good)) == dict(mismatched=[], unexpected=[],
                                                            missing=[])
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 5))  # another class count
    bad = tmp_path / 'other_classes.pth'
    torch.save({'state_dict': other.state_dict()}, bad)
    with pytest.raises(CheckpointError, match=r'other_classes\.pth.*1\.weight: checkpoint \(5, 3\) '
                                              r'vs model \(2, 3\)'):
        check_model_checkpoint(model, str(bad))
    with caplog.at_level(logging.WARNING, logger='mmlinattn'):
        report = check_model_checkpoint(model, str(bad), partial=True)
    assert len(report['mismatched']) == 2 and 'partial load' in caplog.text


def _write_ckpt(path, value):
    torch.save({'meta': {'iter': value}, 'state_dict': {'w': torch.full((64,), float(value))}},
               path)


def test_truncated_latest_checkpoint_no_longer_blocks_resume(tmp_path, caplog):
    work = tmp_path / 'work'
    work.mkdir()
    _write_ckpt(work / 'iter_2.pth', 2)
    _write_ckpt(work / 'iter_4.pth', 4)
    os.utime(work / 'iter_2.pth', (1, 1))  # older
    data = (work / 'iter_4.pth').read_bytes()
    (work / 'iter_4.pth').write_bytes(data[:len(data) // 2])  # killed while copying, say
    (work / 'last_checkpoint').write_text(str(work / 'iter_4.pth'))
    with caplog.at_level(logging.WARNING, logger='mmlinattn'):
        assert latest_intact_checkpoint(str(work), logging.getLogger('mmlinattn')) == \
            str(work / 'iter_2.pth')
    assert 'iter_4.pth' in caplog.text and 'skipped' in caplog.text

    # every checkpoint broken: an error that names them, not torch's stream-reader message
    (work / 'iter_2.pth').write_bytes(b'\0' * 10)
    with pytest.raises(CheckpointError, match=r'no intact checkpoint.*iter_4\.pth.*iter_2\.pth'):
        latest_intact_checkpoint(str(work))

    # weights put in the work dir by hand (no 'meta': nothing a Runner saved), the newest file and
    # no last_checkpoint: not resumed from; with no Runner checkpoint, a fresh start, said
    for f in work.iterdir():
        f.unlink()
    _write_ckpt(work / 'iter_2.pth', 2)
    os.utime(work / 'iter_2.pth', (1, 1))
    torch.save({'state_dict': {'w': torch.zeros(64)}}, work / 'backbone.pth')
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger='mmlinattn'):
        assert latest_intact_checkpoint(str(work), logging.getLogger('mmlinattn')) == \
            str(work / 'iter_2.pth')
    assert 'backbone.pth (no training state' in caplog.text
    (work / 'iter_2.pth').unlink()
    assert latest_intact_checkpoint(str(work)) is None


def test_resume_picks_the_intact_checkpoint_in_the_tool(toy_data, tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    _write_ckpt(work / 'iter_2.pth', 2)
    (work / 'iter_4.pth').write_bytes(b'PK\x03\x04 truncated')
    (work / 'last_checkpoint').write_text(str(work / 'iter_4.pth'))
    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(work), '--resume', '--cfg-options',
                                  *_seg_args(toy_data / 'toy_ade')])
    # the file chosen is the intact iter_2.pth (here a stand-in of another model: refused by name)
    with pytest.raises(CheckpointError, match=r'resume checkpoint .*iter_2\.pth does not fit'):
        run_checks(train_tool.build_cfg(args))


# -------------------- segmentation labels
def _set_label(path, value, box=(slice(0, 4), slice(0, 4))):
    lab = np.array(Image.open(path))
    lab[box] = value
    Image.fromarray(lab).save(path)


def test_segmentation_label_out_of_range_in_training_names_file_and_value(toy_data, tmp_path):
    ade = _copy(toy_data, tmp_path, 'toy_ade')
    victim = sorted((ade / 'annotations/training').iterdir())[1]
    _set_label(victim, 200)  # stored 200 -> 199 after reduce_zero_label; 4 classes
    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                                  *_seg_args(ade)])
    with pytest.raises(ConfigError) as e:
        run_checks(train_tool.build_cfg(args))
    msg = str(e.value)
    assert victim.name in msg and '[199]' in msg and '[0, 4)' in msg
    assert 'train_dataloader.dataset' in msg and 'num_classes' in msg


def test_segmentation_label_out_of_range_in_test_is_not_scored(toy_data, tmp_path, capsys):
    ade = _copy(toy_data, tmp_path, 'toy_ade')
    victim = sorted((ade / 'annotations/validation').iterdir())[0]
    _set_label(victim, 6)  # -> 5, outside [0, 4); 255 stays the ignore index
    _set_label(victim, 0, (slice(10, 12), slice(10, 12)))
    (tmp_path / 'unused.pth').write_bytes(b'')  # the data is checked before the checkpoint is read
    rc = test_tool.main([SEG_CFG, str(tmp_path / 'unused.pth'), '--cfg-options', *_seg_args(ade)])
    err = capsys.readouterr().err
    assert rc == 2 and victim.name in err and '[5]' in err and 'test_dataloader.dataset' in err


def test_label_map_of_another_size_than_its_image(toy_data, tmp_path):
    ade = _copy(toy_data, tmp_path, 'toy_ade')
    victim = sorted((ade / 'annotations/training').iterdir())[2]
    w, h = Image.open(ade / 'images/training' / victim.with_suffix('.jpg').name).size
    Image.open(victim).resize((w, h + 16), Image.NEAREST).save(victim)
    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                                  *_seg_args(ade)])
    with pytest.raises(ConfigError,
                       match=rf'{victim.name} is {w}x{h + 16} but its image .* is {w}x{h}'):
        run_checks(train_tool.build_cfg(args))


def test_segmentation_set_with_no_image(toy_data, tmp_path):
    ade = _copy(toy_data, tmp_path, 'toy_ade')
    for f in (ade / 'images/training').iterdir():
        f.rename(f.with_suffix('.png.bak'))
    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                                  *_seg_args(ade)])
    with pytest.raises(ConfigError, match=r"train_dataloader\.dataset: no image found .*'\.jpg'"):
        run_checks(train_tool.build_cfg(args))


# -------------------- COCO
def _rewrite(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return data


def test_coco_category_not_in_categories_is_listed(toy_data, tmp_path):
    coco = _copy(toy_data, tmp_path, 'toy_coco')
    ann = coco / 'annotations/instances_train.json'
    data = _rewrite(ann, lambda d: d['annotations'][0].update(category_id=77))
    warnings = check_coco_annotations(str(ann))
    rid = data['annotations'][0]['id']
    assert any(f'annotation {rid}: category_id 77 is not in "categories"' in w for w in warnings)


def test_coco_without_annotations_would_leave_training_empty(toy_data, tmp_path):
    coco = _copy(toy_data, tmp_path, 'toy_coco')
    _rewrite(coco / 'annotations/instances_train.json', lambda d: d.update(annotations=[]))
    args = train_tool.parse_args([DET_CFG, '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                                  *_det_args(coco)])
    with pytest.raises(ConfigError) as e:
        run_checks(train_tool.build_cfg(args))
    msg = str(e.value)
    assert 'instances_train.json' in msg and 'empty after filtering' in msg
    assert 'train_dataloader.dataset.filter_cfg.filter_empty_gt' in msg


def test_coco_with_no_image_is_an_error(tmp_path):
    path = tmp_path / 'a.json'
    path.write_text(json.dumps(dict(images=[], annotations=[], categories=[])))
    with pytest.raises(ConfigError, match=r'a\.json: "images" is empty'):
        check_coco_annotations(str(path))
    path.write_text(json.dumps(dict(annotations=[], categories=[])))
    with pytest.raises(ConfigError, match='no "images" list'):
        check_coco_annotations(str(path))


# -------------------- model assembly
def test_neck_channels_not_matching_the_backbone_name_both_keys(toy_data, tmp_path):
    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                                  *_seg_args(toy_data / 'toy_ade'),
                                  'model.neck.in_channels=[64,128,320,512]'])
    with pytest.raises(ConfigError) as e:
        run_checks(train_tool.build_cfg(args))
    msg = str(e.value)
    assert 'model.neck.in_channels=[64, 128, 320, 512]' in msg
    assert 'model.backbone.out_indices=[0, 1, 2, 3]' in msg and '[64, 128, 256, 512]' in msg
    assert not os.listdir(tmp_path)  # before any runner or work dir


def test_head_channels_without_a_neck(toy_data, tmp_path):
    """UperNet-style: no neck, the heads read the backbone at their in_index."""
    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                                  *_seg_args(toy_data / 'toy_ade'), 'model.neck=None',
                                  'model.decode_head.in_channels=[64,128,256,999]',
                                  'model.decode_head.in_index=[0,1,2,3]'])
    with pytest.raises(ConfigError, match=r'model\.decode_head\.in_channels=\[64, 128, 256, 999\].*'
                                          r'\[64, 128, 256, 512\]'):
        run_checks(train_tool.build_cfg(args))


@pytest.mark.parametrize('option,expected', [
    ('model.backbone.frozen_stages=7', r'frozen_stages=7'),
    ('model.backbone.drop_path_rate=-1', r'drop_path_rate=-1 must lie in \[0, 1\)'),
    ('model.backbone.out_indices=[]', r'out_indices is empty; choose stages from \[0, 1, 2, 3\]'),
])
def test_backbone_arguments_out_of_range_stop_before_work(toy_data, tmp_path, option, expected):
    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                                  *_seg_args(toy_data / 'toy_ade'), option])
    with pytest.raises(ConfigError, match=r'model\.backbone: .*' + expected):
        run_checks(train_tool.build_cfg(args))


# -------------------- --cfg-options
def test_cfg_option_value_of_the_wrong_type_names_key_and_value(tmp_path):
    args = train_tool.parse_args([SEG_CFG, '--cfg-options', 'train_cfg.max_iters=abc'])
    with pytest.raises(ConfigError, match=r"train_cfg\.max_iters='abc': expected a number "
                                          r"\(the config has train_cfg\.max_iters=\d+\)"):
        run_checks(train_tool.build_cfg(args))


def test_cfg_option_without_equals_is_named(capsys):
    with pytest.raises(SystemExit) as e:
        train_tool.parse_args([SEG_CFG, '--cfg-options', 'train_cfg.max_iters'])
    assert e.value.code == 2
    assert "'train_cfg.max_iters': expected key=value" in capsys.readouterr().err


def test_cfg_option_typo_that_the_class_rejects_stops_before_work():
    """A misspelt key that the object it goes to cannot take (its signature says so) stops in the
    config check, with the did-you-mean, instead of a TypeError once the runner builds it (the loop
    before training; the checkpoint hook's extra keys only at the first save, inside
    Runner.save_checkpoint)."""
    from mmlinattn.training.cli import load_config
    with pytest.raises(ConfigError, match=r'train_cfg\.max_itres: train_cfg builds '
                       r'IterBasedTrainLoop, '
                                          r'which takes no .max_itres.; '
                                          r'did you mean train_cfg\.max_iters\?'):
        load_config(SEG_CFG, {'train_cfg.max_itres': 3})
    with pytest.raises(ConfigError, match=r'builds SafeCheckpointHook, which takes no .intervall.; '
                                          r'did you mean default_hooks\.checkpoint\.interval\?'):
        load_config(SEG_CFG, {'default_hooks.checkpoint.intervall': 2})
    with pytest.raises(ConfigError, match=r'builds EpochBasedTrainLoop.*takes: .*max_epochs'):
        load_config(DET_CFG, {'train_cfg.max_iter': 1})
    # keys the classes do take are added as before (the config did not set them), and so are the
    # keys mmengine's builders take out of the dict first (a hook's priority, the optimizer
    # wrapper's constructor, a scheduler's convert_to_iter_based)
    cfg = load_config(SEG_CFG, {'default_hooks.checkpoint.max_keep_ckpts': 2,
                                'train_cfg.val_begin': 2, 'optim_wrapper.optimizer.amsgrad': True,
                                'default_hooks.checkpoint.priority': 'LOW',
                                'optim_wrapper.constructor': 'DefaultOptimWrapperConstructor',
                                'param_scheduler.0.convert_to_iter_based': True})
    assert cfg.default_hooks.checkpoint.max_keep_ckpts == 2 and cfg.train_cfg.val_begin == 2
    assert cfg.optim_wrapper.constructor == 'DefaultOptimWrapperConstructor'


def test_cfg_option_typo_elsewhere_gets_a_suggestion():
    """Where the target takes ``**kwargs`` (mmdet's datasets), a key close to one the config has
    is added with a did-you-mean warning."""
    from mmlinattn.training.cli import load_config
    with pytest.warns(UserWarning, match=r'train_dataloader\.dataset\.filter_cfgg.*did you mean '
                                         r'train_dataloader\.dataset\.filter_cfg\?'):
        load_config(DET_CFG, {'train_dataloader.dataset.filter_cfgg': {}})


# -------------------- --tta on an instance-segmentation detector
def test_tta_on_a_mask_detector_stops_before_any_work(tmp_path, capsys):
    """mmdet's DetTTAModel merges boxes only: it asserts that no prediction carries masks (read
    from mmdet's own source here, so the test notices the day mmdet adds mask TTA). Our tool stops
    on such a config in one line before anything is read - the checkpoint here does not even
    exist - naming the key that makes the model predict masks; a box detector is let through to
    the next check (the missing checkpoint)."""
    import inspect

    from mmdet.models.test_time_augs import DetTTAModel
    source = inspect.getsource(DetTTAModel)
    assert "pred_instances.get('masks', None) is None" in source, 'mmdet may merge masks now'
    missing = str(tmp_path / 'no_such.pth')
    mask_key = r'instance masks \(model\.roi_head\.mask_head\)'
    with pytest.raises(ConfigError, match=r'--tta: .*' + mask_key):
        test_tool.build_cfg(test_tool.parse_args([DET_CFG, missing, '--tta',
                                                  '--work-dir', str(tmp_path / 'w')]))
    assert test_tool.main([DET_CFG, missing, '--tta', '--work-dir', str(tmp_path / 'w')]) == 2
    err = capsys.readouterr().err
    assert 'instance masks' in err and 'Traceback' not in err
    assert not (tmp_path / 'w').exists()  # nothing was made
    box_cfg = osp.join(ROOT, 'configs/toy/retinanet_mavit-t_fpn_toy-coco.py')
    with pytest.raises(ConfigError, match=r'checkpoint file not found: .*no_such\.pth'):
        run_checks(test_tool.build_cfg(test_tool.parse_args(
            [box_cfg, missing, '--tta', '--work-dir', str(tmp_path / 'w2')])), 'test')
