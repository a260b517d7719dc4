"""Write one config per cell of the model matrix (docs/design.md section 4) from the tables below.

    python tools/misc/generate_configs.py          # (re)write configs/<family>/*.py
    python tools/misc/generate_configs.py --check  # exit 1 if a committed config differs

Each config is a few lines over ``configs/_base_`` (backbone, channels, the source's optimizer,
batch, precision); its header names the source config and any deliberate deviation from it.
"""
import argparse
import os
import os.path as osp
import sys
import textwrap
from dataclasses import dataclass

from mmlinattn.core.families import FAMILIES as FAMILY_ROWS

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@dataclass(frozen=True)
class Recipe:
    """A family's cell of one recipe: its archs (letters), lr and weight decay at the source's total
    batch, and the source config (``{a}``: arch letter, ``{arch}``: arch name)."""
    archs: str
    lr: float
    weight_decay: float
    source: str


_MALA = 'qhfan/MALA '
_PVT = 'whai362/PVT '
_SWIN_DET = 'SwinTransformer/Swin-Transformer-Object-Detection configs/swin/'
_SWIN_SEG = 'SwinTransformer/Swin-Transformer-Semantic-Segmentation configs/swin/'
#: family -> recipe -> Recipe. MALA released its downstream configs; InLine trains "with the same
#: setting as the baseline": PVT's and Swin's (mmdet's Swin RetinaNet). Per-cell exceptions follow.
FAMILY_RECIPES = {
    'inline_pvt': {
        'mask-rcnn_1x': Recipe('tsml', 2e-4, 1e-4,
                               _PVT + 'detection/configs/mask_rcnn_pvt_{a}_fpn_1x_coco.py'),
        'retinanet_1x': Recipe('tsml', 1e-4, 1e-4,
                               _PVT + 'detection/configs/retinanet_pvt_{a}_fpn_1x_coco.py'),
        'fpn_80k': Recipe('tsml', 1e-4, 1e-4, _PVT + 'segmentation/configs/sem_fpn/PVT/'
                                                     'fpn_pvt_{a}_ade20k_40k.py')},
    'inline_swin': {
        'mask-rcnn_1x': Recipe('tsb', 1e-4, 0.05, _SWIN_DET + 'mask_rcnn_swin_tiny_patch4_'
                               'window7_mstrain_480-800_adamw_1x_coco.py'),
        'mask-rcnn_3x': Recipe('tsb', 1e-4, 0.05, _SWIN_DET + 'mask_rcnn_swin_{arch}_patch4_'
                               'window7_mstrain_480-800_adamw_3x_coco.py'),
        'cascade_3x': Recipe('tsb', 1e-4, 0.05, _SWIN_DET + 'cascade_mask_rcnn_swin_{arch}_'
                             'patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py'),
        'retinanet_1x': Recipe('t', 0.01, 1e-4, 'open-mmlab/mmdetection '
                               'configs/swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py'),
        'upernet_160k': Recipe('tsb', 6e-5, 0.01, _SWIN_SEG + 'upernet_swin_{arch}_patch4_'
                               'window7_512x512_160k_ade20k.py')},
    'mavit': {
        'mask-rcnn_1x': Recipe('tsbl', 4e-4, 0.05,
                               _MALA + 'detect/configs/MALA/maskrcnn_{a}_1x.py'),
        'mask-rcnn_3x': Recipe('sbl', 4e-4, 0.05, _MALA + 'detect/configs/MALA/maskrcnn_{a}_3x.py'),
        'cascade_3x': Recipe('sbl', 4e-4, 0.05, _MALA + 'detect/configs/MALA/casrcnn_{a}_3x.py'),
        'retinanet_1x': Recipe('tsbl', 4e-4, 1e-4,
                               _MALA + 'detect/configs/MALA/retinanet_{a}_1x.py'),
        'fpn_80k': Recipe('tsbl', 1e-4, 1e-4, _MALA + 'segmentation/configs/MALA/FPN_{a}_1x.py'),
        'upernet_160k': Recipe('tsbl', 6e-5, 0.01,
                               _MALA + 'segmentation/configs/MALA/Uper_{a}_2x.py')},
}
#: Further backbone keys (name -> Python source). MAViT's detectors trained the stem/downsampling BN
#: with SyncBN (see mmlinattn/core/models/backbones/mavit.py).
FAMILY_EXTRA = {'mavit': {'conv_norm_cfg': "dict(type='SyncBN', requires_grad=True)"}}


