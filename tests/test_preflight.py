"""The pre-flight as one ordered pass: the config itself, then the paths of every loader, then the
files' contents, then the model (the order ``mmlinattn.training.preflight`` documents), over
one view of each dataset computed once; and the checkpoint pre-flight of a training run, which fits
a backbone file through the same code as the backbone's ``load_pretrained`` and reads a
``load_from`` once.

Expected values come from the documented order and from the definitions: a config reading three
dataset configs resolves three dataset types; a file is read once when it is opened once; the
authors' MAViT file drops its classification keys (``head.``, ``proj.``, ``norm.``) and lacks the
downstream output norms ``extra_norms.<i>``.
"""
import json
import os.path as osp
import shutil

import pytest
import torch

from mmlinattn.training.cli import load_config
from mmlinattn.training.config import ConfigError, model_registry
from mmlinattn.training.preflight import preflight

from helpers import authors_state, save_authors_file, work_dir_files

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
DET_CFG = osp.join(ROOT, 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py')
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


def _cfg(path, root, **per_loader):
    """The toy config with every loader's data_root at ``root`` and ``per_loader`` set on each
    loader's dataset (``test_dataloader`` is its own copy)."""
    cfg = load_config(path)
    for k in LOADERS:
        ds = cfg[k]['dataset']
        ds['data_root'] = f'{root}/'
        ds.update(per_loader)
    return cfg


# --------------------------------------------------------------------------- one view per dataset
def test_dataset_type_is_resolved_once_per_dataset_config(toy_data, monkeypatch):
    """ADE20KDataset without metainfo.classes: both the class-count check and the label-map check
    need the type's classes; three loaders, three dataset configs, three look-ups."""
    from mmseg.registry import DATASETS
    cfg = _cfg(SEG_CFG, toy_data / 'toy_ade', type='ADE20KDataset', metainfo=None)
    cfg.model.decode_head.num_classes = 150  # ADE20K's classes, the type's default
    looked_up = []
    real_get = DATASETS.get

    def counting_get(name):
        looked_up.append(name)
        return real_get(name)

    monkeypatch.setattr(DATASETS, 'get', counting_get)
    preflight(cfg, LOADERS)  # the toy labels 1-4 become 0-3 under reduce_zero_label: < 150
    assert looked_up == ['ADE20KDataset'] * 3


def test_the_view_holds_the_type_classes_and_paths(toy_data):
    from mmlinattn.training.preflight import dataset_views
    root = toy_data / 'toy_ade'
    cfg = _cfg(SEG_CFG, root, type='ADE20KDataset', metainfo=None)
    cfg.train_dataloader.dataset = dict(type='RepeatDataset', times=2,
                                        dataset=cfg.train_dataloader.dataset)
    views = dataset_views(cfg, LOADERS)
    assert [v.key for v in views] == ['train_dataloader.dataset.dataset', 'val_dataloader.dataset',
                                      'test_dataloader.dataset']
    from mmseg.datasets import ADE20KDataset
    assert all(v.cls is ADE20KDataset for v in views)
    assert len(views[0].classes) == 150 and views[0].classes[0] == 'wall'  # ADE20K's first class
    assert views[1].folders['img_path'] == ('images/validation',
                                            osp.join(f'{root}/', 'images/validation'))
    assert views[0].labels and views[1].labels  # scored by an IoUMetric, not format_only


# --------------------------------------------------------------------------- the documented order
def test_every_missing_path_is_reported_before_any_file_is_read(toy_data, tmp_path):
    """Stage 2 before stage 3: a corrupt train annotation file is not read while the val set's
    annotation file is missing."""
    root = tmp_path / 'toy_coco'
    shutil.copytree(toy_data / 'toy_coco', root)
    (root / 'annotations' / 'instances_train.json').write_text('{"images": [')  # truncated
    cfg = _cfg(DET_CFG, root)
    cfg.val_dataloader.dataset.ann_file = 'annotations/missing.json'
    with pytest.raises(ConfigError) as e:
        preflight(cfg, LOADERS)
    msg = str(e.value)
    assert msg.startswith('dataset paths do not exist')
    assert "val_dataloader.dataset.ann_file = 'annotations/missing.json': file not found" in msg
    assert 'JSON' not in msg


def test_file_contents_are_read_once_every_path_exists(toy_data, tmp_path):
    root = tmp_path / 'toy_coco'
    shutil.copytree(toy_data / 'toy_coco', root)
    (root / 'annotations' / 'instances_train.json').write_text('{"images": [')
    with pytest.raises(ConfigError, match=r'instances_train\.json: not valid JSON .*line 1'):
        preflight(_cfg(DET_CFG, root), LOADERS)


def test_paths_of_all_loaders_are_reported_together(toy_data, tmp_path):
    cfg = _cfg(SEG_CFG, toy_data / 'toy_ade')
    cfg.train_dataloader.dataset.data_root = str(tmp_path / 'nowhere')
    cfg.val_dataloader.dataset.data_prefix.img_path = 'images/nope'
    with pytest.raises(ConfigError) as e:
        preflight(cfg, LOADERS)
    msg = str(e.value)
    assert f"train_dataloader.dataset.data_root = '{tmp_path / 'nowhere'}': directory not found" \
        in msg
    assert "val_dataloader.dataset.data_prefix.img_path = 'images/nope': directory not found" in msg


def test_data_problems_are_reported_before_the_model(toy_data, tmp_path):
    """Stage 2 before stage 4: a missing data root and a neck that does not fit the backbone."""
    cfg = _cfg(SEG_CFG, tmp_path / 'nowhere')
    cfg.model.neck.in_channels = [64, 128, 320, 512]
    with pytest.raises(ConfigError) as e:
        preflight(cfg, LOADERS)
    msg = str(e.value)
    assert msg.startswith('dataset paths do not exist') and 'in_channels' not in msg
    cfg = _cfg(SEG_CFG, toy_data / 'toy_ade')
    cfg.model.neck.in_channels = [64, 128, 320, 512]
    with pytest.raises(ConfigError, match=r'model\.neck\.in_channels=\[64, 128, 320, 512\]'):
        preflight(cfg, LOADERS)


def test_the_config_is_checked_before_the_paths(tmp_path):
    """Stage 1 before stage 2: a head of 3 classes on the 4 toy classes, and no data at all."""
    cfg = _cfg(SEG_CFG, tmp_path / 'nowhere')
    cfg.model.decode_head.num_classes = 3
    with pytest.raises(ConfigError, match=r'model\.decode_head\.num_classes=3 but '
                                          r'train_dataloader\.dataset\.metainfo\.classes has 4'):
        preflight(cfg, LOADERS)


# --------------------------------------------------------------------------- checkpoints
def _seg_backbone(cfg):
    return model_registry(cfg).build(cfg.model.backbone)


def test_backbone_only_load_from_is_read_once(tmp_path, monkeypatch):
    from mmlinattn.training.preflight.checkpoints import prepare_checkpoints
    cfg = load_config(SEG_CFG)
    path = str(tmp_path / 'backbone.pth')
    torch.save(_seg_backbone(cfg).state_dict(), path)
    cfg.load_from = path
    reads = []
    real_load = torch.load

    def counting_load(f, *args, **kwargs):
        reads.append(str(f))
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(torch, 'load', counting_load)
    from mmlinattn.core.weights import CheckpointError
    with pytest.raises(CheckpointError, match='holds backbone weights only'):
        prepare_checkpoints(cfg)  # read once, fitted, and refused with the init_cfg to write
    assert reads.count(path) == 1
    assert cfg.load_from == path  # the config is not rewritten


def test_the_check_and_the_load_give_one_report(tmp_path):
    """The pre-flight's check-only fit reports what load_pretrained then loads; it loads nothing."""
    from mmlinattn.core.models.backbones import MAViT
    from mmlinattn.core.weights.fitting import fit_backbone_checkpoint
    path = str(tmp_path / 'mala.pth')
    state = save_authors_file(path, 'mavit', 'tiny')
    checked = MAViT(arch='tiny')
    before = {k: v.clone() for k, v in checked.state_dict().items()}
    report = fit_backbone_checkpoint(checked, path, check_only=True)
    assert all(torch.equal(before[k], v) for k, v in checked.state_dict().items())
    loaded = MAViT(arch='tiny').load_pretrained(path)
    assert report == loaded
    assert sorted(report['dropped']) == sorted(
        k for k in state if k.startswith(('head.', 'proj.', 'norm.')))
    assert sorted(report['new']) == sorted(
        f'extra_norms.{i}.norm.{n}' for i in range(4) for n in ('weight', 'bias'))


def test_a_prefix_no_key_carries_is_one_message_in_both_callers(tmp_path):
    from mmlinattn.core.models.backbones import MAViT
    from mmlinattn.core.weights import CheckpointError
    from mmlinattn.training.preflight.checkpoints import prepare_checkpoints
    path = str(tmp_path / 'mala.pth')
    torch.save({'state_dict': authors_state('mavit', 'tiny')}, path)
    with pytest.raises(CheckpointError) as direct:
        MAViT(arch='tiny').load_pretrained(path, prefix='encoder.')
    cfg = load_config(SEG_CFG)
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=path, prefix='encoder.')
    with pytest.raises(CheckpointError) as checked:
        prepare_checkpoints(cfg)
    assert str(direct.value) == f"{path}: no key starts with prefix 'encoder.'"
    assert str(checked.value) == f'model.backbone.init_cfg.checkpoint: {direct.value}'


