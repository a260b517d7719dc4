"""Backbones: sizes, shapes, the authors' checkpoints, freezing, activation checkpointing, low
precision."""
import pytest
import torch
import torch.nn as nn

from mmlinattn.core.families import FAMILIES
from mmlinattn.core.models import InLinePVT, InLineSwin, MAViT
from mmlinattn.core.weights import CheckpointError

from helpers import (
    AUTHORS_CHANNELS,
    FAMILY_ARCHS,
    authors_manifest,
    authors_state,
    on_devices,
    precision,
    save_authors_file,
    save_inline_style,
    save_mala_style,
    tiny_arch,
)

# Trainable parameters without the classification parts and our output norms: the authors' counts
# (tests/data/authors_keys) less their heads.
PARAMS = {
    (InLineSwin, 'tiny'): 28_453_008, (InLineSwin, 'small'): 49_022_760,
    (InLineSwin, 'base'): 87_323_072,
    (InLinePVT, 'tiny'): 11_519_232, (InLinePVT, 'small'): 21_043_136,
    (InLinePVT, 'medium'): 37_105_856, (InLinePVT, 'large'): 50_641_280,
    (MAViT, 'tiny'): 13_345_408, (MAViT, 'small'): 24_038_848, (MAViT, 'base'): 46_688_928,
    (MAViT, 'large'): 93_559_008,
}
NEW_PREFIXES = {InLineSwin: ('out_norms.',), InLinePVT: ('out_norms.',), MAViT: ('extra_norms.',)}
SMALLEST = [(InLineSwin, 'tiny'), (InLinePVT, 'tiny'), (MAViT, 'tiny')]


@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_projections_are_torch_linears_that_tools_count_and_quantize(cls):
    """Every linear layer is torch's own ``nn.Linear`` (the exact type, which tools match on):
    mmcv's FLOP counter gives each one tokens x C_in x C_out multiply-adds (read off the layer's
    input and weight shapes here), and torch's dynamic quantization swaps every one for its int8
    ``Linear``. MAViT projects with 1x1 convolutions and has none."""
    import copy
    import warnings

    from mmcv.cnn.utils.flops_counter import add_flops_counting_methods
    torch.manual_seed(0)
    model = cls(arch='tiny', out_indices=(0, 1, 2, 3)).eval()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert all(type(m) is nn.Linear for m in linears)
    assert bool(linears) == (cls is not MAViT)
    modules = dict(model.named_modules())  # no projection written as F.linear on a bare weight
    for name, p in model.named_parameters():
        if p.dim() == 2 and name.endswith('.weight'):
            assert type(modules[name.rsplit('.', 1)[0]]) is nn.Linear, name
    if not linears:
        return
    x = torch.randn(1, 3, 64, 96)
    counted = add_flops_counting_methods(copy.deepcopy(model))
    seen = {}
    hooks = [m.register_forward_hook(lambda m, a, o: seen.setdefault(m, []).append(a[0].shape))
             for m in linears]
    counted.start_flops_count()
    with torch.no_grad():
        model(x)
        counted(x)
    for h in hooks:
        h.remove()
    counted_linears = [m for m in counted.modules() if isinstance(m, nn.Linear)]
    assert len(counted_linears) == len(linears)
    for ours, theirs in zip(linears, counted_linears):
        want = sum(torch.Size(s[:-1]).numel() * ours.in_features * ours.out_features
                   for s in seen[ours])
        assert theirs.__flops__ == want > 0
    counted.stop_flops_count()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # torch.ao.quantization's deprecation notice
        q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear},
                                                   dtype=torch.qint8)
    swapped = [m for m in q.modules() if 'quantized' in type(m).__module__
               and type(m).__name__ == 'Linear']
    assert len(swapped) == len(linears)
    assert not any(type(m) is nn.Linear for m in q.modules())
    with torch.no_grad():
        for a, b in zip(q(x), model(x)):  # int8 weights: close, not equal
            assert (a - b).norm() < 0.1 * b.norm()


@pytest.mark.parametrize('cls,arch', list(PARAMS))
def test_parameter_counts_exact(cls, arch):
    m = cls(arch=arch)
    n = sum(p.numel() for k, p in m.named_parameters() if not k.startswith(NEW_PREFIXES[cls]))
    assert n == PARAMS[(cls, arch)]


