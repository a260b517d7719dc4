"""The recipes: every config holds its source's values, written below as read from the source
configs (MALA's released configs; PVT's and Swin's official downstream configs; mmdet's Swin
RetinaNet), field by field - optimizer type, lr, betas or momentum, weight decay, the parameters
kept out of weight decay (custom keys, norm_decay_mult), warm-up, milestones or poly power and
minimum lr, length, batch per GPU and the total batch the lr is for, drop path, precision (fp16 /
loss scale) and the test resize - and its inherited parts (pipelines, heads) equal upstream mmdet
/ mmseg configs of the same recipe, so a drift in a config (or the T config it inherits) or in our
`_base_` files fails here. The deviations we keep are listed with their reason in each config's
header and checked to be there; the cells without a setting in their paper are "our choice" in the
header and in the zoo's metafile (configs/<family>/metafile.yml, "No Paper Setting")."""
import copy
import functools
import glob
import os.path as osp

import pytest
import yaml
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
FAMILIES = ('inline_pvt', 'inline_swin', 'mavit')
CONFIGS = sorted(c for fam in FAMILIES for c in glob.glob(osp.join(ROOT, 'configs', fam, '*.py')))
NAMES = [osp.basename(c)[:-3] for c in CONFIGS]


def family_of(name):
    return 'mavit' if 'mavit' in name else ('inline_pvt' if 'pvt' in name else 'inline_swin')


@functools.lru_cache(maxsize=None)
def _read(name):
    return Config.fromfile(osp.join(ROOT, 'configs', family_of(name), name + '.py'))


def load(name):
    """The config (read once per run; each caller gets its own copy)."""
    return copy.deepcopy(_read(name))


def header(name):
    """The config's first three header lines, each joined with its continuations ('#   ')."""
    head = []
    with open(osp.join(ROOT, 'configs', family_of(name), name + '.py')) as f:
        for line in f.read().splitlines()[:12]:
            if line.startswith('#   ') and head:
                head[-1] += ' ' + line[4:]
            else:
                head.append(line)
    return head[:3]


# ------------------------------------------------------------------------------ the sources' values
# Common to every detection source: the mmdet 2.x 1x schedule they inherit (qhfan/MALA
# detect/configs/_base_/schedules/schedule_1x.py, whai362/PVT detection/configs/_base_/schedules/
# schedule_1x.py, SwinTransformer/Swin-Transformer-Object-Detection configs/_base_/schedules/
# schedule_1x.py, mmdet's configs/_base_/schedules/schedule_1x.py): linear warm-up over 500
# iterations from 0.001 x lr, x0.1 steps; 2 images per GPU on 8 GPUs (their coco_*.py datasets);
# test resize keeping the ratio to 1333x800, padded to a multiple of 32. AdamW's betas are torch's
# default (0.9, 0.999) where a source does not set them.
DET_1X = dict(warmup=(500, 0.001), steps=([8, 11], 12), batch=2, total=16,
              test=((1333, 800), False), betas=(0.9, 0.999), no_decay={}, norm_decay_mult=None,
              amp=None)
DET_3X = dict(DET_1X, steps=([27, 33], 36))
# Common to every segmentation source: ADE20K test resize keeping the ratio to 2048x512
# (configs/_base_/datasets/ade20k*.py of MALA, PVT and Swin), 2 images per GPU on 8 GPUs.
SEG = dict(batch=2, total=16, test=((2048, 512), False), betas=(0.9, 0.999), no_decay={},
           norm_decay_mult=None, amp=None)
# the no-decay keys of Swin's and MALA's configs: paramwise_cfg custom_keys with decay_mult 0
SWIN_KEYS = {'absolute_pos_embed': 0., 'relative_position_bias_table': 0., 'norm': 0.}