def test_a_coco_image_info_file_passes_for_a_format_only_test_set(toy_data, tmp_path):
    """The view's ``labels``: a test set scored by a format_only evaluator needs no annotations."""
    root = tmp_path / 'toy_coco'
    shutil.copytree(toy_data / 'toy_coco', root)
    info = json.loads((root / 'annotations' / 'instances_val.json').read_text())
    info.pop('annotations')
    (root / 'annotations' / 'image_info.json').write_text(json.dumps(info))
    cfg = _cfg(DET_CFG, root)
    cfg.test_dataloader.dataset.ann_file = 'annotations/image_info.json'
    with pytest.raises(ConfigError, match='format_only=True'):
        preflight(cfg, ('test_dataloader',))
    cfg.test_evaluator = dict(type='CocoMetric', format_only=True,
                              outfile_prefix=str(tmp_path / 'out' / 'r'))
    preflight(cfg, ('test_dataloader',))


# -------------------- dataset arguments and the schedule against the run
def test_a_dataset_key_its_class_does_not_take_is_named_before_any_work(tmp_path, capsys):
    """An mmpretrain ImageNet config with only dataset.type changed to CustomDataset keeps the
    base's split='train', which CustomDataset passes on to BaseDataset.__init__ (a TypeError
    traceback before). mmpretrain's own classes are the oracle: ImageNet takes 'split',
    CustomDataset does not."""
    import inspect

    from mmpretrain.datasets import CustomDataset, ImageNet

    from tools import train as train_tool
    assert 'split' in inspect.signature(ImageNet.__init__).parameters
    assert 'split' not in inspect.signature(CustomDataset.__init__).parameters
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(f"_base_ = {osp.join(ROOT, 'configs/classification/mavit-t_in1k.py')!r}\n"
                   "train_dataloader = dict(dataset=dict(type='CustomDataset'))\n")
    assert train_tool.main([str(cfg), '--work-dir', str(tmp_path / 'w')]) == 2
    err = capsys.readouterr().err
    assert "train_dataloader.dataset.split: CustomDataset takes no 'split'" in err
    assert 'Traceback' not in err and work_dir_files(tmp_path / 'w') == {}


