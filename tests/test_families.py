"""The family table (mmlinattn.core.families): every row agrees with its class and with the files
and names the authors and the configs use, and the tools' per-family tables (FLOP conventions,
paper GFLOPs) cover the same families; and a fourth family is its class plus one row - a made-up
family, defined in a fresh interpreter, reaches every table derived from the rows (channels, the
checkpoint table, the benchmark matrix, the converter's and the classifier helpers' family names),
and configs written for it as the zoo's T configs are build."""
import json
import os.path as osp
import subprocess
import sys
import textwrap

import pytest

from mmlinattn.core.families import AUTHORS_CHECKPOINTS, FAMILIES, Family, register_family
from mmlinattn.core.registry import MODELS

from helpers import AUTHORS_CHANNELS

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
KEYS_DIR = osp.join(ROOT, 'tests', 'data', 'authors_keys')

# the download keys as checkpoints/README.md and the tool's users have typed them since 0.1
# (the authors' names for their files: InLine_PVT_T in LeapLabTHU/InLine, MAViT_T in qhfan/MALA)
KNOWN_KEYS = ['InLine_PVT_T', 'InLine_PVT_S', 'InLine_PVT_M', 'InLine_PVT_L', 'InLine_Swin_T',
              'InLine_Swin_S', 'InLine_Swin_B', 'MAViT_T', 'MAViT_S', 'MAViT_B', 'MAViT_L']


def test_the_rows_are_the_three_families_in_order():
    assert list(FAMILIES) == ['inline_pvt', 'inline_swin', 'mavit']
    assert [f.backbone.__name__ for f in FAMILIES.values()] == ['InLinePVT', 'InLineSwin', 'MAViT']
    assert [f.prefix for f in FAMILIES.values()] == ['inline-pvt', 'inline-swin', 'mavit']


@pytest.mark.parametrize('name', list(FAMILIES))
def test_every_row_agrees_with_its_class_and_the_repository(name):
    """The class is the registered one; the channels typed from the authors' files equal the
    class's arch table for every arch; every released file has its authors' key layout in
    tests/data and a config folder with a metafile; the tools' tables know the family: its
    paper's FLOP convention exists, and the paper's backbone GFLOPs are there for every arch."""
    from mmlinattn.analysis.flops import CONVENTIONS, FAMILY_CONVENTION, PAPER_BACKBONE_GFLOPS
    fam = FAMILIES[name]
    assert MODELS.get(fam.backbone.__name__) is fam.backbone
    assert set(AUTHORS_CHANNELS[name]) == set(fam.backbone.arch_zoo)
    for arch, channels in AUTHORS_CHANNELS[name].items():
        assert fam.backbone.stage_channels(arch) == list(channels), arch
    assert set(fam.checkpoints) == set(fam.backbone.arch_zoo)
    for arch in fam.checkpoints:
        assert osp.isfile(osp.join(KEYS_DIR, f'{name}_{arch}.json')), arch
    assert {a for c, a in PAPER_BACKBONE_GFLOPS if c == fam.backbone.__name__} == \
        set(fam.backbone.arch_zoo)
    assert osp.isfile(osp.join(ROOT, 'configs', name, 'metafile.yml'))
    assert FAMILY_CONVENTION[name] in CONVENTIONS


def test_the_checkpoint_table_is_the_rows():
    """Download keys and local names: the keys users type (KNOWN_KEYS), each local name the
    checkpoint of that arch that the family's configs load."""
    assert list(AUTHORS_CHECKPOINTS) == KNOWN_KEYS
    for key, entry in AUTHORS_CHECKPOINTS.items():
        fam = FAMILIES[entry.family]
        assert (entry.url, entry.filename) == fam.checkpoints[entry.arch]
        assert key.endswith('_' + entry.arch[0].upper())


# The authors' links, typed from their READMEs (LeapLabTHU/InLine: TsinghuaCloud share pages in
# their ?dl=1 download form; qhfan/MALA: the Hugging Face repository aldjalkdf/MAViT's resolve/main
# file URLs), so that a typo in the family table fails here.
_T = 'https://cloud.tsinghua.edu.cn/f/{}/?dl=1'
_H = 'https://huggingface.co/aldjalkdf/MAViT/resolve/main/MAViT_{}.pth'
KNOWN_URLS = {
    'InLine_PVT_T': _T.format('90ac52b1555b401eb5e6'),
    'InLine_PVT_S': _T.format('1ab953b2479d433080a3'),
    'InLine_PVT_M': _T.format('a72aec31e6084bc0a280'),
    'InLine_PVT_L': _T.format('efd91318ba964f01b288'),
    'InLine_Swin_T': _T.format('32810869fcc34410966b'),
    'InLine_Swin_S': _T.format('e9657fd247c04c7cb1a1'),
    'InLine_Swin_B': _T.format('bf23564bb64c420aafe1'),
    **{f'MAViT_{a}': _H.format(a) for a in 'TSBL'}}


def test_the_authors_urls_are_the_ones_they_publish():
    assert {k: e.url for k, e in AUTHORS_CHECKPOINTS.items()} == KNOWN_URLS


def test_a_row_that_collides_is_refused():
    fam = FAMILIES['mavit']
    with pytest.raises(ValueError, match="collides with the row 'mavit'"):
        register_family(Family(name='mavit2', backbone=fam.backbone, title='X', checkpoints={}))
    assert list(FAMILIES) == ['inline_pvt', 'inline_swin', 'mavit']