SOURCE = {}
MAVIT_DROP = {'t': 0.1, 's': 0.15, 'b': 0.4, 'l': 0.55}  # drop_path_rate in every MALA config below
for a in 'tsbl':
    # qhfan/MALA detect/configs/MALA/maskrcnn_{a}_1x.py: AdamW 4e-4 wd 0.05 with SWIN_KEYS; fp16:
    # `fp16 = dict()` over detect/configs/_base_/default_runtime.py's
    # fp16=dict(loss_scale='dynamic')
    SOURCE[f'mask-rcnn_mavit-{a}_fpn_1x_coco'] = dict(
        DET_1X, opt='AdamW', lr=4e-4, wd=0.05, no_decay=SWIN_KEYS, amp='dynamic',
        drop_path=MAVIT_DROP[a])
    # qhfan/MALA detect/configs/MALA/retinanet_{a}_1x.py: AdamW 4e-4 wd 1e-4, no paramwise rules,
    # fp16 = dict(loss_scale=512.0)
    SOURCE[f'retinanet_mavit-{a}_fpn_1x_coco'] = dict(
        DET_1X, opt='AdamW', lr=4e-4, wd=1e-4, amp=512.0, drop_path=MAVIT_DROP[a])
    # qhfan/MALA segmentation/configs/MALA/FPN_{a}_1x.py (+ _base_/schedules/schedule_80k.py): AdamW
    # 1e-4 wd 1e-4, no rules, poly 0.9 to 1e-6 over 80k, no warm-up, fp32
    SOURCE[f'fpn_mavit-{a}_80k_ade20k-512x512'] = dict(
        SEG, opt='AdamW', lr=1e-4, wd=1e-4, warmup=None, poly=(0.9, 1e-6, 80000),
        drop_path=MAVIT_DROP[a])
    # qhfan/MALA segmentation/configs/MALA/Uper_{a}_2x.py: AdamW 6e-5 wd 0.01 with SWIN_KEYS, linear
    # warm-up 1500 from 1e-6, poly 1.0 to 0 over 160k, Fp16OptimizerHook(loss_scale=512.)
    SOURCE[f'upernet_mavit-{a}_160k_ade20k-512x512'] = dict(
        SEG, opt='AdamW', lr=6e-5, wd=0.01, no_decay=SWIN_KEYS, warmup=(1500, 1e-6),
        poly=(1.0, 0.0, 160000), amp=512.0, drop_path=MAVIT_DROP[a])
for a in 'sbl':
    # qhfan/MALA detect/configs/MALA/maskrcnn_{a}_3x.py: as the 1x, steps 27/33 of 36 epochs;
    # L: samples_per_gpu=1 at lr 2e-4
    SOURCE[f'mask-rcnn_mavit-{a}_fpn_ms-3x_coco'] = dict(
        DET_3X, opt='AdamW', lr=4e-4, wd=0.05, no_decay=SWIN_KEYS, amp='dynamic',
        drop_path=MAVIT_DROP[a])
    # qhfan/MALA detect/configs/MALA/casrcnn_{a}_3x.py: also rpe_table and norm_decay_mult=0.
    SOURCE[f'cascade-mask-rcnn_mavit-{a}_fpn_ms-3x_coco'] = dict(
        DET_3X, opt='AdamW', lr=4e-4, wd=0.05, no_decay=dict(SWIN_KEYS, rpe_table=0.),
        norm_decay_mult=0., amp='dynamic', drop_path=MAVIT_DROP[a])
for name in ('mask-rcnn_mavit-l_fpn_ms-3x_coco', 'cascade-mask-rcnn_mavit-l_fpn_ms-3x_coco'):
    SOURCE[name].update(lr=2e-4, batch=1, total=8)
# Uper_l_2x.py sets samples_per_gpu=1 at the same lr 6e-5: kept at 2 per GPU (the paper's batch 16
# for every model; see KEPT below)

