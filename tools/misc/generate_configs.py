"""Write one config per cell of the model matrix (docs/design.md section 4) from a single table.

    python tools/misc/generate_configs.py           # (re)write configs/{inline_pvt,inline_swin,mavit}/
    python tools/misc/generate_configs.py --check   # exit 1 if a committed config differs

Every config is a few lines over ``configs/_base_``: the backbone (arch, drop path, the authors'
ImageNet checkpoint under ``checkpoints/``), the neck/head input channels, and the family's learning
rate and weight decay. The tests check that the committed files equal what this script writes.
"""
import argparse
import os.path as osp
import sys

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

# ---------------------------------------------------------------------------------------- backbones
FAMILIES = {
    'inline_pvt': dict(
        type='InLinePVT', prefix='inline-pvt',
        archs={'t': 'tiny', 's': 'small', 'm': 'medium', 'l': 'large'},
        channels={a: [64, 128, 320, 512] for a in 'tsml'},
        drop_path={'t': 0.1, 's': 0.1, 'm': 0.3, 'l': 0.3},
        ckpt='checkpoints/inline_pvt_{a}.pth', extra={}),
    'inline_swin': dict(
        type='InLineSwin', prefix='inline-swin',
        archs={'t': 'tiny', 's': 'small', 'b': 'base'},
        channels={'t': [96, 192, 384, 768], 's': [96, 192, 384, 768], 'b': [128, 256, 512, 1024]},
        drop_path={'t': 0.2, 's': 0.3, 'b': 0.5},
        ckpt='checkpoints/inline_swin_{a}.pth', extra={}),
    'mavit': dict(
        type='MAViT', prefix='mavit',
        archs={'t': 'tiny', 's': 'small', 'b': 'base', 'l': 'large'},
        channels={'t': [64, 128, 256, 512], 's': [64, 128, 320, 512], 'b': [96, 192, 384, 512],
                  'l': [96, 192, 448, 640]},
        drop_path={'t': 0.1, 's': 0.15, 'b': 0.4, 'l': 0.55},
        ckpt='checkpoints/MAViT_{A}.pth',
        # the released detectors trained the stem/downsampling BN with SyncBN (their norm_eval never
        # took effect, see mmlinattn/models/backbones/mavit.py)
        extra=dict(norm_cfg="dict(type='SyncBN', requires_grad=True)")),
}

# ------------------------------------------------------------------------------- recipes (docs/design.md section 4)
# lr / weight decay per (algorithm, family); None = the schedule base's value.
RECIPES = {
    'mask-rcnn_1x': dict(
        bases=['models/mask-rcnn_fpn.py', 'datasets/coco_instance.py', 'schedules/schedule_1x.py',
               'default_runtime_det.py'],
        name='mask-rcnn_{bb}_fpn_1x_coco', kind='det',
        opt={'inline_pvt': (2e-4, 1e-4), 'inline_swin': (1e-4, 0.05), 'mavit': (4e-4, 0.05)}),
    'mask-rcnn_3x': dict(
        bases=['models/mask-rcnn_fpn.py', 'datasets/coco_instance_ms-3x.py',
               'schedules/schedule_3x.py', 'default_runtime_det.py'],
        name='mask-rcnn_{bb}_fpn_ms-3x_coco', kind='det',
        opt={'inline_swin': (1e-4, 0.05), 'mavit': (4e-4, 0.05)}),
    'cascade_3x': dict(
        bases=['models/cascade-mask-rcnn_fpn_4conv1fc-giou.py', 'datasets/coco_instance_ms-3x.py',
               'schedules/schedule_3x.py', 'default_runtime_det.py'],
        name='cascade-mask-rcnn_{bb}_fpn_ms-3x_coco', kind='det',
        opt={'inline_swin': (1e-4, 0.05), 'mavit': (4e-4, 0.05)}),
    'retinanet_1x': dict(
        bases=['models/retinanet_fpn.py', 'datasets/coco_detection.py', 'schedules/schedule_1x.py',
               'default_runtime_det.py'],
        name='retinanet_{bb}_fpn_1x_coco', kind='det',
        opt={'inline_pvt': (1e-4, 1e-4), 'inline_swin': (1e-4, 1e-4), 'mavit': (4e-4, 1e-4)}),
    'fpn_80k': dict(
        bases=['models/fpn_ade20k.py', 'datasets/ade20k_512x512.py', 'schedules/schedule_80k.py',
               'default_runtime_seg.py'],
        name='fpn_{bb}_80k_ade20k-512x512', kind='seg',
        opt={'inline_pvt': (1e-4, 1e-4), 'mavit': (1e-4, 1e-4)}),
    'upernet_160k': dict(
        bases=['models/upernet_ade20k.py', 'datasets/ade20k_512x512.py',
               'schedules/schedule_160k.py', 'default_runtime_seg.py'],
        name='upernet_{bb}_160k_ade20k-512x512', kind='seg',
        opt={'inline_swin': (6e-5, 0.01), 'mavit': (6e-5, 0.01)}),
}

