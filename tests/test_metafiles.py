"""The model index (model-index.yml, configs/*/metafile.yml; mmdet's metafile schema) against the
configs and the family READMEs: every shipped config has exactly one entry, every entry's config
exists, and what an entry says (parameters, FLOPs, the paper's numbers, data, schedule) is what the
README table and the config say. mim's own reader (`mim search`) lists every entry."""
import glob
import os.path as osp
import re

import pytest
import yaml

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
FAMILIES = ('inline_pvt', 'inline_swin', 'mavit')
COLLECTIONS = {'inline_pvt': 'InLine-PVT', 'inline_swin': 'InLine-Swin', 'mavit': 'MAViT'}
# not models of the zoo: configs/toy/ (the demo's and the tests' configs on generated data) and
# configs/custom/ (templates for your own dataset, docs/custom_dataset.md)
NOT_IN_ZOO = ('configs/toy/', 'configs/custom/')


def shipped_configs():
    paths = sorted(glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True))
    rel = [osp.relpath(p, ROOT) for p in paths]
    return [p for p in rel if '/_base_' not in p and osp.basename(p) != '_base_.py'
            and not p.startswith(NOT_IN_ZOO)]


def load_yaml(rel):
    with open(osp.join(ROOT, rel)) as f:
        return yaml.safe_load(f)


def index_files():
    return load_yaml('model-index.yml')['Import']


def entries():
    """(metafile, model entry) for every entry of every metafile model-index.yml imports."""
    return [(mf, m) for mf in index_files() for m in load_yaml(mf)['Models']]


def readme_rows(family):
    """config name -> the cells of its row in the family README's zoo table (by column title)."""
    with open(osp.join(ROOT, 'configs', family, 'README.md')) as f:
        lines = [line.rstrip('\n') for line in f]
    header = next(line for line in lines if line.startswith('| config | backbone |'))
    titles = [c.strip() for c in header.strip('|').split('|')]
    rows = {}
    for line in lines:
        if line.startswith('| ['):
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            assert len(cells) == len(titles), line
            rows[re.match(r'\[([^\]]+)\]', cells[0]).group(1)] = dict(zip(titles, cells))
    return rows


def test_model_index_imports_each_family_metafile():
    assert index_files() == [f'configs/{fam}/metafile.yml' for fam in FAMILIES]
    for mf in index_files():
        assert osp.isfile(osp.join(ROOT, mf)), mf


def test_every_config_has_exactly_one_entry_and_every_entry_a_config():
    configs = [m['Config'] for _, m in entries()]
    dup = sorted({c for c in configs if configs.count(c) > 1})
    assert not dup, f'configs with more than one metafile entry: {dup}'
    missing = sorted(set(shipped_configs()) - set(configs))
    assert not missing, f'configs without a metafile entry: {missing}'
    absent = sorted(c for c in configs if not osp.isfile(osp.join(ROOT, c)))
    assert not absent, f'metafile entries whose config does not exist: {absent}'
    stray = sorted(set(configs) - set(shipped_configs()))
    assert not stray, f'metafile entries for configs outside the zoo: {stray}'


def test_entries_are_well_formed():
    names = [m['Name'] for _, m in entries()]
    assert len(set(names)) == len(names)
    for mf, m in entries():
        family = osp.basename(osp.dirname(mf))
        assert m['Name'] == osp.splitext(osp.basename(m['Config']))[0]
        # an entry sits in its family's metafile: the family folder, or a classifier of that family
        assert m['In Collection'] == COLLECTIONS[family]
        assert m['Config'].startswith((f'configs/{family}/', 'configs/classification/')), \
            m['Config']
        assert 'Weights' not in m, f'{m["Name"]}: no trained file exists, so no Weights'
        meta = m['Metadata']
        assert isinstance(meta['Parameters'], int) and isinstance(meta['FLOPs'], int)
        for result in m.get('Results', []):
            assert result['Metrics'] and all(k.endswith(' (paper)') for k in result['Metrics']), \
                f'{m["Name"]}: every number in Results is the paper\'s and must say so'
    for mf in index_files():
        for coll in load_yaml(mf)['Collections']:
            assert osp.isfile(osp.join(ROOT, coll['README']))
            assert coll['Paper']['URL'].startswith('https://arxiv.org/abs/')


@pytest.mark.parametrize('family', FAMILIES)
def test_entries_match_readme_and_config(family):
    rows = readme_rows(family)
    models = {m['Name']: m for m in load_yaml(f'configs/{family}/metafile.yml')['Models']
              if m['Config'].startswith(f'configs/{family}/')}
    assert set(models) == set(rows)
    for name, row in rows.items():
        m, meta = models[name], models[name]['Metadata']
        assert f'{meta["Parameters"] / 1e6:.2f}' == row['our params (M)'], name
        assert f'{meta["FLOPs"] / 1e9:.1f}' == row['GFLOPs'], name
        coco = name.endswith('_coco')
        assert meta['Training Data'] == ('COCO' if coco else 'ADE20K')
        assert meta['FLOPs Input'] == ('1280x800' if coco else '2048x512')
        # the schedule in the config's name
        sched = {'1x': ('Epochs', 12), 'ms-3x': ('Epochs', 36), '80k': ('Iterations', 80000),
                 '160k': ('Iterations', 160000)}
        key, value = next(v for k, v in sched.items() if f'_{k}_' in name)
        assert meta[key] == value, name
        with open(osp.join(ROOT, m['Config'])) as f:
            text = f.read()
        batch = re.search(r'base_batch_size=(\d+)', text)
        assert meta['Batch Size'] == (int(batch.group(1)) if batch else 16), name
        optimizer = 'SGD' if "type='SGD'" in text else 'AdamW'
        assert meta['Training Techniques'][0] == optimizer, name
        # the paper's numbers, exactly as the README's paper column (which cites the paper)
        paper = row['paper AP^b / AP^m or mIoU']
        metrics = {k: v for r in m.get('Results', []) for k, v in r['Metrics'].items()}
        if paper.startswith('-'):
            assert not metrics, f'{name}: the paper reports no such model'
        elif coco:
            want = dict(zip(('box AP (paper)', 'mask AP (paper)'),
                            (float(v) for v in paper.split('/'))))
            assert metrics == want, name
        else:
            assert metrics == {'mIoU (paper)': float(paper)}, name


def test_modelindex_and_mim_read_the_index():
    """modelindex (mim's parser) loads the index with no error but the one mmdet's own index has
    (README paths are relative to the repository root, not to the metafile); mim's table - what
    `mim search` prints - lists every config with its parameters, FLOPs and the paper's metrics."""
    from mim.commands.search import convert2df, filter_by_training_datasets
    from modelindex.load_model_index import load
    index = load(osp.join(ROOT, 'model-index.yml'))
    errors = [e for e in index.check(silent=True) if 'Path to README file' not in e]
    assert not errors
    df = convert2df(index)
    assert sorted(df.index) == sorted(osp.splitext(osp.basename(c))[0] for c in shipped_configs())
    assert df.loc['mask-rcnn_mavit-t_fpn_1x_coco', 'coco/box_ap_(paper)'] == 47.6
    assert df.loc['upernet_inline-swin-t_160k_ade20k-512x512', 'ade20k/miou_(paper)'] == 45.57
    assert df['parameters'].notna().all() and df['flops'].notna().all()
    ade = filter_by_training_datasets(df, ['ade20k'])
    assert set(ade.index) == {n for n in df.index if n.endswith('ade20k-512x512')}