def families():
    """Per family: its row of mmlinattn.core.families and its tables here. Read on every call, so
    that a family registered (and given recipes) after this import is written too."""
    return {name: dict(type=fam.backbone.__name__, prefix=fam.prefix, archs=fam.archs,
                       channels={a: fam.channels(a) for a in fam.archs},
                       drop_path={a: fam.drop_path(a) for a in fam.archs},
                       ckpt={a: 'checkpoints/' + fam.checkpoints[arch][1]
                             for a, arch in fam.archs.items() if arch in fam.checkpoints},
                       extra=dict(FAMILY_EXTRA.get(name, {})),
                       recipes=FAMILY_RECIPES.get(name, {}))
            for name, fam in FAMILY_ROWS.items()}


# recipe -> (config name, bases: model, dataset, schedule); the runtime base follows the dataset.
_RECIPES = {
    'mask-rcnn_1x': ('mask-rcnn_{bb}_fpn_1x_coco', 'mask-rcnn_fpn', 'coco_instance', 'schedule_1x'),
    'mask-rcnn_3x': ('mask-rcnn_{bb}_fpn_ms-3x_coco', 'mask-rcnn_fpn', 'coco_instance_ms-3x',
                     'schedule_3x'),
    'cascade_3x': ('cascade-mask-rcnn_{bb}_fpn_ms-3x_coco', 'cascade-mask-rcnn_fpn_4conv1fc-giou',
                   'coco_instance_ms-3x', 'schedule_3x'),
    'retinanet_1x': ('retinanet_{bb}_fpn_1x_coco', 'retinanet_fpn', 'coco_detection',
                     'schedule_1x'),
    'fpn_80k': ('fpn_{bb}_80k_ade20k-512x512', 'fpn_ade20k', 'ade20k_512x512', 'schedule_80k'),
    'upernet_160k': ('upernet_{bb}_160k_ade20k-512x512', 'upernet_ade20k', 'ade20k_512x512',
                     'schedule_160k'),
}
RECIPES = {recipe: dict(name=name, bases=[
    f'models/{model}.py', f'datasets/{data}.py', f'schedules/{sched}.py',
    f'default_runtime_{"seg" if data.startswith("ade20k") else "det"}.py'])
    for recipe, (name, model, data, sched) in _RECIPES.items()}
# Bases a cell takes instead of its recipe's: (recipe, family) -> {recipe base: replacement}.
BASE_SWAPS = {
    # PVT tests at the keep-ratio scale rounded up to multiples of 32 (its AlignResize)
    ('fpn_80k', 'inline_pvt'): {'datasets/ade20k_512x512.py': 'datasets/ade20k_512x512_align32.py'},
}

# A cell's source where it is not its FAMILY_RECIPES one: (recipe, family, arch) -> source.
SOURCE_EXCEPTIONS = {('mask-rcnn_3x', 'inline_swin', 'b'): _SWIN_DET + 'mask_rcnn_swin_small_'
                     'patch4_window7_mstrain_480-800_adamw_3x_coco.py'}
# Cells with no setting in their paper (the InLine paper reports Mask R-CNN 1x for PVT, Cascade 3x
# for Swin-S/B, Semantic FPN for PVT and UperNet for Swin): the recipe is ours, after the source.
NO_PAPER_SETTING = {('retinanet_1x', 'inline_pvt'), ('retinanet_1x', 'inline_swin'),
                    ('mask-rcnn_1x', 'inline_swin'), ('mask-rcnn_3x', 'inline_swin'),
                    ('cascade_3x', 'inline_swin', 't')}

