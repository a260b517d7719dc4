"""tests/authors_code.py (the authors' model files imported from a clone of their repository, beside
ours) without the authors' code (the suite never has it): the file importer's errors, our
classifier of each family against the authors' manifests (tests/data/authors_keys, made from their
model files), and mmlinattn.analysis.profiling's split of a classifier by part and by operator
kind."""
import json
import os.path as osp
import types

import pytest
import torch
from torch import nn

from mmlinattn.analysis.profiling import classifier_part, op_kind, profile_parts

import authors_code

HERE = osp.dirname(osp.abspath(__file__))
KEYS = osp.join(HERE, 'data', 'authors_keys')


def _manifest(family, arch):
    with open(osp.join(KEYS, f'{family}_{arch}.json')) as f:
        return json.load(f)


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(authors_code.AuthorsCodeError, match='models/inline_swin.py: no such file'):
        authors_code.build_authors('inline_swin', 'tiny', str(tmp_path))


def test_a_missing_requirement_says_what_to_install(tmp_path):
    (tmp_path / 'models').mkdir()
    (tmp_path / 'models' / 'inline_pvt.py').write_text('import timm_not_installed_here\n')
    with pytest.raises(authors_code.AuthorsCodeError) as err:
        authors_code.build_authors('inline_pvt', 'tiny', str(tmp_path))
    assert 'timm_not_installed_here' in str(err.value)
    assert 'pip install timm einops fvcore' in str(err.value)


def test_a_file_without_the_constructor_or_failing_leaves_nothing_behind(tmp_path):
    import sys
    (tmp_path / 'models').mkdir()
    (tmp_path / 'models' / 'inline_swin.py').write_text('X = 1\n')
    with pytest.raises(authors_code.AuthorsCodeError, match=r'has no InLineSwin\(\)'):
        authors_code.build_authors('inline_swin', 'tiny', str(tmp_path))
    (tmp_path / 'models' / 'inline_pvt.py').write_text('raise ValueError("half-run")\n')
    with pytest.raises(ValueError, match='half-run'):
        authors_code.build_authors('inline_pvt', 'tiny', str(tmp_path))
    assert 'authors_inline_pvt' not in sys.modules


def test_unknown_family_or_arch(tmp_path):
    with pytest.raises(KeyError, match='inline_swin'):
        authors_code.build_authors('swin', 'tiny', str(tmp_path))
    with pytest.raises(KeyError, match="'tiny'"):
        authors_code.build_authors('inline_swin', 'huge', str(tmp_path))


def test_the_authors_constructor_is_called_and_drop_path_set(tmp_path):
    """A stand-in model file with the authors' constructor name: called with the arguments of
    SOURCES, every module's ``drop_prob`` set to the rate asked for."""
    (tmp_path / 'classfication_release').mkdir()
    (tmp_path / 'classfication_release' / 'model.py').write_text(
        'import torch.nn as nn\n'
        'class DP(nn.Module):\n'
        '    def __init__(self): super().__init__(); self.drop_prob = 0.3\n'
        'def MALA_S(**kw):\n'
        '    m = nn.Sequential(DP(), DP()); m.kw = kw; return m\n')
    model = authors_code.build_authors('mavit', 'small', str(tmp_path), drop_path=0.0)
    assert model.kw == {} and [m.drop_prob for m in model] == [0.0, 0.0]
    (tmp_path / 'classfication_release' / 'model.py').write_text(
        'import torch.nn as nn\n'
        'class DropPath(nn.Module):\n'
        '    def __init__(self): super().__init__(); self.p = 0.3\n'
        'def MALA_S(**kw): return nn.Sequential(DropPath())\n')
    with pytest.raises(authors_code.AuthorsCodeError, match='DropPath without drop_prob'):
        authors_code.build_authors('mavit', 'small', str(tmp_path))


