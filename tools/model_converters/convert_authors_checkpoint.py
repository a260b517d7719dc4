"""Convert an authors' ImageNet checkpoint (InLine / MALA release) to a clean mmengine checkpoint.

    python tools/model_converters/convert_authors_checkpoint.py FAMILY ARCH SRC DST [--use-ema]

SRC is read safely (weights-only) and fitted to our backbone as ``init_cfg=dict(type='Pretrained')``
would (a file of the wrong size fails with the first mismatched keys); DST, written atomically,
holds ``{'state_dict': ..., 'meta': {...}}`` under our key names (output norms excluded).
"""
import argparse
import os.path as osp
import sys

import torch

from mmlinattn.core.families import FAMILIES
from mmlinattn.core.weights import CheckpointError, extract_state_dict, read_checkpoint
from mmlinattn.training.fileio import write_atomic


def convert_classifier(family, src, dst, use_ema=False, allow_unsafe=False):
    """The whole classifier (backbone + neck + head) for configs/classification/."""
    state = extract_state_dict(read_checkpoint(src, allow_unsafe=allow_unsafe), use_ema, src)
    out = FAMILIES[family].backbone.authors_layout.to_classifier(state)
    meta = dict(source=osp.basename(src), family=family)
    write_atomic(dst, lambda tmp: torch.save({'state_dict': out, 'meta': meta}, tmp))
    return out


def convert(family, arch, src, dst, use_ema=False, allow_unsafe=False):
    """The backbone alone, through the family's checkpoint filter (as ``init_cfg`` Pretrained)."""
    model = FAMILIES[family].backbone(arch=arch)
    report = model.load_pretrained(src, use_ema=use_ema, allow_unsafe=allow_unsafe)
    new = set(report['new'])
    state = {k: v for k, v in model.state_dict().items() if k not in new}
    meta = dict(source=osp.basename(src), family=family, arch=arch, use_ema=use_ema,
                dropped=report['dropped'], converter='mmlinattn')
    write_atomic(dst, lambda tmp: torch.save({'state_dict': state, 'meta': meta}, tmp))
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('family', choices=sorted(FAMILIES))
    for name in ('arch', 'src', 'dst'):
        p.add_argument(name)
    p.add_argument('--use-ema', action='store_true', help='MALA files: take model_ema')
    p.add_argument('--classifier', action='store_true',
                   help='keep the classification parts, renamed for configs/classification/')
    p.add_argument('--allow-unsafe', action='store_true',
                   help='permit a full unpickle if safe reading fails (trusted files only)')
    args = p.parse_args(argv)
    if args.classifier:
        out = convert_classifier(args.family, args.src, args.dst, args.use_ema, args.allow_unsafe)
        print(f'{args.dst}: {len(out)} tensors (mmpretrain ImageClassifier layout)')
        return 0
    try:
        report = convert(args.family, args.arch, args.src, args.dst, args.use_ema,
                         args.allow_unsafe)
    except (CheckpointError, ValueError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    print(f'{args.dst}: {len(report["loaded"])} tensors; dropped {len(report["dropped"])} '
          f'classification keys')
    return 0


if __name__ == '__main__':
    sys.exit(main())