# Downstream drop-path rates of the InLine families (their baselines' downstream values, not the
# ImageNet ones); MAViT uses the authors' (its arch table). (recipe, family) -> {arch: rate}.
DROP_PATH = {
    ('mask-rcnn_1x', 'inline_pvt'): {'t': 0.1, 's': 0.1, 'm': 0.0, 'l': 0.0},
    ('retinanet_1x', 'inline_pvt'): {'t': 0.1, 's': 0.1, 'm': 0.0, 'l': 0.0},
    ('fpn_80k', 'inline_pvt'): {'t': 0.1, 's': 0.1, 'm': 0.1, 'l': 0.1},
    # T: Swin's Mask R-CNN T 1x; S / B (no Swin 1x config): Swin-S Mask R-CNN 3x, Swin-B Cascade 3x
    ('mask-rcnn_1x', 'inline_swin'): {'t': 0.1, 's': 0.2, 'b': 0.3},
    ('mask-rcnn_3x', 'inline_swin'): {'t': 0.2, 's': 0.2, 'b': 0.3},
    ('cascade_3x', 'inline_swin'): {'t': 0.2, 's': 0.2, 'b': 0.3},
    ('retinanet_1x', 'inline_swin'): {'t': 0.2},
    ('upernet_160k', 'inline_swin'): {'t': 0.3, 's': 0.3, 'b': 0.3},
}
# Cells the sources train with 1 image per GPU (8 GPUs = 8 images): (recipe, family, arch) -> lr at
# that batch. auto_scale_lr's base batch becomes 8 for them.
ONE_PER_GPU = {
    ('mask-rcnn_3x', 'mavit', 'l'): 2e-4, ('cascade_3x', 'mavit', 'l'): 2e-4,
    ('mask-rcnn_1x', 'inline_pvt', 'l'): 2e-4 / 1.4,
}

# SGD instead of AdamW: (recipe, family) -> momentum.
SGD_MOMENTUM = {('retinanet_1x', 'inline_swin'): 0.9}
# Name substrings the source keeps out of weight decay (paramwise_cfg.custom_keys, decay_mult 0),
# in its order; other cells decay every parameter, as their sources.
_SWIN_KEYS = ('absolute_pos_embed', 'relative_position_bias_table', 'norm')
NO_DECAY_KEYS = {(r, f): _SWIN_KEYS for f in ('inline_swin', 'mavit')
                 for r in ('mask-rcnn_1x', 'mask-rcnn_3x', 'cascade_3x', 'upernet_160k')}
NO_DECAY_KEYS['cascade_3x', 'mavit'] = _SWIN_KEYS[:2] + ('rpe_table', 'norm')
# paramwise_cfg.norm_decay_mult (no decay on any normalisation layer, BN of the heads included)
NORM_DECAY_MULT = {('cascade_3x', 'mavit'): 0.}
# Minimum lr of the poly decay where it differs from the schedule base (schedule_80k: 1e-6).
POLY_MIN_LR = {('fpn_80k', 'inline_pvt'): 0.0}

# How the source trained, as `amp_loss_scale` (used with --amp): None = fp32; 'dynamic' = mixed
# precision, dynamic loss scale (MALA's fp16, apex O1); a float = fp16 with that static loss scale.
AMP_LOSS_SCALE = {(r, f): 'dynamic' for f in ('inline_swin', 'mavit')
                  for r in ('mask-rcnn_1x', 'mask-rcnn_3x', 'cascade_3x')}
AMP_LOSS_SCALE.update({('retinanet_1x', 'mavit'): 512.0, ('upernet_160k', 'mavit'): 512.0,
                       ('retinanet_1x', 'inline_pvt', 'l'): 'dynamic'})
_PRECISION_NOTE = {
    None: ['# precision: the source trained in fp32, as this config does '
           '(--amp: mixed precision on a GPU)'],
    'dynamic': ['# precision: the source trained in mixed precision with a dynamic loss scale, '
                'as --amp does', '# on a GPU; fp32 without --amp'],
    512.0: ['# precision: the source trained in fp16 with a static loss scale of 512; on a GPU:',
            '#   --amp --cfg-options optim_wrapper.loss_scale=512.  '
            '(--amp alone scales dynamically;', '#   fp32 without --amp)'],
}

# Deliberate deviations from the source (the header): (recipe, family[, arch]) -> text.
_SINGLE_SCALE = ("single-scale training as the papers' 1x tables (Swin's 1x config trains "
                 "multi-scale 480-800 with crops)")