@pytest.mark.parametrize('cls,arch', SMALLEST)
@pytest.mark.parametrize('hw', [(64, 64), (96, 160), (75, 113), (33, 47)])
def test_any_input_size(cls, arch, hw):
    m = cls(arch=arch)
    m.init_weights()
    m.eval()
    with torch.no_grad():
        outs = m(torch.randn(2, 3, *hw))
    assert len(outs) == 4
    # Swin pads to the patch and MAViT's stride-2 convs have padding 1: ceil sizes; PVT v1's strided
    # patch convs drop the remainder at every stage: floor sizes
    h, w = hw
    for i, (o, c) in enumerate(zip(outs, m.num_features)):
        if cls is InLinePVT:
            h, w = (h // 4, w // 4) if i == 0 else (h // 2, w // 2)
        else:
            stride = 4 * 2 ** i
            h, w = -(-hw[0] // stride), -(-hw[1] // stride)
        assert o.shape == (2, c, h, w), (i, o.shape)
        assert torch.isfinite(o).all()


def test_pvt_drops_the_remainder_like_pvt_v1_and_pads_on_request():
    m = InLinePVT(arch='tiny').eval()
    with torch.no_grad():
        x = torch.randn(1, 3, 70, 99)
        # the remainder is dropped: the same as the input cropped to the part the convs cover
        a = m(x)
        b = m(x[..., :68, :96])
        for oa, ob in zip(a[:1], b[:1]):
            # the patch conv reads a 70x99 input and a cropped (strided) 68x96 view: its kernel may
            # block the sums otherwise (equal bit for bit here); 2e-4 of the scale is 100x a float32
            # stage's order noise (~1e-6 of it) and 50x under a misplaced crop (O(1))
            torch.testing.assert_close(oa, ob, rtol=0, atol=2e-4 * ob.abs().max().item())
        with pytest.raises(ValueError, match='pad_patches=True'):
            m(torch.randn(1, 3, 20, 64))
        padded = InLinePVT(arch='tiny', pad_patches=True).eval()
        assert [o.shape[-2:] for o in padded(torch.randn(1, 3, 20, 64))] == [
            (5, 16), (3, 8), (2, 4), (1, 2)]


# Stage widths of the tiny variants, typed from the authors' released files (InLine-PVT-T as
# PVT-T, InLine-Swin-T as Swin-T, MAViT-T as MAViT_T.pth; not read from the classes' arch tables,
# which is what is checked), and the strides of a 4-stage pyramid.
PAPER_TINY_CHANNELS = {fam.backbone: list(AUTHORS_CHANNELS[name]['tiny'])
                       for name, fam in FAMILIES.items()}
SUBSETS = [tuple(i for i in range(4) if mask >> i & 1) for mask in range(1, 16)]


@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_every_out_indices_subset(cls):
    """Every non-empty subset of the four stages: the returned maps have the papers' channels (and
    ``stage_channels`` / ``num_features`` say the same), strides 4/8/16/32, and equal the full
    model's maps at those stages when both hold the same weights (output norms included)."""
    torch.manual_seed(0)
    channels = PAPER_TINY_CHANNELS[cls]
    assert cls.stage_channels('tiny') == channels
    full = cls(arch='tiny', out_norm=True).eval()
    full.init_weights()
    for norm in full.modules():  # non-trivial norms, so that a swapped or skipped norm shows
        if isinstance(norm, nn.LayerNorm):
            nn.init.normal_(norm.weight, 1.0, 0.1)
            nn.init.normal_(norm.bias, 0.0, 0.1)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        want = full(x)
    for subset in SUBSETS:
        m = cls(arch='tiny', out_indices=subset, out_norm=True).eval()
        missing, unexpected = m.load_state_dict(full.state_dict(), strict=False)
        assert not missing, (subset, missing)
        with torch.no_grad():
            outs = m(x)
        assert [o.shape[1] for o in outs] == [channels[i] for i in subset] == m.num_features, subset
        assert [o.shape[-1] for o in outs] == [64 // 2 ** (i + 2) for i in subset], subset
        for o, i in zip(outs, subset):
            # the same kernels on the same shapes in both models: equal bit for bit (measured); a
            # swapped or skipped norm moves these O(1) maps by ~1e-1
            assert torch.allclose(o, want[i], atol=1e-5), (subset, i)


@pytest.mark.parametrize('out_norm', [True, False])
@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_roi_align_reads_the_features_we_return(cls, out_norm):
    """mmcv's C++ RoIAlign reads its input as plain NCHW memory and ignores strides, so a map with
    channels-last strides (what a permute from tokens gives, and what convolutions then keep) is
    pooled from the wrong places. Reference: the same op on a plain contiguous copy, through mmdet's
    FPN as in a detector. (Before the fix, the RoI heads of every Mask R-CNN with our backbones
    learned nothing from scratch: toy bbox AP50 0.02-0.04 vs 0.82 for mmdet's Swin-T.)"""
    from mmcv.ops import roi_align
    from mmdet.models.necks import FPN
    torch.manual_seed(0)
    m = cls(arch='tiny', out_norm=out_norm).eval()
    fpn = FPN(in_channels=m.num_features, out_channels=16, num_outs=4).eval()
    rois = torch.tensor([[0, 3., 5., 40., 52.], [1, 10., 0., 63., 30.]])
    with torch.no_grad():
        feats = m(torch.randn(2, 3, 64, 64))
        assert all(f.is_contiguous() for f in feats)
        for f, stride in zip(fpn(feats), (4, 8, 16, 32)):
            got = roi_align(f, rois, (7, 7), 1.0 / stride, 0, 'avg', True)
            want = roi_align(f.contiguous(), rois, (7, 7), 1.0 / stride, 0, 'avg', True)
            # one op on the same memory (f is contiguous) and each output its own fixed sum: equal
            # bit for bit; strides read wrongly take other pixels, O(1) apart
            assert torch.allclose(got, want, atol=1e-6), stride


def test_unknown_arch_and_attn_type_list_choices():
    with pytest.raises(ValueError, match="tiny"):
        MAViT(arch='huge')
    with pytest.raises(ValueError, match='medium'):
        InLinePVT(arch='xl')
    with pytest.raises(ValueError, match='I \\(InLine\\)'):
        InLineSwin(arch='tiny', attn_type='IIXS')
    with pytest.raises(ValueError, match='M=mala'):
        MAViT(arch='tiny', attn_type='MMS')
    with pytest.raises(ValueError, match='has 2 blocks but the stage has 6'):
        InLineSwin(arch='tiny', attn_type='II(I2)S')


def test_attn_type_overrides():
    m = MAViT(arch='tiny', attn_type='MMMM')
    assert {b.attn.core for layer in m.layers for b in layer.blocks} == {'mala'}
    s = InLineSwin(arch='tiny', attn_type='SSSS')
    assert {b.core for layer in s.layers for b in layer.blocks} == {'softmax'}
    b = InLineSwin(arch='base')
    assert [blk.core for blk in b.layers[2].blocks][:3] == ['inline', 'inline', 'softmax']
    p = InLinePVT(arch='tiny', attn_type='IISS')
    assert p.block3[0].attn.core == 'softmax' and p.block3[0].attn.sr_ratio == 2
    lin = InLinePVT(arch='tiny', attn_type='LLLL', attn_cfg=dict(kernel='relu'))
    lin(torch.randn(1, 3, 64, 64))


def test_swin_arch_and_attn_type_resolve_one_way():
    """A custom InLine-Swin arch with stage 1's width doubles it per stage, as Swin's
    ``embed_dims``; the old mixed-stage spelling ``IIMS2`` still reads (with a FutureWarning),
    and only InLine-Swin reads it."""
    arch = dict(embed_dims=16, depths=[1, 1, 3, 1], num_heads=[1, 2, 4, 8])
    m = InLineSwin(arch=arch)
    assert m.embed_dims == InLineSwin.stage_channels(arch) == [16, 32, 64, 128]
    with pytest.warns(FutureWarning):
        old = InLineSwin(arch=arch, attn_type='IIMS2')
    assert [b.core for b in old.layers[2].blocks] == ['inline', 'inline', 'softmax']
    with pytest.raises(ValueError):
        MAViT(arch='tiny', attn_type='MMMS2')


def test_window_bias_table_is_initialised_once():
    """Swin's relative-position bias table gets its truncated normal (std 0.02) when it is
    made; ``init_weights`` re-initialises the linear layers and leaves the table as it was."""
    torch.manual_seed(0)
    m = InLineSwin(arch='tiny', attn_type='SSSS')
    tables = [(n, p.detach().clone()) for n, p in m.named_parameters()
              if n.endswith('relative_position_bias_table')]
    assert len(tables) == 12
    m.init_weights()
    params = dict(m.named_parameters())
    for name, before in tables:
        assert torch.equal(params[name], before), name
        assert 0.015 < before.std().item() < 0.025, name


@pytest.mark.parametrize('cls', [InLinePVT, InLineSwin, MAViT])
def test_gradients_have_their_parameters_strides(cls):
    """DDP's buckets are views with each parameter's strides, size-1 dimensions included, and
    torch copies (and warns, "Grad strides do not match bucket view strides") every step where a
    gradient has other strides: each parameter's gradient has exactly its strides."""
    torch.manual_seed(0)
    m = cls(arch=tiny_arch(cls, (1, 1, 1, 1)))
    out = m(torch.randn(2, 3, 64, 64))
    sum(o.sum() for o in out).backward()
    bad = [(n, p.stride(), p.grad.stride()) for n, p in m.named_parameters()
           if p.grad is not None and p.grad.stride() != p.stride()]
    assert not bad, bad[:4]


def test_swin_global_inline_equals_literal_windows_at_224():
    """At 224 the authors' 56-window covers every stage map: global == their windowed behaviour."""
    a = InLineSwin(arch='tiny')
    a.init_weights()
    b = InLineSwin(arch='tiny', inline_window=56)
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        for oa, ob in zip(a.eval()(x), b.eval()(x)):
            assert torch.equal(oa, ob)  # every map fits the window: the very same calls run
        # beyond 224 the literal windows differ from global attention
        x = torch.randn(1, 3, 256, 256)
        assert not torch.allclose(a(x)[0], b(x)[0])


FAMILY_NAME = {fam.backbone: name for name, fam in FAMILIES.items()}
ALL_ARCHS = [(fam.backbone, a) for name, fam in FAMILIES.items() for a in FAMILY_ARCHS[name]]


def _derived(cls, arch):
    """Buffers of the authors' model that are a function of the architecture (the manifest's)."""
    return tuple(authors_manifest(FAMILY_NAME[cls], arch)['derived_buffers'])


def _expected_backbone_keys(cls, arch):
    """name -> shape of the authors' file, minus the classification parts (the manifest's
    ``classification_prefixes``) and the buffers derived from the architecture, which a backbone may
    recompute instead of loading."""
    manifest = authors_manifest(FAMILY_NAME[cls], arch)
    heads, derived = tuple(manifest['classification_prefixes']), _derived(cls, arch)
    return {k: tuple(shape) for k, shape, _ in manifest['keys']
            if not k.startswith(heads) and k.rsplit('.', 1)[-1] not in derived}


@pytest.mark.parametrize('cls,arch', ALL_ARCHS, ids=[f'{FAMILY_NAME[c]}-{a}' for c, a in ALL_ARCHS])
def test_our_names_and_shapes_are_the_authors(cls, arch):
    """Every tensor of the authors' backbone exists in ours under the same name and shape; ours adds
    only the output norms."""
    ours = {k: tuple(v.shape) for k, v in cls(arch=arch).state_dict().items()}
    theirs = _expected_backbone_keys(cls, arch)
    missing = sorted(k for k in theirs if k not in ours)
    full = {k: tuple(shape) for k, shape, _ in authors_manifest(FAMILY_NAME[cls], arch)['keys']}
    wrong = sorted(f'{k}: {full[k]} vs {ours[k]}' for k in full if k in ours and ours[k] != full[k])
    extra = sorted(k for k in ours if k not in theirs and not k.startswith(NEW_PREFIXES[cls])
                   and k.rsplit('.', 1)[-1] not in _derived(cls, arch))
    assert not missing and not wrong and not extra, (missing[:5], wrong[:5], extra[:5])


def _load_authors_file(cls, arch, tmp_path, **kw):
    path = tmp_path / f'{FAMILY_NAME[cls]}_{arch}.pth'
    state = save_authors_file(path, FAMILY_NAME[cls], arch)
    model = cls(arch=arch, init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kw)
    model.init_weights()
    return model, state


def _check_loaded(cls, arch, tmp_path):
    model, state = _load_authors_file(cls, arch, tmp_path)
    loaded = model.state_dict()
    theirs = _expected_backbone_keys(cls, arch)
    for k in theirs:
        assert torch.equal(loaded[k], state[k]), f'{k} not loaded from the authors\' file'
    # nothing of ours was left at its initial value except the output norms (and the buffers that
    # are a function of the architecture)
    assert sorted(k for k in loaded if k not in theirs and k.rsplit('.', 1)[-1] not in
                  _derived(cls, arch)) == \
        sorted(k for k in loaded if k.startswith(NEW_PREFIXES[cls]))
    with torch.no_grad():
        outs = model.eval()(torch.randn(1, 3, 64, 64))
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_authors_file_loads_exactly(cls, tmp_path):
    _check_loaded(cls, 'tiny', tmp_path)


@pytest.mark.heavy
@pytest.mark.parametrize('cls,arch', ALL_ARCHS, ids=[f'{FAMILY_NAME[c]}-{a}' for c, a in ALL_ARCHS])
def test_authors_file_loads_exactly_every_arch(cls, arch, tmp_path):
    _check_loaded(cls, arch, tmp_path)


def test_load_report_lists_dropped_and_new_keys(tmp_path):
    path = tmp_path / 'm.pth'
    state = save_authors_file(path, 'mavit', 'tiny')
    report = MAViT(arch='tiny').load_pretrained(str(path))
    assert sorted(report['dropped']) == \
        sorted(k for k in state if k.startswith(('proj.', 'norm.', 'head.')))
    # the authors' downstream code names its output norms extra_norms.<i> (a LayerNorm2d)
    assert sorted(report['new']) == sorted(
        f'extra_norms.{i}.norm.{n}' for i in range(4) for n in ('weight', 'bias'))


def test_mala_ema_weights_are_picked_on_request(tmp_path):
    state = authors_state('mavit', 'tiny')
    ema = {k: (v + 1 if v.is_floating_point() else v) for k, v in state.items()}
    path = tmp_path / 'mala.pth'
    save_mala_style(path, state, ema)
    plain = MAViT(arch='tiny')
    plain.load_pretrained(str(path))
    ema_m = MAViT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path), use_ema=True))
    ema_m.init_weights()
    k = 'layers.0.blocks.0.attn.qkvo.weight'
    assert torch.equal(plain.state_dict()[k], state[k])
    assert torch.equal(ema_m.state_dict()[k], ema[k])


