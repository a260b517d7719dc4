"""The recipes: every config names its source, carries the source's values where they differ from our
bases (the table below, from the authors' / baselines' released configs), and its inherited parts
(pipelines, schedule, heads) equal upstream mmdet / mmseg configs of the same recipe, so a drift in
our `_base_` files fails here."""
import glob
import os.path as osp

import pytest
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = sorted(c for fam in ('inline_pvt', 'inline_swin', 'mavit')
                 for c in glob.glob(osp.join(ROOT, 'configs', fam, '*.py')))


def load(name):
    fam = 'mavit' if 'mavit' in name else ('inline_pvt' if 'pvt' in name else 'inline_swin')
    return Config.fromfile(osp.join(ROOT, 'configs', fam, name + '.py'))


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: osp.basename(p)[:-3])
def test_every_config_names_its_recipe_source(path):
    head = open(path).read().splitlines()[:3]
    assert head[1].startswith('# Recipe: ') and len(head[1]) > 20, head
    assert head[2].startswith('# Deviations from it: '), head


# values of the sources (MALA's released configs; PVT's and Swin's official downstream configs)
SOURCE_VALUES = {
    # PVT semantic FPN: 2e-4 at 32 images / 40k iterations = 1e-4 at 16 / 80k
    **{f'fpn_inline-pvt-{a}_80k_ade20k-512x512': dict(lr=1e-4, drop_path=0.1) for a in 'tsml'},
    # PVT detection: drop path 0.1 for T/S, none for M/L; L with 1 image per GPU, lr / 1.4
    'mask-rcnn_inline-pvt-t_fpn_1x_coco': dict(drop_path=0.1, lr=2e-4, batch=2),
    'mask-rcnn_inline-pvt-m_fpn_1x_coco': dict(drop_path=0.0),
    'mask-rcnn_inline-pvt-l_fpn_1x_coco': dict(drop_path=0.0, batch=1, lr=2e-4 / 1.4, base=8),
    'retinanet_inline-pvt-l_fpn_1x_coco': dict(drop_path=0.0, batch=1, lr=1e-4 / 1.4, base=8),
    # Swin official: UperNet 0.3; cascade S 0.2, B 0.3; Mask R-CNN 3x S 0.2; 1x T 0.2
    **{f'upernet_inline-swin-{a}_160k_ade20k-512x512': dict(drop_path=0.3, lr=6e-5) for a in 'tsb'},
    'cascade-mask-rcnn_inline-swin-s_fpn_ms-3x_coco': dict(drop_path=0.2),
    'cascade-mask-rcnn_inline-swin-b_fpn_ms-3x_coco': dict(drop_path=0.3),
    'mask-rcnn_inline-swin-s_fpn_ms-3x_coco': dict(drop_path=0.2),
    'mask-rcnn_inline-swin-t_fpn_1x_coco': dict(drop_path=0.2, lr=1e-4),
    # MALA: cascade without decay on norms; L 3x / cascade 1 image per GPU at lr 2e-4
    **{f'cascade-mask-rcnn_mavit-{a}_fpn_ms-3x_coco': dict(norm_decay_mult=0.) for a in 'sbl'},
    'cascade-mask-rcnn_mavit-l_fpn_ms-3x_coco': dict(norm_decay_mult=0., batch=1, lr=2e-4, base=8),
    'mask-rcnn_mavit-l_fpn_ms-3x_coco': dict(batch=1, lr=2e-4, base=8, drop_path=0.55),
    'mask-rcnn_mavit-t_fpn_1x_coco': dict(lr=4e-4, batch=2, drop_path=0.1),
}


@pytest.mark.parametrize('name', sorted(SOURCE_VALUES))
def test_config_holds_the_sources_values(name):
    cfg, want = load(name), SOURCE_VALUES[name]
    if 'lr' in want:
        assert cfg.optim_wrapper.optimizer.lr == pytest.approx(want['lr'], rel=1e-3)
    if 'drop_path' in want:
        assert cfg.model.backbone.drop_path_rate == want['drop_path']
    if 'batch' in want:
        assert cfg.train_dataloader.batch_size == want['batch']
    if 'base' in want:
        assert cfg.auto_scale_lr.base_batch_size == want['base']
    if 'norm_decay_mult' in want:
        assert cfg.optim_wrapper.paramwise_cfg.norm_decay_mult == want['norm_decay_mult']
        assert cfg.optim_wrapper.paramwise_cfg.custom_keys  # the base's rules are kept


def test_pvt_patch_embedding_drops_the_remainder_by_default():
    for name in ('mask-rcnn_inline-pvt-t_fpn_1x_coco', 'fpn_inline-pvt-s_80k_ade20k-512x512'):
        assert load(name).model.backbone.get('pad_patches', False) is False


# ---------------------------------------------------------------------------------------- upstream
UPSTREAM = {
    'mask-rcnn_mavit-t_fpn_1x_coco': 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    'mask-rcnn_mavit-s_fpn_ms-3x_coco': 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
    'cascade-mask-rcnn_mavit-s_fpn_ms-3x_coco':
        'mmdet::convnext/cascade-mask-rcnn_convnext-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py',
    'retinanet_mavit-t_fpn_1x_coco': 'mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py',
    'fpn_mavit-t_80k_ade20k-512x512': 'mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py',
    'upernet_mavit-t_160k_ade20k-512x512':
        'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
}


def _strip(d, drop=('in_channels', 'init_cfg', '_scope_')):
    if isinstance(d, dict):
        return {k: _strip(v, drop) for k, v in d.items() if k not in drop}
    if isinstance(d, (list, tuple)):
        return [_strip(v, drop) for v in d]
    return d


def _pipelines(cfg):
    train = cfg.train_dataloader.dataset
    while 'pipeline' not in train:
        train = train.dataset
    return _strip(train.pipeline), _strip(cfg.test_dataloader.dataset.pipeline)


def upstream(ref):
    """Load an installed mmdet/mmseg config, ``'mmdet::path/in/configs.py'``."""
    import importlib
    scope, rel = ref.split('::')
    pkg = importlib.import_module(scope)
    return Config.fromfile(osp.join(osp.dirname(pkg.__file__), '.mim', 'configs', rel))


@pytest.mark.parametrize('name', sorted(UPSTREAM))
def test_inherited_parts_equal_upstream(name):
    ours, up = load(name), upstream(UPSTREAM[name])
    assert _pipelines(ours) == _pipelines(up)
    heads = [k for k in ('rpn_head', 'roi_head', 'bbox_head', 'decode_head', 'auxiliary_head',
                         'train_cfg', 'test_cfg', 'data_preprocessor') if k in up.model]
    for k in heads:
        assert _strip(ours.model[k]) == _strip(up.model[k]), k
    if name.startswith('fpn_'):  # mmseg has SemFPN at 160k only: its schedule differs on purpose (80k, AdamW)
        assert ours.train_cfg.max_iters == 80000
        return
    assert _strip(ours.train_cfg) == _strip(up.train_cfg)
    sched = [_strip(s, ('end', 'convert_to_iter_based', '_scope_')) for s in ours.param_scheduler]
    up_sched = [_strip(s, ('end', 'convert_to_iter_based', '_scope_')) for s in up.param_scheduler]
    assert sched == up_sched
    if 'upernet' in name:
        assert ours.optim_wrapper.optimizer == up.optim_wrapper.optimizer