# whai362/PVT detection/pvt.py: pvt_{tiny..}
PVT_DET_DROP = {'t': 0.1, 's': 0.1, 'm': 0.0, 'l': 0.0}
for a in 'tsml':
    # whai362/PVT detection/configs/mask_rcnn_pvt_{a}_fpn_1x_coco.py: AdamW 2e-4 wd 1e-4, no rules,
    # fp32; L: samples_per_gpu=1 at 2e-4 / 1.4
    SOURCE[f'mask-rcnn_inline-pvt-{a}_fpn_1x_coco'] = dict(
        DET_1X, opt='AdamW', lr=2e-4, wd=1e-4, drop_path=PVT_DET_DROP[a])
    # whai362/PVT detection/configs/retinanet_pvt_{a}_fpn_1x_coco.py: AdamW 1e-4 wd 1e-4, no rules;
    # L: 2 per GPU with apex mixed precision (DistOptimizerHook use_fp16=True: dynamic loss scale)
    SOURCE[f'retinanet_inline-pvt-{a}_fpn_1x_coco'] = dict(
        DET_1X, opt='AdamW', lr=1e-4, wd=1e-4, drop_path=PVT_DET_DROP[a])
    # whai362/PVT segmentation/configs/sem_fpn/PVT/fpn_pvt_{a}_ade20k_40k.py: AdamW wd 1e-4, no
    # rules, poly 0.9 to min_lr 0.0, no warm-up, fp32; drop path 0.1 (segmentation/pvt.py);
    # AlignResize to multiples of 32 at test. Its 2e-4 at 8 x 4 images for 40k is kept as 1e-4 at 8
    # x 2 for 80k.
    SOURCE[f'fpn_inline-pvt-{a}_80k_ade20k-512x512'] = dict(
        SEG, opt='AdamW', lr=1e-4, wd=1e-4, warmup=None, poly=(0.9, 0.0, 80000), drop_path=0.1,
        test=((2048, 512), True))
SOURCE['mask-rcnn_inline-pvt-l_fpn_1x_coco'].update(lr=2e-4 / 1.4, batch=1, total=8)
SOURCE['retinanet_inline-pvt-l_fpn_1x_coco'].update(amp='dynamic')

SWIN = {'t': 'tiny', 's': 'small', 'b': 'base'}
for a, dp in (('t', 0.1), ('s', 0.2), ('b', 0.3)):
    # SwinTransformer/Swin-Transformer-Object-Detection configs/swin/
    # mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_1x_coco.py: AdamW 1e-4 wd 0.05 with
    # SWIN_KEYS, apex mixed precision (dynamic loss scale), drop path 0.1. No S / B 1x config: drop
    # path of Swin-S's Mask R-CNN 3x (0.2) and Swin-B's Cascade 3x (0.3)
    SOURCE[f'mask-rcnn_inline-swin-{a}_fpn_1x_coco'] = dict(
        DET_1X, opt='AdamW', lr=1e-4, wd=0.05, no_decay=SWIN_KEYS, amp='dynamic', drop_path=dp)
for a, dp in (('t', 0.2), ('s', 0.2), ('b', 0.3)):
    # .../mask_rcnn_swin_{tiny,small}_patch4_window7_mstrain_480-800_adamw_3x_coco.py (no Swin-B:
    # drop path of Swin-B's Cascade) and
    # .../cascade_mask_rcnn_swin_{tiny,small,base}_patch4_window7_
    # mstrain_480-800_giou_4conv1f_adamw_3x_coco.py: as the 1x, steps 27/33 of 36 epochs
    SOURCE[f'mask-rcnn_inline-swin-{a}_fpn_ms-3x_coco'] = dict(
        DET_3X, opt='AdamW', lr=1e-4, wd=0.05, no_decay=SWIN_KEYS, amp='dynamic', drop_path=dp)
    SOURCE[f'cascade-mask-rcnn_inline-swin-{a}_fpn_ms-3x_coco'] = dict(
        DET_3X, opt='AdamW', lr=1e-4, wd=0.05, no_decay=SWIN_KEYS, amp='dynamic', drop_path=dp)
    # SwinTransformer/Swin-Transformer-Semantic-Segmentation configs/swin/
    # upernet_swin_{tiny,small,base}_patch4_window7_512x512_160k_ade20k.py: AdamW 6e-5 wd 0.01 with
    # SWIN_KEYS, warm-up 1500 from 1e-6, poly 1.0 to 0 over 160k, fp32, drop path 0.3
    SOURCE[f'upernet_inline-swin-{a}_160k_ade20k-512x512'] = dict(
        SEG, opt='AdamW', lr=6e-5, wd=0.01, no_decay=SWIN_KEYS, warmup=(1500, 1e-6),
        poly=(1.0, 0.0, 160000), drop_path=0.3)