def test_wrong_architecture_fails_with_keys_and_shapes(tmp_path):
    path = tmp_path / 'small.pth'
    save_authors_file(path, 'mavit', 'small')
    with pytest.raises(CheckpointError) as e:
        MAViT(arch='tiny').load_pretrained(str(path))
    msg = str(e.value)
    assert 'small.pth' in msg and 'shape mismatch' in msg and '(320,' in msg
    path = tmp_path / 'swin_s.pth'
    save_authors_file(path, 'inline_swin', 'small')
    with pytest.raises(CheckpointError, match='not in the model: .*layers.2.blocks.6.norm1'):
        InLineSwin(arch='tiny').load_pretrained(str(path))


def test_missing_and_garbage_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match='not found: .*nope.pth'):
        InLinePVT(arch='tiny', init_cfg=dict(type='Pretrained',
                                             checkpoint=str(tmp_path / 'nope.pth'))).init_weights()
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(b'<html>404</html>')
    with pytest.raises(CheckpointError, match='bad.pth is not a readable torch checkpoint'):
        InLinePVT(arch='tiny').load_pretrained(str(bad))


def test_pvt_position_tables_resized_from_other_resolution(tmp_path):
    state = authors_state('inline_pvt', 'tiny')
    for i, side in enumerate((96, 48, 24, 12)):  # tables learned at 384
        state[f'pos_embed{i + 1}'] = torch.randn(1, side * side,
                                                 state[f'pos_embed{i + 1}'].shape[-1])
    path = tmp_path / 'p384.pth'
    save_inline_style(path, state, with_config=False)
    dst = InLinePVT(arch='tiny')
    dst.load_pretrained(str(path))
    assert dst.pos_embed1.shape == (1, 56 * 56, 64)
    ref = torch.nn.functional.interpolate(
        state['pos_embed1'].reshape(1, 96, 96, 64).permute(0, 3, 1, 2), size=(56, 56),
        mode='bilinear', align_corners=False).permute(0, 2, 3, 1).reshape(1, -1, 64)
    # the loader's F.interpolate call on the same table, each value a fixed 4-term sum: equal
    assert torch.allclose(dst.pos_embed1, ref)


