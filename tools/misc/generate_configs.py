"""Write one config per cell of the model matrix (DESIGN.md section 4) from a single table.

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

# ------------------------------------------------------------------------------- recipes (DESIGN 4)
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
        opt={'inline_pvt': (2e-4, 1e-4), 'mavit': (1e-4, 1e-4)}),
    'upernet_160k': dict(
        bases=['models/upernet_ade20k.py', 'datasets/ade20k_512x512.py',
               'schedules/schedule_160k.py', 'default_runtime_seg.py'],
        name='upernet_{bb}_160k_ade20k-512x512', kind='seg',
        opt={'inline_swin': (6e-5, 0.01), 'mavit': (6e-5, 0.01)}),
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


def backbone_lines(family, a):
    fam = FAMILIES[family]
    ckpt = fam['ckpt'].format(a=a, A=a.upper())
    lines = [
        '    backbone=dict(',
        '        _delete_=True,',
        f"        type='{fam['type']}',",
        f"        arch='{fam['archs'][a]}',",
        f"        drop_path_rate={fam['drop_path'][a]},",
        '        out_indices=(0, 1, 2, 3),',
    ]
    lines += [f'        {k}={v},' for k, v in fam['extra'].items()]
    lines += [f"        init_cfg=dict(type='Pretrained', checkpoint='{ckpt}')),"]
    return lines


def render(recipe, family, a):
    rec, fam = RECIPES[recipe], FAMILIES[family]
    bb = f"{fam['prefix']}-{a}"
    ch = fam['channels'][a]
    lr, wd = rec['opt'][family]
    out = [f'# {rec["name"].format(bb=bb)}: {fam["type"]}-{a.upper()} ({fam["archs"][a]}); '
           'generated by tools/misc/generate_configs.py - edit the table there.',
           '_base_ = [']
    out += [f"    '../_base_/{b}'," for b in rec['bases']]
    out += [']', '', 'model = dict(']
    out += backbone_lines(family, a)
    if recipe.startswith('upernet'):
        out += [f'    decode_head=dict(in_channels={ch}),',
                f'    auxiliary_head=dict(in_channels={ch[2]}))']
    else:
        out += [f'    neck=dict(in_channels={ch}))']
    out += ['', f'optim_wrapper = dict(optimizer=dict(lr={lr!r}, weight_decay={wd!r}))', '']
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