# open-mmlab/mmdetection configs/swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py: mmdet's SGD, lr 0.01,
# momentum 0.9, wd 1e-4, no rules, fp32, drop path 0.2
SOURCE['retinanet_inline-swin-t_fpn_1x_coco'] = dict(
    DET_1X, opt='SGD', lr=0.01, momentum=0.9, betas=None, wd=1e-4, drop_path=0.2)

# Deviations kept, with a phrase their header's "Deviations" line must contain; every other config
# says "none".
KEPT = {
    **{f'fpn_inline-pvt-{a}_80k_ade20k-512x512': '40k at 2e-4' for a in 'tsml'},
    **{f'mask-rcnn_inline-swin-{a}_fpn_1x_coco': 'single-scale training' for a in 'tsb'},
    'mask-rcnn_inline-swin-b_fpn_ms-3x_coco': 'no Mask R-CNN Swin-B',
    'upernet_mavit-l_160k_ade20k-512x512': 'source sets 1 per GPU',
}
# Cells without a setting in their paper (the InLine paper reports Mask R-CNN 1x for PVT, Cascade 3x
# for Swin-S/B, Semantic FPN for PVT and UperNet for Swin): "our choice" in header and metafile.
OUR_CHOICE = ({f'retinanet_inline-pvt-{a}_fpn_1x_coco' for a in 'tsml'}
              | {'retinanet_inline-swin-t_fpn_1x_coco',
                 'cascade-mask-rcnn_inline-swin-t_fpn_ms-3x_coco'}
              | {f'mask-rcnn_inline-swin-{a}_fpn_{s}_coco' for a in 'tsb' for s in ('1x', 'ms-3x')})


def test_every_config_has_its_source_values():
    assert set(NAMES) == set(SOURCE)


@pytest.mark.parametrize('name', NAMES)
def test_config_names_its_recipe_source(name):
    head = header(name)
    assert head[1].startswith('# Recipe: ') and len(head[1]) > 20, head
    assert head[1].startswith('# Recipe: our choice') == (name in OUR_CHOICE), head[1]
    assert head[2].startswith('# Deviations from it: '), head
    if name in KEPT:
        assert KEPT[name] in head[2], head[2]
    else:
        assert head[2] == '# Deviations from it: none.', head[2]


@pytest.mark.parametrize('name', NAMES)
def test_optimizer(name):
    cfg, want = load(name), SOURCE[name]
    ow = cfg.optim_wrapper
    assert ow.get('type', 'OptimWrapper') == 'OptimWrapper'  # fp32 unless --amp
    assert ow.get('clip_grad') is None  # every source: grad_clip=None
    opt = ow.optimizer
    assert opt.type == want['opt']
    assert opt.lr == pytest.approx(want['lr'], rel=1e-3)
    assert opt.weight_decay == want['wd']
    if want['opt'] == 'SGD':
        assert opt.momentum == want['momentum'] and 'betas' not in opt
    else:
        assert tuple(opt.betas) == want['betas'] and 'momentum' not in opt


@pytest.mark.parametrize('name', NAMES)
def test_no_decay_rules(name):
    cfg, want = load(name), SOURCE[name]
    pw = cfg.optim_wrapper.get('paramwise_cfg') or {}
    assert set(pw) <= {'custom_keys', 'norm_decay_mult'}, pw
    keys = pw.get('custom_keys') or {}
    assert all(set(v) == {'decay_mult'} for v in keys.values()), keys
    assert {k: v['decay_mult'] for k, v in keys.items()} == want['no_decay']
    assert pw.get('norm_decay_mult') == want['norm_decay_mult']