@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_norm_cfg_builds_the_block_and_output_norms_in_every_family(cls):
    """``norm_cfg`` means one thing in every family: the blocks' two norms and the output norms (as
    mmdet builds its output norms from its ``norm_cfg``). Counted from the arch table: 2 per block
    plus one per returned stage, every one with the eps asked for; Swin also builds its patch
    embedding's and its three patch mergings' norms from it, as mmdet's Swin does."""
    depths = cls.resolve_arch('tiny')['depths']
    m = cls(arch='tiny', out_indices=(1, 3), out_norm=True, norm_cfg=dict(type='LN', eps=0.25))
    eps = [mod.eps for mod in m.modules() if isinstance(mod, nn.LayerNorm) and mod.eps == 0.25]
    assert len(eps) == 2 * sum(depths) + 2 + (1 + 3 if cls is InLineSwin else 0)
    outs = getattr(m, m.out_norm_name)
    assert [isinstance(outs[i], nn.Identity) for i in range(4)] == [True, False, True, False]
    assert outs[1].norm.eps == outs[3].norm.eps == 0.25
    if cls is MAViT:  # channels-first blocks: a non-LayerNorm norm runs on the NCHW map as it is
        g = cls(arch='tiny', out_norm=True, norm_cfg=dict(type='GN', num_groups=8),
                out_indices=(3,))
        assert isinstance(g.extra_norms[3].norm, nn.GroupNorm)
        assert g.eval()(torch.randn(1, 3, 64, 64))[0].shape == (1, 512, 2, 2)