@pytest.mark.parametrize('family', sorted(authors_code.SOURCES))
def test_our_classifier_takes_the_authors_weights(family):
    """Our classifier of the tiny arch has the authors' parameter count and takes a state dict of
    the authors' keys and shapes (their manifest) with nothing missing or left over - also when
    another toolbox's scope is the current one (as after a detector test)."""
    from mmengine.registry import DefaultScope
    m = _manifest(family, 'tiny')
    with DefaultScope.overwrite_default_scope('mmseg'):
        ours = authors_code.build_ours(family, 'tiny')
    assert sum(p.numel() for p in ours.parameters()) == m['num_params']
    theirs = types.SimpleNamespace(state_dict=lambda: {
        k: torch.zeros(shape, dtype=getattr(torch, dt)) for k, shape, dt in m['keys']})
    authors_code.load_authors_weights(ours, theirs, family)


@pytest.mark.parametrize('family,arch', [(f, a) for f, (_, _, archs) in
                                         authors_code.SOURCES.items() for a in archs])
def test_our_classifier_cfg_has_the_authors_head_shapes(family, arch):
    """Every released arch: the head (and MAViT's projection) of the config we build have the
    shapes of the authors' tensors."""
    shapes = {k: s for k, s, _ in _manifest(family, arch)['keys']}
    cfg = authors_code.our_classifier_cfg(family, arch)
    assert cfg['backbone']['arch'] == arch and cfg['backbone']['drop_path_rate'] == 0.0
    if family == 'mavit':
        assert [cfg['neck']['projection'], cfg['neck']['in_channels']] == \
            shapes['proj.weight'][:2]
        assert cfg['head']['in_channels'] == shapes['head.weight'][1]
    else:
        assert cfg['head']['in_channels'] == shapes['head.weight'][1]


@pytest.mark.parametrize('name,kind', [
    ('aten::addmm', 'GEMM'), ('aten::mm', 'GEMM'), ('aten::bmm', 'GEMM'),
    ('aten::mkldnn_convolution', 'convolution (incl. depthwise)'),
    ('aten::convolution_backward', 'convolution (incl. depthwise)'),
    ('aten::native_layer_norm', 'norms'), ('aten::native_layer_norm_backward', 'norms'),
    ('aten::copy_', 'layout copies'), ('aten::cat', 'layout copies'),
    ('aten::gelu', 'activations'), ('aten::gelu_backward', 'activations'),
    ('aten::_scaled_dot_product_flash_attention_for_cpu', 'softmax attention (SDPA)'),
    ('aten::_foreach_addcdiv_', 'optimizer'), ('aten::add', 'element-wise (adds, scales)'),
    ('aten::sum', 'reductions'), ('aten::empty', 'other')])
def test_op_kind(name, kind):
    assert op_kind(name) == kind


def test_profile_parts_splits_our_classifier():
    """Our InLine-PVT classifier: attention (with the InLine core and the local residual inside
    it), FFN, norms, embedding and head each get their range, and the forward rows add up to no
    more than the measured forward."""
    model = authors_code.build_ours('inline_pvt', 'tiny')
    x = torch.randn(1, 3, 64, 64)
    optim = torch.optim.SGD(model.parameters(), lr=0.0)
    res = profile_parts(model, lambda m: m(x, mode='tensor').sum(), optim, cores=True)
    paths = {r['path'] for r in res['rows']}
    assert {'attn', 'attn/local', 'attn/core:inline', 'ffn', 'norm', 'embed', 'head'} <= paths
    assert sum(r['fwd_ms'] for r in res['rows']) <= res['forward_s'] * 1e3 * 1.05
    assert res['op_kinds']['GEMM'] > 0


def test_classifier_part_by_what_a_module_is():
    assert classifier_part('block1.0.attn', type('InLineAttention', (nn.Module,), {})()) == 'attn'
    assert classifier_part('layers.0.blocks.0.mlp', nn.Sequential()) == 'ffn'
    assert classifier_part('norm1', nn.LayerNorm(4)) == 'norm'
    assert classifier_part('layers.0.downsample', nn.Sequential()) == 'embed'
    assert classifier_part('head', nn.Linear(2, 2)) == 'head'
    assert classifier_part('layers.0.blocks.0', nn.Sequential()) is None