@pytest.mark.parametrize('name', NAMES)
def test_schedule(name):
    cfg, want = load(name), SOURCE[name]
    sched = cfg.param_scheduler
    warm = [s for s in sched if s.type == 'LinearLR']
    if want['warmup'] is None:
        assert not warm
    else:
        assert len(warm) == 1 and not warm[0].by_epoch
        assert (warm[0].end - warm[0].begin, warm[0].start_factor) == want['warmup']
    if 'steps' in want:
        milestones, epochs = want['steps']
        main = [s for s in sched if s.type == 'MultiStepLR']
        assert len(main) == 1 and main[0].milestones == milestones and main[0].gamma == 0.1
        assert cfg.train_cfg.max_epochs == epochs
    else:
        power, eta_min, iters = want['poly']
        main = [s for s in sched if s.type == 'PolyLR']
        assert len(main) == 1 and (main[0].power, main[0].eta_min) == (power, eta_min)
        assert main[0].end == cfg.train_cfg.max_iters == iters
    assert len(sched) == len(warm) + 1


@pytest.mark.parametrize('name', NAMES)
def test_batch_drop_path_and_precision(name):
    cfg, want = load(name), SOURCE[name]
    assert cfg.train_dataloader.batch_size == want['batch']
    assert cfg.auto_scale_lr.base_batch_size == want['total']  # the batch the lr is for
    assert cfg.model.backbone.drop_path_rate == want['drop_path']
    assert 'amp_loss_scale' in cfg and cfg.amp_loss_scale == want['amp']


@pytest.mark.parametrize('name', NAMES)
def test_test_resize(name):
    cfg, want = load(name), SOURCE[name]
    pipe = cfg.test_dataloader.dataset.pipeline
    assert cfg.val_dataloader.dataset.pipeline == pipe
    scale, align = want['test']
    det = cfg.default_scope == 'mmdet'
    types = ['LoadImageFromFile', 'Resize'] + (['ResizeToMultiple'] if align else []) + [
        'LoadAnnotations', 'PackDetInputs' if det else 'PackSegInputs']
    assert [t['type'] for t in pipe] == types
    assert (tuple(pipe[1].scale), pipe[1].keep_ratio) == (scale, True)
    if align:
        assert pipe[2].size_divisor == 32
    if det:  # mmdet 2.x's Pad(size_divisor=32) is the data preprocessor's job in mmdet 3
        assert cfg.model.data_preprocessor.pad_size_divisor == 32
    else:  # no padding at test: the whole (resized) image
        assert cfg.model.data_preprocessor.get('test_cfg') is None
        assert cfg.model.test_cfg.mode == 'whole'


# PVT's AlignResize(keep_ratio=True, size_divisor=32) at 2048x512 (whai362/PVT
# segmentation/align_resize.py): mmcv.imrescale to fit 2048x512 (factor min(2048 / long side, 512 /
# short side), sides rounded), then a resize of each side up to the next multiple of 32. Worked by
# hand: 375x500 -> x1.3653 -> 512x683 -> 512x704; 640x480 -> x1.0667 -> 683x512 -> 704x512;
# 300x1500 -> x1.3653 -> 410x2048 -> 416x2048. The label map stays at the original size.
@pytest.mark.parametrize('hw,want', [((375, 500), (512, 704)), ((640, 480), (704, 512)),
                                     ((300, 1500), (416, 2048))])
def test_pvt_semantic_fpn_test_resize_is_align_resize(tmp_path, hw, want):
    import mmcv
    import numpy as np
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope
    init_default_scope('mmseg')
    cfg = load('fpn_inline-pvt-s_80k_ade20k-512x512')
    img = np.random.default_rng(0).integers(0, 255, (*hw, 3), dtype=np.uint8)
    mmcv.imwrite(img, str(tmp_path / 'a.png'))
    mmcv.imwrite(np.ones(hw, np.uint8), str(tmp_path / 'a_seg.png'))
    out = Compose(cfg.test_dataloader.dataset.pipeline)(dict(
        img_path=str(tmp_path / 'a.png'), seg_map_path=str(tmp_path / 'a_seg.png'),
        reduce_zero_label=True, seg_fields=[]))
    assert tuple(out['inputs'].shape[1:]) == want
    assert tuple(out['data_samples'].gt_sem_seg.data.shape[1:]) == hw
    assert tuple(out['data_samples'].ori_shape) == hw