def test_mavit_conv_norms_are_conv_norm_cfg():
    """MAViT's stem and downsampling BatchNorms have their own name, ``conv_norm_cfg``; a BN config
    given as ``norm_cfg`` (its former meaning) is read as that, with a FutureWarning."""
    m = MAViT(arch='tiny', conv_norm_cfg=dict(type='SyncBN'))
    assert sum(isinstance(x, nn.SyncBatchNorm) for x in m.modules()) == 4 + 3
    assert all(mod.eps == 1e-6 for mod in m.modules() if isinstance(mod, nn.LayerNorm))
    with pytest.warns(FutureWarning, match='conv_norm_cfg'):
        old = MAViT(arch='tiny', norm_cfg=dict(type='SyncBN', requires_grad=True))
    assert sum(isinstance(x, nn.SyncBatchNorm) for x in old.modules()) == 4 + 3


def test_norm_eval_freezes_every_batchnorm():
    m = MAViT(arch='tiny', norm_eval=True, conv_norm_cfg=dict(type='SyncBN'))
    bns = [mod for mod in m.modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)]
    assert len(bns) == 4 + 3  # stem + three downsamplings
    m = MAViT(arch='tiny', norm_eval=True)  # SyncBN needs a process group to run: use BN here
    m.init_weights()
    before = {k: v.clone() for k, v in m.state_dict().items() if 'running' in k}
    m.train()
    m(torch.randn(2, 3, 64, 64))
    after = m.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    m2 = MAViT(arch='tiny', norm_eval=False)
    m2.train()
    m2(torch.randn(2, 3, 64, 64))
    assert not torch.equal(m2.patch_embed.proj[1].running_mean, torch.zeros(32))