DEVIATIONS = {
    ('mask-rcnn_1x', 'inline_swin'): _SINGLE_SCALE,
    ('mask-rcnn_1x', 'inline_swin', 's'):
        _SINGLE_SCALE + "; Swin released no Swin-S 1x: drop path 0.2 as Swin-S's Mask R-CNN 3x",
    ('mask-rcnn_1x', 'inline_swin', 'b'):
        _SINGLE_SCALE + "; Swin released no Swin-B 1x: drop path 0.3 as Swin-B's Cascade 3x",
    ('mask-rcnn_3x', 'inline_swin', 'b'):
        "Swin released no Mask R-CNN Swin-B: drop path 0.3 as Swin-B's Cascade 3x",
    ('fpn_80k', 'inline_pvt'):
        "16 images (8 GPUs x 2) for 80k iterations at lr 1e-4 where the source trains 32 (8 x 4) "
        "for 40k at 2e-4: the same images seen, the lr scaled linearly, as MAViT's 80k Semantic "
        "FPN",
    ('upernet_160k', 'mavit', 'l'):
        "2 images per GPU on 8 GPUs where the source sets 1 per GPU at the same lr 6e-5: the paper "
        "trains every model at batch 16, and the config keeps the other sizes' lr (MALA's "
        "1-per-GPU detection configs halve theirs), so the source's batch reads as 16 GPUs x 1; "
        "8 x 2 is the same batch 16 at lr 6e-5 (set train_dataloader.batch_size=1 on 16 GPUs for "
        "the literal split)",
}


def matrix():
    """recipe -> {family: the archs it is written for}."""
    fams = families()
    return {recipe: {name: fam['recipes'][recipe].archs for name, fam in fams.items()
                     if recipe in fam['recipes']} for recipe in RECIPES}


def lookup(table, recipe, family, a, default=None):
    """The entry of (recipe, family, arch), else of (recipe, family), else default."""
    return table.get((recipe, family, a), table.get((recipe, family), default))


def backbone_lines(family, a, out_indices=(0, 1, 2, 3), recipe=None):
    fam = families()[family]
    drop_path = DROP_PATH.get((recipe, family), fam['drop_path'])[a]
    return ['    backbone=dict(', '        _delete_=True,', f"        type='{fam['type']}',",
            f"        arch='{fam['archs'][a]}',", f'        drop_path_rate={drop_path},',
            f'        out_indices={tuple(out_indices)},'] + [
        f'        {k}={v},' for k, v in fam['extra'].items()] + [
        f"        init_cfg=dict(type='Pretrained', checkpoint='{fam['ckpt'][a]}')),"]


def source_of(recipe, family, a):
    fam = families()[family]
    src = SOURCE_EXCEPTIONS.get((recipe, family, a), fam['recipes'][recipe].source).format(
        a=a, arch=fam['archs'][a])
    if {(recipe, family), (recipe, family, a)} & NO_PAPER_SETTING:
        return f'our choice (no setting in the paper), following {src}'
    return src


def optimizer_lines(recipe, family, a):
    cell = families()[family]['recipes'][recipe]
    lr, wd = cell.lr, cell.weight_decay
    if (recipe, family, a) in ONE_PER_GPU:
        lr = float(f'{ONE_PER_GPU[recipe, family, a]:.4g}')
    momentum = SGD_MOMENTUM.get((recipe, family))
    opt = (f'optimizer=dict(lr={lr!r}, weight_decay={wd!r})' if momentum is None else
           f"optimizer=dict(_delete_=True, type='SGD', lr={lr!r}, momentum={momentum!r}, "
           f'weight_decay={wd!r})')
    keys = NO_DECAY_KEYS.get((recipe, family))
    norm_mult = NORM_DECAY_MULT.get((recipe, family))
    if not keys and norm_mult is None:
        line = f'optim_wrapper = dict({opt})'
        return ['# every parameter decays, as in the source (no paramwise rules)'] + (
            [line] if len(line) <= 100 else ['optim_wrapper = dict(', f'    {opt})'])
    norm = norm_mult is not None
    out = ['# no weight decay on parameters whose names contain these keys, as the source lists '
           'them'] * bool(keys) + [f'# and weight decay x {norm_mult!r} on every normalisation '
                                   "layer (the heads' BN too)"] * norm
    out += ['optim_wrapper = dict(', f'    {opt},', '    paramwise_cfg=dict(']
    out += [f'        norm_decay_mult={norm_mult!r},'] * norm
    if keys:
        out += ['        custom_keys={'] + [f"            '{k}': dict(decay_mult=0.),"
                                             for k in keys] + ['        },']
    out[-1] = out[-1].rstrip(',') + '))'
    return out


