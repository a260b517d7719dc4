"""The model index (model-index.yml, configs/*/metafile.yml; mmdet's metafile schema) is the zoo's
data: every shipped config has exactly one entry, every entry's config exists, what an entry says
(data, schedule, batch, optimizer, checkpoint, recipe source, GPUs, parameters) is what the config
holds (the matrix's parameters: tests/test_configs.py::test_config_builds), and the paper's
facts are consistent with the papers' numbers the tests type. The family READMEs' zoo tables are
generated from it (tools/misc/generate_zoo_tables.py); one test checks they are up to date. mim's
own reader (`mim search`) lists every entry."""
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


def config_header(config):
    """The config's header lines ('# Key: ...'), each joined with its continuations ('#   ')."""
    head = []
    with open(osp.join(ROOT, config)) as f:
        for line in f:
            if not line.startswith('#'):
                break
            if line.startswith('#   ') and head:
                head[-1] += ' ' + line[4:].strip()
            else:
                head.append(line[2:].strip())
    return head


@pytest.mark.parametrize('family', FAMILIES)
def test_entries_match_config(family):
    """What each zoo entry says about its config is what the config holds: data and FLOPs input
    size, schedule, batch, optimizer, the ImageNet checkpoint its backbone starts from, the recipe
    source its header names, and the recipe's GPUs x images per GPU."""
    models = [m for m in load_yaml(f'configs/{family}/metafile.yml')['Models']
              if m['Config'].startswith(f'configs/{family}/')]
    assert models
    for m in models:
        name, meta = m['Name'], m['Metadata']
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
        ckpt = re.search(r"init_cfg=dict\(type='Pretrained', checkpoint='([^']+)'\)", text)
        assert meta['ImageNet Checkpoint'] == ckpt.group(1), name
        # the recipe: the header's source, and "our choice" exactly where the metafile says the
        # paper has no such setting
        recipe = next(h for h in config_header(m['Config']) if h.startswith('Recipe: '))
        source = meta['Recipe Source']
        if 'No Paper Setting' in meta:
            assert meta['No Paper Setting'].startswith('our choice, following '), name
            assert recipe == f'Recipe: our choice (no setting in the paper), following {source}.'
        else:
            assert recipe == f'Recipe: {source}.', (name, recipe)
        # the recipe's GPUs, and that nobody trained it here
        resources = meta['Training Resources']
        assert resources.startswith('recipe: ') and resources.endswith('not trained by mmlinattn')
        gpus, per_gpu = (int(v) for v in re.search(r'(\d+)x GPUs x (\d+) images?',
                                                    resources).groups())
        per_gpu_cfg = re.search(r'train_dataloader = dict\(batch_size=(\d+)\)', text)
        assert per_gpu == (int(per_gpu_cfg.group(1)) if per_gpu_cfg else 2), name
        assert gpus * per_gpu == meta['Batch Size'], name


@pytest.mark.parametrize('family', FAMILIES)
def test_paper_facts_are_consistent(family):
    """The paper's facts in each entry: its numbers are where the paper reports the model (and only
    there: a cell without them is our choice of recipe), of the tasks the model does; its
    whole-model parameter counts are the ones tests/test_configs.py types from the papers and
    holds our models to (3 %). The FLOPs are checked in tests/test_flops.py."""
    from test_configs import PAPER_PARAMS
    models = [m for m in load_yaml(f'configs/{family}/metafile.yml')['Models']
              if m['Config'].startswith(f'configs/{family}/')]
    for m in models:
        name, meta = m['Name'], m['Metadata']
        metrics = {k: v for r in m.get('Results', []) for k, v in r['Metrics'].items()}
        assert bool(metrics) != ('No Paper Setting' in meta), name
        if metrics:
            if name.endswith('_coco'):
                tasks = {'Object Detection'} | (
                    set() if name.startswith('retinanet') else {'Instance Segmentation'})
                want = {'box AP (paper)'} | (
                    set() if name.startswith('retinanet') else {'mask AP (paper)'})
            else:
                tasks, want = {'Semantic Segmentation'}, {'mIoU (paper)'}
            assert {r['Task'] for r in m['Results']} == tasks, name
            assert {r['Dataset'] for r in m['Results']} == {meta['Training Data']}, name
            assert set(metrics) == want, name
            assert all(isinstance(v, float) and 0 < v < 100 for v in metrics.values()), name
        paper_params = meta.get('Paper Parameters (M)')
        # a Mask R-CNN 3x config builds the model of its 1x config, whose count the paper gives
        typed = PAPER_PARAMS.get(name, PAPER_PARAMS.get(name.replace('_fpn_ms-3x_', '_fpn_1x_')))
        assert paper_params == typed, name
        if paper_params is not None:
            assert abs(meta['Parameters'] / 1e6 - paper_params) / paper_params < 0.03, name