# frozen_stages=k freezes the stem and stages 1..k (mmdet's convention), each with its output norm;
# names as the authors' (position tables belong to their stage).
FROZEN_PREFIXES = {
    InLineSwin: lambda k: ('patch_embed.',) + tuple(f'layers.{i}.' for i in range(k)) +
    tuple(f'out_norms.{i}.' for i in range(k)),
    InLinePVT: lambda k: tuple(p for i in range(1, max(k, 1) + 1) for p in (
        f'patch_embed{i}.', f'pos_embed{i}')) + tuple(f'block{i}.' for i in range(1, k + 1)) +
    tuple(f'out_norms.{i}.' for i in range(k)),
    MAViT: lambda k: ('patch_embed.',) + tuple(f'layers.{i}.' for i in range(k)) +
    tuple(f'extra_norms.{i}.' for i in range(k)),
}


@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
@pytest.mark.parametrize('k', [0, 1, 2, 4])
def test_frozen_stages_freeze_exactly_their_parameters(cls, k):
    kw = dict(out_norm=True) if cls is InLinePVT else {}
    m = cls(arch='tiny', frozen_stages=k, drop_path_rate=0.0, **kw)
    m.init_weights()
    m.train()
    loss = sum(o.sum() for o in m(torch.randn(1, 3, 64, 64)))
    if loss.requires_grad:  # k = 4 freezes everything
        loss.backward()
    frozen = FROZEN_PREFIXES[cls](k)
    names = [n for n, _ in m.named_parameters()]
    assert any(n.startswith(frozen) for n in names)
    for name, p in m.named_parameters():
        if name.startswith(frozen):
            assert not p.requires_grad and p.grad is None, f'{name} should be frozen'
        else:
            assert p.requires_grad and p.grad is not None, f'{name} should train'
    for name, mod in m.named_modules():
        if not name:
            continue
        if (name + '.').startswith(frozen) or name in frozen:
            assert not mod.training, f'{name} should be in eval mode'
        elif not any(f.startswith(name + '.') for f in frozen):  # not a parent of a frozen module
            assert mod.training, f'{name} should be in training mode'
    m.train()  # calling train() again must not unfreeze anything
    assert all(not p.requires_grad for n, p in m.named_parameters() if n.startswith(frozen))