FOURTH_FAMILY = textwrap.dedent('''
    import json, os, os.path as osp, sys
    from mmlinattn.core.registry import MODELS
    from mmlinattn.core.models import MAViT
    from mmlinattn.core.families import AUTHORS_CHECKPOINTS, Family, out_channels, register_family

    # ---- the class ...
    @MODELS.register_module()
    class ToyNet(MAViT):
        arch_zoo = {'nano': dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                                 num_heads=[1, 1, 2, 2], drop_path_rate=0.0,
                                 layer_scale=[1.0] * 4)}

    # ---- ... and one row
    register_family(Family(
        name='toy_net', backbone=ToyNet, title='ToyNet',
        checkpoints={'nano': ('http://127.0.0.1:9/toynet_n.pth', 'toynet_n.pth')}))

    # ---- everything below is derived: nothing else is written for the new family
    import torch
    from mmlinattn.core.models import authors_to_classifier
    from mmlinattn.analysis import benchmarking, flops
    from tools.misc import download_checkpoints
    from tools.model_converters import convert_authors_checkpoint
    out = dict(
        out_channels=out_channels(dict(type='ToyNet', arch='nano', out_indices=(1, 3))),
        keys=[k for k, e in AUTHORS_CHECKPOINTS.items() if e.family == 'toy_net'],
        selected=download_checkpoints.select(['toynet-n']),
        flops_backbone='ToyNet' in flops.BACKBONES,
        config_dirs=list(benchmarking.CONFIG_DIRS),
        in_name=benchmarking.recipe_name('mask-rcnn_toy-net-n_fpn_1x_coco'),
        classifier_keys=sorted(authors_to_classifier({'head.weight': torch.zeros(2, 3)},
                                                     'toy_net')),
    )
    try:  # the FLOP table does not know its paper: refused, not counted under another's rules
        flops.paper_convention('configs/toy_net/mask-rcnn_toy-net-n_fpn_1x_coco.py')
    except KeyError as e:
        out['convention_error'] = str(e)
    try:
        convert_authors_checkpoint.main(['toy_net', 'nano', '/nonexistent.pth', '/tmp/x.pth'])
    except SystemExit as e:  # argparse's refusal of an unknown family exits 2
        out['converter_exit'] = e.code
    except Exception as e:  # the family is accepted; the file is what is missing
        out['converter_error'] = type(e).__name__
    # ---- its configs, written as the zoo's T configs are: a recipe's config with this backbone
    # and the neck at the class's channels, typed (the recipes: InLine-PVT's T configs)
    work = sys.argv[1]
    os.makedirs(osp.join(work, 'configs', 'toy_net'))
    configs = []
    for recipe in ('mask-rcnn_inline-pvt-t_fpn_1x_coco', 'fpn_inline-pvt-t_80k_ade20k-512x512'):
        base = osp.join(os.getcwd(), 'configs', 'inline_pvt', recipe + '.py')
        name = recipe.replace('inline-pvt-t', 'toy-net-n') + '.py'
        configs.append((osp.join('configs', 'toy_net', name),
                        f"_base_ = {base!r}\\n"
                        "model = dict(backbone=dict(_delete_=True, type='ToyNet', arch='nano'),\\n"
                        "             neck=dict(in_channels=[16, 32, 48, 64]))\\n"))
    out['configs'] = sorted(osp.basename(rel) for rel, _ in configs)
    import torch
    from mmengine.config import Config
    from mmlinattn.core.registry import model_registry
    from mmlinattn.training.preflight import check_model_channels
    built = {}
    for rel, text in configs:
        path = osp.join(work, rel)
        with open(path, 'w') as f:
            f.write(text)
        cfg = Config.fromfile(path)
        check_model_channels(cfg)
        model = model_registry(cfg).build(cfg.model)
        feats = model.backbone(torch.zeros(1, 3, 64, 64))
        built[osp.basename(rel)] = [type(model.backbone).__name__, [f.shape[1] for f in feats]]
    out['built'] = built
    print('RESULT ' + json.dumps(out))
''')


def test_a_fourth_family_is_its_class_and_one_row(tmp_path):
    """A made-up family (a registered class with its own arch table, and one row) in a fresh
    interpreter: every derived table and tool knows it, and its configs (the T configs' recipes
    with its backbone) pass the pre-flight's channel check and build. The expected values are
    the ones typed into the made-up class and row here."""
    proc = subprocess.run([sys.executable, '-c', FOURTH_FAMILY, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('RESULT ')]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len('RESULT '):])
    assert out['out_channels'] == [32, 64]
    assert out['keys'] == ['ToyNet_N'] and out['selected'] == ['ToyNet_N']
    assert out['flops_backbone'] and 'toy_net' in out['convention_error']
    assert out['config_dirs'] == ['inline_pvt', 'inline_swin', 'mavit', 'toy_net']
    assert out['in_name'] == 'mask-rcnn_{}_fpn_1x_coco'
    assert out['classifier_keys'] == ['head.fc.weight']
    assert 'converter_exit' not in out, 'the converter refused the family'
    assert out['configs'] == ['fpn_toy-net-n_80k_ade20k-512x512.py',
                              'mask-rcnn_toy-net-n_fpn_1x_coco.py']
    assert out['built'] == {name: ['ToyNet', [16, 32, 48, 64]] for name in out['configs']}