@pytest.mark.parametrize('model', [m for _, m in entries()
                                   if m['Config'].startswith('configs/classification/')],
                         ids=lambda m: m['Name'])
def test_classifier_parameters_are_the_built_models(model):
    """Parameters of the entries outside the detection / segmentation matrix (the ImageNet
    classifiers; the matrix: tests/test_configs.py::test_config_builds): the built model's count."""
    from mmlinattn.analysis import flops
    built, _ = flops.build_model(osp.join(ROOT, model['Config']))
    assert sum(p.numel() for p in built.parameters()) == model['Metadata']['Parameters']


@pytest.mark.parametrize('family', FAMILIES)
def test_readme_zoo_table_is_generated_from_the_metafile(family):
    """The zoo table of configs/<family>/README.md is what tools/misc/generate_zoo_tables.py
    writes from the metafile; the prose around it is free text no test reads."""
    from tools.misc import generate_zoo_tables as gen
    with open(gen.readme_path(family)) as f:
        text = f.read()
    assert gen.render(text, gen.table(family)) == text, \
        'run `python tools/misc/generate_zoo_tables.py` after editing a metafile'


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


# --------------------------------------------------------------------------- adoptability
#: sha256 of the Apache License 2.0 as apache.org publishes it (LICENSE-2.0.txt, 11358 bytes)
APACHE_2_SHA256 = 'cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30'


def test_license_file_is_the_licence_setup_py_declares():
    """LICENSE is a copyright line followed by the unchanged Apache License 2.0 text, the licence
    setup.py gives pip (read from setup.py's text, not imported)."""
    import hashlib
    setup_py = open(osp.join(ROOT, 'setup.py')).read()
    assert re.findall(r"\blicense\s*=\s*'([^']+)'", setup_py) == ['Apache-2.0']
    with open(osp.join(ROOT, 'LICENSE'), 'rb') as f:
        first, body = f.read().split(b'\n', 1)
    assert first == b'Copyright 2026 the mmlinattn authors'
    assert hashlib.sha256(body).hexdigest() == APACHE_2_SHA256


def test_citation_cff_cites_the_software_and_both_papers():
    cff = load_yaml('CITATION.cff')
    assert cff['cff-version'] == '1.2.0' and cff['type'] == 'software'
    assert cff['license'] == 'Apache-2.0' and cff['authors']
    version = re.search(r"__version__ = '([^']+)'",
                        open(osp.join(ROOT, 'mmlinattn/version.py')).read()).group(1)
    assert str(cff['version']) == version
    papers = {r['title']: r for r in cff['references']}
    inline = papers['Bridging the Divide: Reconsidering Softmax and Linear Attention']
    mala = papers['Rectifying Magnitude Neglect in Linear Attention']
    assert (inline['year'], mala['year']) == (2024, 2025)
    assert [a['family-names'] for a in inline['authors']] == [
        'Han', 'Pu', 'Xia', 'Han', 'Pan', 'Li', 'Lu', 'Song', 'Huang']
    assert [a['family-names'] for a in mala['authors']] == ['Fan', 'Huang', 'Ai', 'He']
    readme = open(osp.join(ROOT, 'README.md')).read()
    assert readme.count('@inproceedings{') == 2 and '## Citation' in readme
    for title in papers:
        assert f'title     = {{{title}}}' in readme


def test_every_changelog_version_has_an_iso_date():
    """Every release heading of docs/changelog.md reads ``## X.Y.Z - YYYY-MM-DD`` (a real date);
    an ``## Unreleased`` heading may stand above them."""
    import datetime
    heads = re.findall(r'^## (.+)$', open(osp.join(ROOT, 'docs/changelog.md')).read(), re.M)
    releases = [h for h in heads if h != 'Unreleased']
    assert releases and heads.index(releases[0]) <= 1
    for head in releases:
        found = re.fullmatch(r'(\d+\.\d+\.\d+) - (\d{4}-\d{2}-\d{2})', head)
        assert found, f'changelog heading "## {head}" needs a date: "## X.Y.Z - YYYY-MM-DD"'
        datetime.date.fromisoformat(found.group(2))
    dates = [h.split(' - ')[1] for h in releases]
    assert dates == sorted(dates, reverse=True), dates