@pytest.mark.parametrize('case', ['cls-max-epochs', 'seg-max-iters'])
def test_a_schedule_that_ends_before_it_begins_is_named(case, tmp_path, capsys):
    """train_cfg.max_epochs=1 on the 300-epoch classification recipe (its cosine phase begins at
    epoch 20 and ends at the run's end) and max_iters=4 on a segmentation config whose poly phase
    begins after a 50-iteration warm-up: mmengine's 'end should be larger than begin' after the
    model was built, before. Here: one line naming the phase, begin, end and where the end came
    from."""
    from mmlinattn.training.cli import load_config
    from mmlinattn.training.config import ConfigError
    from mmlinattn.training.preflight import check_param_schedulers
    if case == 'cls-max-epochs':
        cfg = load_config(osp.join(ROOT, 'configs/classification/mavit-t_in1k.py'),
                          {'train_cfg.max_epochs': 1})
        with pytest.raises(ConfigError, match=r'param_scheduler\.1 \(CosineAnnealingLR, '
                           r'by_epoch=True\) begins at epoch \d+ and ends at epoch 1 \(its end '
                           r'defaults to train_cfg.max_epochs=1\)'):
            check_param_schedulers(cfg)
    else:
        cfg = load_config(osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py'),
                          {'train_cfg.max_iters': 4})
        cfg.param_scheduler[1].pop('end')  # a poly phase to the end of the run, after a warm-up
        with pytest.raises(ConfigError, match=r'param_scheduler\.1 \(PolyLR, by_epoch=False\) '
                           r'begins at iteration 40 and ends at iteration 4'):
            check_param_schedulers(cfg)
        # a by_epoch phase in an iteration-based run: mmengine counts the loop as 1 epoch
        cfg.param_scheduler[1].update(by_epoch=True, begin=2)
        with pytest.raises(ConfigError, match=r'begins at epoch 2 and ends at epoch 1 \(its end '
                           r'defaults to the run\'s length, 1 epoch: mmengine counts an '
                           r'iteration-based loop as one epoch\)'):
            check_param_schedulers(cfg)
    # a shortened run whose phases only reach past its end: a warning, not an error
    cfg = load_config(osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py'),
                      {'train_cfg.max_iters': 4})
    warned = check_param_schedulers(cfg)
    assert warned and all('will not reach its end' in w or 'never starts' in w for w in warned)


