"""Write the zoo table of each family README from that family's metafile.

    python tools/misc/generate_zoo_tables.py          # rewrite the tables in configs/*/README.md
    python tools/misc/generate_zoo_tables.py --check  # exit 1 if a README's table is out of date

The metafiles (configs/<family>/metafile.yml, mmdet's schema) are the data. Only what lies between
``<!-- zoo-table:start -->`` and ``<!-- zoo-table:end -->`` is rewritten; the prose is by hand.
"""
import argparse
import os.path as osp
import sys

import yaml

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
FAMILIES = ('inline_pvt', 'inline_swin', 'mavit')
START, END = '<!-- zoo-table:start -->', '<!-- zoo-table:end -->'
COLUMNS = ('config', 'backbone', 'paper AP^b / AP^m or mIoU', 'paper params (M)',
           'our params (M)', 'GFLOPs', 'paper GFLOPs', 'ImageNet checkpoint', 'our result',
           'recipe source')


def readme_path(family):
    return osp.join(ROOT, 'configs', family, 'README.md')


def zoo_models(family):
    """The metafile's entries for the configs of the family folder (not configs/classification/)."""
    with open(osp.join(ROOT, 'configs', family, 'metafile.yml')) as f:
        models = yaml.safe_load(f)['Models']
    return [m for m in models if m['Config'].startswith(f'configs/{family}/')]


def _paper_cell(model):
    meta = model['Metadata']
    if 'No Paper Setting' in meta:
        return f'- (no paper setting: {meta["No Paper Setting"]})'
    metrics = {k: v for r in model.get('Results', []) for k, v in r['Metrics'].items()}
    return ' / '.join(str(metrics[k]) for k in ('box AP (paper)', 'mask AP (paper)', 'mIoU (paper)')
                      if k in metrics) or '-'


def row(model):
    meta, name = model['Metadata'], model['Name']
    paper_flops = meta.get('Paper FLOPs (G)')
    cells = [
        f'[{name}]({osp.basename(model["Config"])})',
        name.split('_')[1],  # the backbone part of the config name: mavit-t, inline-pvt-s, ...
        _paper_cell(model),
        str(meta.get('Paper Parameters (M)') or '-'),
        f'{meta["Parameters"] / 1e6:.2f}',
        f'{meta["FLOPs"] / 1e9:.1f}',
        '-' if paper_flops is None
        else f'{meta["Paper-Convention FLOPs (G)"]:.1f} / {paper_flops}',
        f'`{meta["ImageNet Checkpoint"]}`',
        '-',  # no config has been trained here (the metafiles have no Weights)
        f'`{meta["Recipe Source"]}`',
    ]
    return '| ' + ' | '.join(cells) + ' |'


def table(family):
    """The zoo table of ``family`` as markdown lines, header included."""
    lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
    return '\n'.join(lines + [row(m) for m in zoo_models(family)])


def render(text, table_text):
    """``text`` (a README) with what lies between the markers replaced."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f'expected one {START} line followed by one {END} line')
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f'{head}{START}\n{table_text}\n{END}{tail}'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--check', action='store_true',
                        help='write nothing; exit 1 if a README table differs from the metafile')
    args = parser.parse_args(argv)
    stale = []
    for family in FAMILIES:
        path = readme_path(family)
        with open(path) as f:
            text = f.read()
        new = render(text, table(family))
        if new == text:
            continue
        stale.append(osp.relpath(path, ROOT))
        if not args.check:
            with open(path, 'w') as f:
                f.write(new)
    for path in stale:
        print(f'{path}: table {"out of date" if args.check else "rewritten"}')
    return 1 if args.check and stale else 0


if __name__ == '__main__':
    sys.exit(main())