def _param_groups(name):
    """The optimizer's parameter groups the config's rules give the backbone."""
    from mmengine.optim import build_optim_wrapper

    from mmlinattn.core.registry import model_registry
    cfg = load(name)
    cfg.model.backbone.init_cfg = None
    backbone = model_registry(cfg).build(cfg.model.backbone)
    ow = build_optim_wrapper(backbone, cfg.optim_wrapper)
    return {n: g['weight_decay'] for g in ow.optimizer.param_groups
            for n, p in backbone.named_parameters() if any(p is q for q in g['params'])}


def test_pvt_detection_decays_every_parameter():
    # whai362/PVT detection/configs/mask_rcnn_pvt_t_fpn_1x_coco.py: no paramwise rules, wd 1e-4 on
    # all, position tables and norms included
    wd = _param_groups('mask-rcnn_inline-pvt-t_fpn_1x_coco')
    assert any('pos_embed' in n for n in wd) and any('norm' in n for n in wd)
    assert set(wd.values()) == {1e-4}


def test_swin_rules_spare_norms_and_bias_tables():
    # Swin's Mask R-CNN T 1x: wd 0.05 except names holding 'norm' or 'relative_position_bias_table'
    wd = _param_groups('mask-rcnn_inline-swin-t_fpn_1x_coco')
    spared = {n for n in wd if 'norm' in n or 'relative_position_bias_table' in n}
    assert spared and any('relative_position_bias_table' in n for n in spared)
    assert all(wd[n] == 0. for n in spared)
    assert all(v == 0.05 for n, v in wd.items() if n not in spared)


# ------------------------------------------------------------------------------------- metafiles
@pytest.mark.parametrize('family', FAMILIES)
def test_metafiles_say_which_cells_have_no_paper_setting(family):
    """The zoo's data (from which the family README's table is generated) marks exactly the cells
    without a paper setting as our choice."""
    with open(osp.join(ROOT, 'configs', family, 'metafile.yml')) as f:
        models = {m['Name']: m['Metadata'] for m in yaml.safe_load(f)['Models']
                  if m['Config'].startswith(f'configs/{family}/')}
    assert set(models) == {n for n in NAMES if family_of(n) == family}
    for name, meta in models.items():
        assert ('No Paper Setting' in meta) == (name in OUR_CHOICE), name


# ---------------------------------------------------------------------------------------- upstream
UPSTREAM = {
    'mask-rcnn_mavit-t_fpn_1x_coco': 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    'mask-rcnn_mavit-s_fpn_ms-3x_coco': 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
    'cascade-mask-rcnn_mavit-s_fpn_ms-3x_coco':
        'mmdet::convnext/cascade-mask-rcnn_convnext-t-p4-w7_fpn_4conv1fc-giou_amp-ms-crop-3x_coco.py',
    'retinanet_mavit-t_fpn_1x_coco': 'mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py',
    'retinanet_inline-swin-t_fpn_1x_coco': 'mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py',
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
    # mmseg has SemFPN at 160k only: its schedule differs on purpose (80k, AdamW)
    if name.startswith('fpn_'):
        assert ours.train_cfg.max_iters == 80000
        return
    assert _strip(ours.train_cfg) == _strip(up.train_cfg)
    sched = [_strip(s, ('end', 'convert_to_iter_based', '_scope_')) for s in ours.param_scheduler]
    up_sched = [_strip(s, ('end', 'convert_to_iter_based', '_scope_')) for s in up.param_scheduler]
    assert sched == up_sched
    if 'upernet' in name or 'inline-swin' in name:  # same optimizer as the upstream config
        assert ours.optim_wrapper.optimizer == up.optim_wrapper.optimizer


def test_pvt_patch_embedding_drops_the_remainder_by_default():
    for name in ('mask-rcnn_inline-pvt-t_fpn_1x_coco', 'fpn_inline-pvt-s_80k_ade20k-512x512'):
        assert load(name).model.backbone.get('pad_patches', False) is False
