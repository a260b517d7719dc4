"""Backbones (DESIGN.md section 2-3): sizes, shapes, checkpoints, freezing, checkpointing, AMP."""
import pytest
import torch
import torch.nn as nn

from mmlinattn.checkpoint import CheckpointError
from mmlinattn.models import InLinePVT, InLineSwin, MAViT

from helpers import authors_state, save_inline_style, save_mala_style

# DESIGN 2 / issue 3: trainable parameters without classification parts and our output norms.
PARAMS = {
    (InLineSwin, 'tiny'): 28_453_008, (InLineSwin, 'small'): 49_022_760,
    (InLineSwin, 'base'): 87_323_072,
    (InLinePVT, 'tiny'): 11_519_232, (InLinePVT, 'small'): 21_043_136,
    (InLinePVT, 'medium'): 37_105_856, (InLinePVT, 'large'): 50_641_280,
    (MAViT, 'tiny'): 13_345_408, (MAViT, 'small'): 24_038_848, (MAViT, 'base'): 46_688_928,
    (MAViT, 'large'): 93_559_008,
}
NEW_PREFIXES = {InLineSwin: ('norm0.', 'norm1.', 'norm2.', 'norm3.'), InLinePVT: ('out_norms.',),
                MAViT: ('extra_norms.',)}