# ------------------------------------------------------------------------------- provenance
# Where each cell's recipe comes from. MALA released its downstream configs; InLine did not, and its
# paper trains "with the same setting as the baseline": PVT's and Swin's official downstream configs.
_MALA = 'qhfan/MALA '
_PVT = 'whai362/PVT '
_SWIN_DET = 'Swin-Transformer-Object-Detection configs/swin/'
SOURCES = {
    ('mask-rcnn_1x', 'mavit'): _MALA + 'detect/configs/MALA/maskrcnn_{a}_1x.py',
    ('mask-rcnn_3x', 'mavit'): _MALA + 'detect/configs/MALA/maskrcnn_{a}_3x.py',
    ('cascade_3x', 'mavit'): _MALA + 'detect/configs/MALA/casrcnn_{a}_3x.py',
    ('retinanet_1x', 'mavit'): _MALA + 'detect/configs/MALA/retinanet_{a}_1x.py',
    ('fpn_80k', 'mavit'): _MALA + 'segmentation/configs/MALA/FPN_{a}_1x.py',
    ('upernet_160k', 'mavit'): _MALA + 'segmentation/configs/MALA/Uper_{a}_2x.py',
    ('mask-rcnn_1x', 'inline_pvt'): _PVT + 'detection/configs/mask_rcnn_pvt_{a}_fpn_1x_coco.py',
    ('retinanet_1x', 'inline_pvt'): _PVT + 'detection/configs/retinanet_pvt_{a}_fpn_1x_coco.py',
    ('fpn_80k', 'inline_pvt'): _PVT + 'segmentation/configs/sem_fpn/PVT/fpn_pvt_{a}_ade20k_40k.py '
                                      '(2e-4 at 32 images for 40k = 1e-4 at 16 for 80k)',
    ('mask-rcnn_1x', 'inline_swin'): _SWIN_DET + 'mask_rcnn_swin_*_adamw_1x/3x (lr 1e-4, wd 0.05)',
    ('mask-rcnn_3x', 'inline_swin'): _SWIN_DET + 'mask_rcnn_swin_*_mstrain_480-800_adamw_3x_coco.py',
    ('cascade_3x', 'inline_swin'): _SWIN_DET + 'cascade_mask_rcnn_swin_*_giou_4conv1f_adamw_3x_coco.py',
    ('retinanet_1x', 'inline_swin'): "mmdet configs/swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py",
    ('upernet_160k', 'inline_swin'): 'Swin-Transformer-Semantic-Segmentation configs/swin/'
                                     'upernet_swin_*_patch4_window7_512x512_160k_ade20k.py',
}
# Downstream drop-path rates of the InLine families (their baselines' downstream values, not the
# ImageNet ones); MAViT uses the authors' (the FAMILIES table). (recipe, family) -> {arch: rate}.
DROP_PATH = {
    ('mask-rcnn_1x', 'inline_pvt'): {'t': 0.1, 's': 0.1, 'm': 0.0, 'l': 0.0},
    ('retinanet_1x', 'inline_pvt'): {'t': 0.1, 's': 0.1, 'm': 0.0, 'l': 0.0},
    ('fpn_80k', 'inline_pvt'): {'t': 0.1, 's': 0.1, 'm': 0.1, 'l': 0.1},
    ('mask-rcnn_1x', 'inline_swin'): {'t': 0.2, 's': 0.2, 'b': 0.3},
    ('mask-rcnn_3x', 'inline_swin'): {'t': 0.2, 's': 0.2, 'b': 0.3},
    ('cascade_3x', 'inline_swin'): {'t': 0.2, 's': 0.2, 'b': 0.3},
    ('retinanet_1x', 'inline_swin'): {'t': 0.2},
    ('upernet_160k', 'inline_swin'): {'t': 0.3, 's': 0.3, 'b': 0.3},
}
# Cells the sources train with 1 image per GPU (8 GPUs = 8 images): (recipe, family, arch) -> lr at
# that batch. auto_scale_lr's base batch becomes 8 for them.
ONE_PER_GPU = {
    ('mask-rcnn_3x', 'mavit', 'l'): 2e-4, ('cascade_3x', 'mavit', 'l'): 2e-4,
    ('mask-rcnn_1x', 'inline_pvt', 'l'): 2e-4 / 1.4, ('retinanet_1x', 'inline_pvt', 'l'): 1e-4 / 1.4,
}
# Deliberate deviations from the source, printed in the config header.
DEVIATIONS = {
    ('mask-rcnn_1x', 'inline_swin'): "single-scale 1x as the papers' 1x tables (Swin's own 1x config "
                                     "trains multi-scale); S/B use Swin's 3x drop-path values",
    ('mask-rcnn_3x', 'inline_swin'): "B's drop path 0.3 as Swin-B's cascade (Swin released no Mask "
                                     "R-CNN Swin-B)",
}