def render(recipe, family, a):
    rec, fam = RECIPES[recipe], families()[family]
    bb = f"{fam['prefix']}-{a}"
    ch = fam['channels'][a]
    deviation = lookup(DEVIATIONS, recipe, family, a) or 'none'
    swaps = BASE_SWAPS.get((recipe, family), {})
    # the three header lines, wrapped at 100 characters with '#   ' continuations
    out = [line for text in (
        f'{rec["name"].format(bb=bb)}: {fam["type"]}-{a.upper()} ({fam["archs"][a]}); generated '
        'by tools/misc/generate_configs.py - edit the table there.',
        f'Recipe: {source_of(recipe, family, a)}.', f'Deviations from it: {deviation}.')
        for line in textwrap.wrap(text, 100, initial_indent='# ', subsequent_indent='#   ',
                                  break_long_words=False, break_on_hyphens=False)]
    out += ['_base_ = ['] + [f"    '../_base_/{swaps.get(b, b)}'," for b in rec['bases']]
    out += [']', '', 'model = dict(']
    # RetinaNet's FPN starts at stage 2: only the stages it uses (as mmdet's Swin RetinaNet), so no
    # output norm is left without a gradient under DDP
    retina = recipe.startswith('retinanet')
    out += backbone_lines(family, a, (1, 2, 3) if retina else (0, 1, 2, 3), recipe)
    if retina:
        out += [f'    neck=dict(in_channels={ch[1:]}, start_level=0))']
    elif recipe.startswith('upernet'):
        out += [f'    decode_head=dict(in_channels={ch}),',
                f'    auxiliary_head=dict(in_channels={ch[2]}))']
    else:
        out += [f'    neck=dict(in_channels={ch}))']
    out += [''] + optimizer_lines(recipe, family, a)
    min_lr = POLY_MIN_LR.get((recipe, family))
    if min_lr is not None:
        out += [f'# poly decay to {min_lr!r}, as the source (the schedule base decays to 1e-6)',
                'param_scheduler = [',
                f'    dict(type=\'PolyLR\', eta_min={min_lr!r}, power=0.9, begin=0, end=80000, '
                'by_epoch=False),',
                ']']
    if (recipe, family, a) in ONE_PER_GPU:
        out += ['# the source trains 1 image per GPU on 8 GPUs; lr is for that total batch of 8',
                'train_dataloader = dict(batch_size=1)',
                'auto_scale_lr = dict(base_batch_size=8)']
    scale = lookup(AMP_LOSS_SCALE, recipe, family, a)
    out += _PRECISION_NOTE[scale] + [f'amp_loss_scale = {scale!r}', '']
    return rec['name'].format(bb=bb), '\n'.join(out)


def all_configs():
    for recipe, fams in matrix().items():
        for family, archs in fams.items():
            for a in archs:
                name, text = render(recipe, family, a)
                yield osp.join('configs', family, name + '.py'), text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--check', action='store_true', help='only compare with the files on disk')
    args = p.parse_args(argv)
    stale, configs = [], list(all_configs())
    for rel, text in configs:
        path = osp.join(ROOT, rel)
        if (open(path).read() if osp.exists(path) else None) != text:
            stale.append(rel)
            if not args.check:
                os.makedirs(osp.dirname(path), exist_ok=True)
                with open(path, 'w') as f:
                    f.write(text)
    if args.check and stale:
        print('out of date:\n  ' + '\n  '.join(stale))
        return 1
    print(f'{len(configs)} configs, {len(stale)} {"differ" if args.check else "written"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