FAMILY = {InLineSwin: 'swin', InLinePVT: 'pvt', MAViT: 'mavit'}
SMALLEST = [(InLineSwin, 'tiny'), (InLinePVT, 'tiny'), (MAViT, 'tiny')]


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
    for i, (o, c) in enumerate(zip(outs, m.num_features)):
        stride = 4 * 2 ** i
        assert o.shape == (2, c, -(-hw[0] // stride), -(-hw[1] // stride)), (i, o.shape)
        assert torch.isfinite(o).all()


@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_out_indices_subset(cls):
    m = cls(arch='tiny', out_indices=(1, 3))
    outs = m(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [m.embed_dims[1], m.embed_dims[3]] == m.num_features


def test_unknown_arch_and_attn_type_list_choices():
    with pytest.raises(ValueError, match="tiny"):
        MAViT(arch='huge')
    with pytest.raises(ValueError, match='medium'):
        InLinePVT(arch='xl')
    with pytest.raises(ValueError, match='I \\(InLine\\)'):
        InLineSwin(arch='tiny', attn_type='IIXS')
    with pytest.raises(ValueError, match='M=mala'):
        MAViT(arch='tiny', attn_type='MMS')
    with pytest.raises(ValueError, match='block count'):
        InLineSwin(arch='tiny', attn_type='IIMS')


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


def test_swin_global_inline_equals_literal_windows_at_224():
    """At 224 the authors' 56-window covers every stage map: global == their windowed behaviour."""
    a = InLineSwin(arch='tiny')
    a.init_weights()
    b = InLineSwin(arch='tiny', inline_window=56)
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        for oa, ob in zip(a.eval()(x), b.eval()(x)):
            assert torch.equal(oa, ob)
        # beyond 224 the literal windows differ from global attention
        x = torch.randn(1, 3, 256, 256)
        assert not torch.allclose(a(x)[0], b(x)[0])


def _loaded_pair(cls, tmp_path, **kw):
    src = cls(arch='tiny', **kw)
    src.init_weights()
    for p in src.parameters():  # make every tensor distinct from a fresh init
        p.data.add_(torch.randn_like(p) * 0.01)
    path = tmp_path / 'authors.pth'
    state = authors_state(src, FAMILY[cls])
    if cls is MAViT:
        save_mala_style(path, state)
    else:
        save_inline_style(path, state)
    dst = cls(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kw)
    dst.init_weights()
    return src, dst, path


@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_authors_checkpoint_loads_exactly(cls, tmp_path, caplog):
    src, dst, _ = _loaded_pair(cls, tmp_path)
    own = src.state_dict()
    loaded = dst.state_dict()
    for k, v in own.items():
        if k.startswith(NEW_PREFIXES[cls]):
            continue
        assert torch.equal(loaded[k], v), f'{k} not loaded'
    # the output norms are new (not in the authors' file): give them the source's values, then the
    # two models must compute the same thing
    dst.load_state_dict({k: v for k, v in own.items() if k.startswith(NEW_PREFIXES[cls])},
                        strict=False)
    x = torch.randn(1, 3, 96, 64)
    src.eval(), dst.eval()
    with torch.no_grad():
        for a, b in zip(src(x), dst(x)):
            assert torch.allclose(a, b)


def test_load_report_lists_dropped_and_new_keys(tmp_path):
    m = MAViT(arch='tiny')
    m.init_weights()
    path = tmp_path / 'm.pth'
    save_mala_style(path, authors_state(m, 'mavit'))
    report = MAViT(arch='tiny').load_pretrained(str(path))
    assert sorted(report['dropped']) == sorted(
        ['proj.weight', 'proj.bias', 'head.weight', 'head.bias', 'norm.weight', 'norm.bias',
         'norm.running_mean', 'norm.running_var', 'norm.num_batches_tracked'])
    assert sorted(report['new']) == sorted(
        f'extra_norms.{i}.norm.{n}' for i in range(4) for n in ('weight', 'bias'))


def test_mala_ema_weights_are_picked_on_request(tmp_path):
    m = MAViT(arch='tiny')
    m.init_weights()
    state = authors_state(m, 'mavit')
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
    small = MAViT(arch='small')
    path = tmp_path / 'small.pth'
    save_mala_style(path, authors_state(small, 'mavit'))
    with pytest.raises(CheckpointError) as e:
        MAViT(arch='tiny').load_pretrained(str(path))
    msg = str(e.value)
    assert 'small.pth' in msg and 'shape mismatches' in msg and '(320,' in msg
    swin_s = InLineSwin(arch='small')
    path = tmp_path / 'swin_s.pth'
    save_inline_style(path, authors_state(swin_s, 'swin'))
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
    src = InLinePVT(arch='tiny', pretrain_img_size=384)
    src.init_weights()
    path = tmp_path / 'p384.pth'
    save_inline_style(path, authors_state(src, 'pvt'), with_config=False)
    dst = InLinePVT(arch='tiny')
    dst.load_pretrained(str(path))
    assert dst.pos_embed1.shape == (1, 56 * 56, 64)
    ref = torch.nn.functional.interpolate(
        src.pos_embed1.reshape(1, 96, 96, 64).permute(0, 3, 1, 2), size=(56, 56), mode='bilinear',
        align_corners=False).permute(0, 2, 3, 1).reshape(1, -1, 64)
    assert torch.allclose(dst.pos_embed1, ref)


def test_norm_eval_freezes_every_batchnorm():
    m = MAViT(arch='tiny', norm_eval=True, norm_cfg=dict(type='SyncBN'))
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


@pytest.mark.parametrize('cls', [InLineSwin, InLinePVT, MAViT])
def test_frozen_stages_stop_gradients(cls):
    m = cls(arch='tiny', frozen_stages=1)
    m.init_weights()
    m.train()
    sum(o.sum() for o in m(torch.randn(1, 3, 64, 64))).backward()
    stem = {InLineSwin: 'patch_embed.', InLinePVT: 'patch_embed1.', MAViT: 'patch_embed.'}[cls]
    stage1 = {InLineSwin: 'layers.0.', InLinePVT: 'block1.', MAViT: 'layers.0.'}[cls]
    stage3 = {InLineSwin: 'layers.2.', InLinePVT: 'block3.', MAViT: 'layers.2.'}[cls]
    for k, p in m.named_parameters():
        if k.startswith((stem, stage1)):
            assert not p.requires_grad and p.grad is None, k
        if k.startswith(stage3):
            assert p.requires_grad and p.grad is not None, k


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
    assert torch.allclose(la, lb, atol=1e-6)
    for (k, pa), pb in zip(a.named_parameters(), b.parameters()):
        if pa.grad is not None:
            assert torch.allclose(pa.grad, pb.grad, atol=1e-5, rtol=1e-4), k


@pytest.mark.parametrize('cls,arch', SMALLEST)
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_autocast_forward_backward_finite(cls, arch, dtype):
    m = cls(arch=arch)
    m.init_weights()
    m.train()
    x = torch.randn(2, 3, 64, 64) * 3
    with torch.autocast('cpu', dtype=dtype):
        loss = sum(o.float().square().mean() for o in m(x))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