# The matrix: which archs of which family for each recipe.
MATRIX = {
    'mask-rcnn_1x': {'inline_pvt': 'tsml', 'inline_swin': 'tsb', 'mavit': 'tsbl'},
    'mask-rcnn_3x': {'inline_swin': 'tsb', 'mavit': 'sbl'},
    'cascade_3x': {'inline_swin': 'tsb', 'mavit': 'sbl'},
    'retinanet_1x': {'inline_pvt': 'tsml', 'inline_swin': 't', 'mavit': 'tsbl'},
    'fpn_80k': {'inline_pvt': 'tsml', 'mavit': 'tsbl'},
    'upernet_160k': {'inline_swin': 'tsb', 'mavit': 'tsbl'},
}


def drop_path(recipe, family, a):
    return DROP_PATH.get((recipe, family), FAMILIES[family]['drop_path'])[a]


def backbone_lines(family, a, out_indices=(0, 1, 2, 3), recipe=None):
    fam = FAMILIES[family]
    ckpt = fam['ckpt'].format(a=a, A=a.upper())
    lines = [
        '    backbone=dict(',
        '        _delete_=True,',
        f"        type='{fam['type']}',",
        f"        arch='{fam['archs'][a]}',",
        f"        drop_path_rate={drop_path(recipe, family, a)},",
        f'        out_indices={tuple(out_indices)},',
    ]
    lines += [f'        {k}={v},' for k, v in fam['extra'].items()]
    lines += [f"        init_cfg=dict(type='Pretrained', checkpoint='{ckpt}')),"]
    return lines


def render(recipe, family, a):
    rec, fam = RECIPES[recipe], FAMILIES[family]
    bb = f"{fam['prefix']}-{a}"
    ch = fam['channels'][a]
    lr, wd = rec['opt'][family]
    one_per_gpu = ONE_PER_GPU.get((recipe, family, a))
    source = SOURCES[(recipe, family)].format(a=a)
    deviation = DEVIATIONS.get((recipe, family)) or 'none'
    out = [f'# {rec["name"].format(bb=bb)}: {fam["type"]}-{a.upper()} ({fam["archs"][a]}); '
           'generated by tools/misc/generate_configs.py - edit the table there.',
           f'# Recipe: {source}.',
           f'# Deviations from it: {deviation}.',
           '_base_ = [']
    out += [f"    '../_base_/{b}'," for b in rec['bases']]
    out += [']', '', 'model = dict(']
    if recipe.startswith('retinanet'):
        # FPN starts at stage 2: request only the stages it uses (as mmdet's Swin RetinaNet), so no
        # output norm is left without a gradient under DDP
        out += backbone_lines(family, a, out_indices=(1, 2, 3), recipe=recipe)
        out += [f'    neck=dict(in_channels={ch[1:]}, start_level=0))']
    else:
        out += backbone_lines(family, a, recipe=recipe)
    if recipe.startswith('upernet'):
        out += [f'    decode_head=dict(in_channels={ch}),',
                f'    auxiliary_head=dict(in_channels={ch[2]}))']
    elif not recipe.startswith('retinanet'):
        out += [f'    neck=dict(in_channels={ch}))']
    if one_per_gpu:
        lr = float(f'{one_per_gpu:.4g}')
    opt = f'optimizer=dict(lr={lr!r}, weight_decay={wd!r})'
    if recipe == 'cascade_3x' and family == 'mavit':  # MALA's cascade: no decay on any norm
        opt += ',\n                     paramwise_cfg=dict(norm_decay_mult=0.)'
    out += ['', f'optim_wrapper = dict({opt})']
    if one_per_gpu:
        out += ['# the source trains 1 image per GPU on 8 GPUs; lr is for that total batch of 8',
                'train_dataloader = dict(batch_size=1)',
                'auto_scale_lr = dict(base_batch_size=8)']
    out += ['']
    return rec['name'].format(bb=bb), '\n'.join(out)


def all_configs():
    for recipe, fams in MATRIX.items():
        for family, archs in fams.items():
            for a in archs:
                name, text = render(recipe, family, a)
                yield osp.join('configs', family, name + '.py'), text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--check', action='store_true', help='only compare with the files on disk')
    args = p.parse_args(argv)
    stale = []
    for rel, text in all_configs():
        path = osp.join(ROOT, rel)
        old = open(path).read() if osp.exists(path) else None
        if old != text:
            stale.append(rel)
            if not args.check:
                import os
                os.makedirs(osp.dirname(path), exist_ok=True)
                with open(path, 'w') as f:
                    f.write(text)
    if args.check and stale:
        print('out of date:\n  ' + '\n  '.join(stale))
        return 1
    print(f'{len(list(all_configs()))} configs, {len(stale)} '
          f'{"differ" if args.check else "written"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