# -------------------- compile with inputs that change size
@pytest.mark.parametrize('config, why', [
    ('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py', "Resize(keep_ratio=True) follows each"),
    ('configs/inline_swin/mask-rcnn_inline-swin-t_fpn_ms-3x_coco.py', 'RandomChoiceResize draws'),
    ('configs/mavit/upernet_mavit-t_160k_ade20k-512x512.py', None),  # padded to 512 x 512
    ('configs/classification/mavit-t_in1k.py', None),  # crops of one size
])
def test_which_training_inputs_change_size(config, why):
    """The oracle is each recipe's own pipeline: mmdet's keep-ratio and multi-scale resizes give
    another size per image; mmseg's preprocessor pads every crop to 512 x 512; mmpretrain's
    RandomResizedCrop gives 224 x 224. A fixed-size Pad after the resize fixes it."""
    from mmlinattn.training.cli import load_config
    from mmlinattn.training.preflight.compile import size_varies
    cfg = load_config(osp.join(ROOT, config))
    got = size_varies(cfg)
    assert (got is None) if why is None else (why in got), got
    if why:
        cfg.train_dataloader.dataset.pipeline.insert(-1, dict(type='Pad', size=(1344, 1344)))
        assert size_varies(cfg) is None


def test_compile_where_inputs_change_size_is_a_warning(toy_data, tmp_path, monkeypatch, capsys):
    """compile=True on a detector config (keep-ratio resizing): a warning naming the transform and
    the ways round it, and the run goes on to its next check (here: a head with fewer classes
    than the dataset, refused before any training), as mmseg's own tool trains such a config
    (tests/test_one_run.py, heavy: test_the_compile_warning_stands_where_upstream_trains).
    compile=dict(dynamic=False) and another backend are the user's choice: no warning."""
    from mmengine.logging import MMLogger

    from tools import train as train_tool

    from helpers import toy_coco_options
    said = []
    warning = MMLogger.warning
    monkeypatch.setattr(MMLogger, 'warning',
                        lambda self, msg, *a, **k: (said.append(str(msg)),
                                                    warning(self, msg, *a, **k)))
    cfg = osp.join(ROOT, 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py')
    data = toy_coco_options(toy_data / 'toy_coco')
    for setting, warned in (('compile=True', True), ('compile.dynamic=False', False),
                            ('compile.backend=aot_eager', False)):
        said.clear()
        assert train_tool.main([cfg, '--work-dir', str(tmp_path / 'w'), '--cfg-options', setting,
                                *data, 'model.roi_head.bbox_head.num_classes=1']) == 2
        compiled = [m for m in said if m.startswith('compile:')]
        assert len(compiled) == int(warned), said
        if warned:
            assert 'change size (Resize(keep_ratio=True)' in compiled[0]
            assert 'compile=dict(dynamic=False)' in compiled[0]
            assert 'BatchFixedSizePad' in compiled[0]
        # the run went on to the checks after the compile warning: the class count's refusal
        err = [line for line in capsys.readouterr().err.splitlines()
               if line.startswith('tools/')]
        assert len(err) == 1 and "num_classes do not match the dataset's classes" in err[0], err


def test_a_package_base_mmengine_refuses_is_one_line_with_the_path(tmp_path, capsys):
    """mmengine 0.10 asserts that a PACKAGE:: base is one of OpenMMLab's own packages (an
    AssertionError traceback); our train.py names the entry and the path to write instead, which
    is the file itself."""
    import re

    from tools import train as train_tool
    cfg = tmp_path / 'mine.py'
    cfg.write_text("_base_ = 'mmlinattn::toy/fpn_mavit-t_toy-ade.py'\n")
    assert train_tool.main([str(cfg), '--work-dir', str(tmp_path / 'w')]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith('tools/')]
    assert len(err) == 1 and "_base_ 'mmlinattn::toy/fpn_mavit-t_toy-ade.py'" in err[0], err
    path = re.search(r"_base_ = \['([^']+)'\]", err[0]).group(1)
    assert osp.samefile(path, osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py'))


def test_show_dir_on_a_segmentation_config_checks_the_training_folders(toy_data, tmp_path, capsys):
    """mmseg's SegVisualizationHook draws with step=runner.iter, which builds the training loop and
    its train_dataloader: with the training folders absent, mmseg's run stops with a traceback at
    the first drawn image. Here the pre-flight names them before any work."""
    from tools import test as test_tool
    cfg = osp.join(ROOT, 'configs/mavit/fpn_mavit-t_80k_ade20k-512x512.py')  # it draws
    ckpt = tmp_path / 'ck.pth'
    ckpt.write_bytes(b'read only after the pre-flight')
    rc = test_tool.main([cfg, str(ckpt), '--show-dir', str(tmp_path / 'vis'),
                         '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                         f'test_dataloader.dataset.data_root={toy_data}/toy_ade',
                         f'train_dataloader.dataset.data_root={tmp_path}/absent'])
    err = capsys.readouterr().err
    err = err[err.index('tools/test.py: error:'):]  # the pre-flight's list of missing paths
    assert rc == 2 and 'train_dataloader' in err and f'{tmp_path}/absent' in err, err
    assert 'SegVisualizationHook' in err and 'val_dataloader' not in err