@pytest.mark.parametrize('kwargs,match', [
    (dict(frozen_stages=7), r'frozen_stages=7 .* -1 .* 4'),
    (dict(frozen_stages=-2), r'frozen_stages=-2'),
    (dict(drop_path_rate=-1), r'drop_path_rate=-1 must lie in \[0, 1\)'),
    (dict(drop_path_rate=1.5), r'drop_path_rate=1.5'),
    (dict(out_indices=()), r'out_indices is empty.*\[0, 1, 2, 3\]'),
    (dict(out_indices=(0, 4)), r'out_indices \(0, 4\) must be .*\[0, 1, 2, 3\]'),
    (dict(out_indices=(2, 1)), r'increasing'),
])
@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_bad_backbone_arguments_name_the_valid_values(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(arch='tiny', **kwargs)


@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_with_cp_same_outputs_and_grads(cls):
    torch.manual_seed(0)
    a = cls(arch='tiny', drop_path_rate=0.0)
    a.init_weights()
    b = cls(arch='tiny', drop_path_rate=0.0, with_cp=True)
    b.load_state_dict(a.state_dict())
    a.train(), b.train()
    x = torch.randn(1, 3, 64, 96)
    la = sum(o.square().mean() for o in a(x))
    lb = sum(o.square().mean() for o in b(x))
    la.backward()
    lb.backward()
    # checkpointing recomputes the forward with the same kernels on the same shapes: losses and
    # gradients equal bit for bit (measured); the tolerances only leave autograd room to add a
    # weight's gradient in another order (1 ulp)
    assert torch.allclose(la, lb, atol=1e-6)
    for (k, pa), pb in zip(a.named_parameters(), b.parameters()):
        if pa.grad is not None:
            assert torch.allclose(pa.grad, pb.grad, atol=1e-5, rtol=1e-4), k


# Stated tolerances for whole-backbone low precision against fp32 (random init, 64 px, 2 images):
# relative L2 error of every stage output, and cosine similarity of the full parameter gradient.
# They follow the mantissa: TF32 (CUDA's matmuls and convolutions) keeps float16's 10 bits.
LOW_PRECISION_TOL = {'bf16': dict(out=3e-2, grad_cos=0.99), 'fp16': dict(out=1e-2, grad_cos=0.999),
                     'tf32': dict(out=1e-2, grad_cos=0.999)}


def _run(m, x, device, prec='fp32'):
    m.zero_grad()
    with precision(device, prec):
        outs = m(x)
    outs = [o.float() for o in outs]
    sum(o.square().mean() for o in outs).backward()
    grad = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
    return [o.detach() for o in outs], grad


@pytest.mark.parametrize('cls,arch', SMALLEST)
@pytest.mark.parametrize('device,prec', on_devices(('bf16',), ('fp16',), cuda_only=[('tf32',)]))
def test_autocast_matches_fp32(cls, arch, device, prec):
    """A tiny backbone's training step (forward, backward) under bf16 / fp16 autocast, or TF32 on
    CUDA, against the same step in float32."""
    try:
        with precision(device, prec):
            pass
    except RuntimeError as err:  # torch 2.1's CPU autocast takes bfloat16 only
        pytest.skip(f'this torch\'s {device} autocast does not take {prec}: {err}')
    m = cls(arch=arch, drop_path_rate=0.0)
    m.init_weights()
    m.train()
    x = torch.randn(2, 3, 64, 64) * 3
    m, x = m.to(device), x.to(device)
    ref_outs, ref_grad = _run(m, x, device)
    outs, grad = _run(m, x, device, prec)
    tol = LOW_PRECISION_TOL[prec]
    for i, (o, r) in enumerate(zip(outs, ref_outs)):
        assert torch.isfinite(o).all()
        rel = ((o - r).norm() / r.norm()).item()
        assert rel < tol['out'], f'stage {i}: relative error {rel:.2e} vs fp32'
    cos = torch.nn.functional.cosine_similarity(grad, ref_grad, dim=0).item()
    assert torch.isfinite(grad).all() and cos > tol['grad_cos'], cos


@pytest.mark.heavy
@pytest.mark.parametrize('cls,arch', [(c, a) for c, a in ALL_ARCHS if a != 'tiny'])
def test_large_arch_forward(cls, arch):
    """Forward + backward of the larger variants at a detection-like size (slow on a CPU)."""
    m = cls(arch=arch)
    m.init_weights()
    outs = m(torch.randn(1, 3, 160, 224))
    assert [o.shape[1] for o in outs] == m.num_features
    sum(o.mean() for o in outs).backward()


@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_custom_arch_with_any_stage_widths(cls):
    """A custom arch dict may give any width per stage (not only doubling ones): every family
    builds, runs forward and backward, and returns the widths the dict lists; per-stage lists of
    the wrong length are refused by name at construction."""
    widths = [32, 64, 96, 128]  # stage 3 is not twice stage 2 (Swin's merging would give 128)
    arch = dict(embed_dims=widths, depths=[1, 1, 1, 1], num_heads=[1, 2, 3, 4], mlp_ratio=4)
    m = cls(arch=arch)
    outs = m(torch.randn(1, 3, 64, 96))
    assert [o.shape[1] for o in outs] == widths == m.num_features
    assert [tuple(o.shape[-2:]) for o in outs] == [(16, 24), (8, 12), (4, 6), (2, 3)]
    sum(o.mean() for o in outs).backward()
    with pytest.raises(ValueError, match=r'num_heads=\[1, 2, 3\] has 3 entries .* 4 stages'):
        cls(arch=dict(arch, num_heads=[1, 2, 3]))


@pytest.mark.parametrize('cls,key,module,sets', [
    (MAViT, 'local_residual', 'QKVOAttention', 'core'),  # an InLine token-module option
    (InLinePVT, 'beta', 'TokenAttention', 'sr_ratio'),   # MALA's switch goes in core_options
    (InLineSwin, 'num_heads', 'TokenAttention', 'num_heads'),
])
def test_attn_cfg_key_the_attention_module_does_not_take(cls, key, module, sets):
    """A wrong ``attn_cfg`` key stops the build with the backbone, the key, the module and the keys
    it takes (was a bare TypeError from the module's __init__, or 'multiple values')."""
    with pytest.raises(ValueError, match=rf"{cls.__name__}: attn_cfg \['{key}'\] .*{module}.*"
                                         rf"'kernel'.*'core_options'.*sets \[.*'{sets}'"):
        cls(arch='tiny', attn_cfg={key: 1})
    cls(arch='tiny', attn_cfg=dict(kernel='elu', core_options={}))  # the module's own keys build
