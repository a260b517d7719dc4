"""InLine-PVT's scaffold against mmdet's PVT v1 (docs/design.md, subsection "InLine-PVT's
scaffold against mmdet's PVT v1").

Our ``InLinePVT`` with softmax (spatial-reduction) attention in every stage and PVT-T's heads,
given the weights of mmdet's ``PyramidVisionTransformer`` PVT-T through the key mapping below, must
compute mmdet's four stage outputs: at 224 px, where the position tables are used as learned, and
at a detection-like size, where every table is resized bilinearly and the strided patch convolutions
drop the remainder of a size that is not a multiple of 32. Expected values come from mmdet only.

One difference in the function is by design: the LayerNorms of the patch embeddings and of the
spatial reduction have torch's default eps 1e-5 in the authors' PVT code that InLine builds on (and
in ours), while mmdet's port builds them from its ``norm_cfg``, eps 1e-6. The equality tests give
our model mmdet's eps; ``test_our_default_eps_is_the_only_difference`` checks that it shows.

Given the same weights the two scaffolds also take the same training steps; from scratch they start
from different weights. The last tests pin mmdet's from-scratch init as the design document states
it, and the ``init_scheme`` options that start ours from it. Everything runs in float64 on one small
image, so that a wrong detail (a key, an eps, an interpolation, a flooring) shows above rounding.
"""
import math

import pytest
import torch

from mmlinattn.core.models.backbones import InLinePVT

pytest.importorskip('mmdet')

D64 = torch.float64
# PVT-T in our arch format: InLine-PVT's widths and MLP ratios with PVT's heads.
PVT_T = dict(embed_dims=[64, 128, 320, 512], depths=[2, 2, 2, 2], num_heads=[1, 2, 5, 8],
             mlp_ratio=[8, 8, 4, 4])
EXACT = (224, 224)  # the size the position tables were learned at
DETECTION = (200, 264)  # maps 50x66, 25x33, 12x16, 6x8: every table resized, floored patch convs
TIGHT = 1e-9  # float64 rounding, relative to each stage's largest output value
FLOAT32_TABLES = 1e-6  # float32 rounding: what the eps difference must exceed


# ----------------------------------------------------------------------------- the mapping
def mmdet_pvt_to_ours(state, depths):
    """mmdet ``PyramidVisionTransformer`` state dict -> ours, for ``InLinePVT(attn_type='SSSS')``.

    mmdet's stage i is ``layers.<i>`` = [PatchEmbed (``projection``, ``norm``),
    ModuleList([AbsolutePositionEmbedding, layer, ...]), norm]; its attention is torch's
    ``nn.MultiheadAttention`` (one ``in_proj`` with rows q | k | v, and ``out_proj``) and its MLP
    two 1x1 convolutions (``ffn.layers.0`` and ``ffn.layers.3``). Every mmdet key is used once.
    """
    state = dict(state)
    out = {}
    for i, depth in enumerate(depths):
        src, n = f'layers.{i}.', i + 1
        for p in ('weight', 'bias'):
            out[f'patch_embed{n}.proj.{p}'] = state.pop(f'{src}0.projection.{p}')
            out[f'patch_embed{n}.norm.{p}'] = state.pop(f'{src}0.norm.{p}')
        out[f'pos_embed{n}'] = state.pop(f'{src}1.0.pos_embed')
        for j in range(depth):
            s, d = f'{src}1.{j + 1}.', f'block{n}.{j}.'
            for p in ('weight', 'bias'):
                qkv = state.pop(f'{s}attn.attn.in_proj_{p}')
                c = qkv.shape[0] // 3
                out[f'{d}attn.q.{p}'], out[f'{d}attn.kv.{p}'] = qkv[:c], qkv[c:]
                out[f'{d}attn.proj.{p}'] = state.pop(f'{s}attn.attn.out_proj.{p}')
                out[f'{d}norm1.{p}'] = state.pop(f'{s}norm1.{p}')
                out[f'{d}norm2.{p}'] = state.pop(f'{s}norm2.{p}')
                if f'{s}attn.sr.{p}' in state:  # stages with spatial reduction (sr ratio > 1)
                    out[f'{d}attn.sr.{p}'] = state.pop(f'{s}attn.sr.{p}')
                    out[f'{d}attn.norm.{p}'] = state.pop(f'{s}attn.norm.{p}')
                for ours, theirs in (('fc1', '0'), ('fc2', '3')):
                    t = state.pop(f'{s}ffn.layers.{theirs}.{p}')
                    out[f'{d}mlp.{ours}.{p}'] = t[:, :, 0, 0] if p == 'weight' else t
    assert not state, f'mmdet keys left unmapped: {sorted(state)}'
    return out


def mmdet_pvt_t(seed=0, noise=0.05, **kwargs):
    """mmdet's PVT-T after its own from-scratch init, every tensor then perturbed so that no bias is
    zero and no LayerNorm the identity (a swapped or dropped key cannot hide)."""
    from mmdet.models.backbones.pvt import PyramidVisionTransformer
    torch.manual_seed(seed)
    ref = PyramidVisionTransformer(num_layers=PVT_T['depths'], drop_path_rate=0., **kwargs)
    ref.init_weights()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p), alpha=noise)
    return ref.double().eval()


def ours_from(ref, mmdet_eps=True, **kwargs):
    """Our InLinePVT, softmax in every stage and PVT-T's heads, loaded with ``ref``'s weights."""
    ours = InLinePVT(arch=PVT_T, attn_type='SSSS', drop_path_rate=0., **kwargs).double().eval()
    ours.load_state_dict(mmdet_pvt_to_ours(ref.state_dict(), PVT_T['depths']), strict=True)
    if mmdet_eps:  # mmdet's norm_cfg (eps 1e-6) in the patch-embedding and reduction norms too
        for m in ours.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.eps = 1e-6
    return ours


def image(hw, seed=1):
    return torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(seed), dtype=D64)


@pytest.fixture(scope='module')
def pair():
    ref = mmdet_pvt_t()
    return ref, ours_from(ref)


@pytest.fixture(scope='module')
def outputs(pair):
    """{size: (mmdet's stage outputs, ours)} for the two sizes, computed once."""
    ref, ours = pair
    out = {}
    with torch.no_grad():
        for hw in (EXACT, DETECTION):
            x = image(hw)
            out[hw] = ref(x), ours(x)
    return out


def assert_stages_close(got, expected, rel):
    """Each stage within ``rel`` x (its largest |value|), elementwise."""
    assert len(got) == len(expected) == 4
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        scale = b.abs().max().item()
        err = (a - b).abs().max().item()
        assert err <= rel * scale, (f'stage {i + 1}: max |ours - mmdet| = {err:.3g}, '
                                    f'{err / scale:.2g} of max |mmdet| {scale:.3g} (tol {rel:.0e})')


# ----------------------------------------------------------------------------- same weights
def test_mapping_uses_every_key_of_both_models(pair):
    ref, ours = pair
    mapped = mmdet_pvt_to_ours(ref.state_dict(), PVT_T['depths'])
    assert set(mapped) == set(ours.state_dict())
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in ours.parameters())


@pytest.mark.parametrize('hw', [EXACT, DETECTION],
                         ids=lambda s: f'{s[0]}x{s[1]}')
def test_stage_outputs_equal_mmdets(outputs, hw):
    """Patch embedding (conv + LayerNorm, floored maps), position tables (bilinear, align_corners
    False), spatial-reduction softmax attention, MLP and the four NCHW stage outputs without output
    norms: mmdet's function to float64 rounding."""
    expected, got = outputs[hw]
    floored = [(hw[0] // s, hw[1] // s) for s in (4, 8, 16, 32)]
    assert [tuple(t.shape[-2:]) for t in expected] == floored
    assert_stages_close(got, expected, TIGHT)


def test_our_default_eps_is_the_only_difference(pair, outputs):
    """With our default eps 1e-5 (the authors') in the patch-embedding and reduction norms the
    outputs differ from mmdet's far above both tolerances, and by no more than that eps explains."""
    ref, _ = pair
    ours = ours_from(ref, mmdet_eps=False)
    expected, _ = outputs[EXACT]
    with torch.no_grad():
        got = ours(image(EXACT))
    with pytest.raises(AssertionError):
        assert_stages_close(got, expected, 3 * FLOAT32_TABLES)
    assert_stages_close(got, expected, 1e-4)


def test_training_steps_from_the_same_weights_stay_equal():
    """Same function, same gradients: two AdamW steps (train mode, no drop path) of both models
    keep the mapped weights equal (at the size the tables are learned at, so no resize is involved):
    fused or split q|k|v, 1x1 convolutions or Linears do not change the optimisation."""
    ref = mmdet_pvt_t(pretrain_img_size=64)
    ours = ours_from(ref, pretrain_img_size=64)
    start = {k: v.clone() for k, v in ours.state_dict().items()}
    ref.train()
    ours.train()
    x = image((64, 64), seed=2)
    with torch.no_grad():
        targets = [torch.randn_like(t) for t in ref(x)]
    for model in (ref, ours):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
        for _ in range(2):
            opt.zero_grad()
            sum(((o - t) ** 2).mean() for o, t in zip(model(x), targets)).backward()
            opt.step()
    mapped = mmdet_pvt_to_ours(ref.state_dict(), PVT_T['depths'])
    for k, v in ours.state_dict().items():
        assert (v - start[k]).abs().max() > 1e-3, f'{k} did not move'  # each step moves ~lr
        # Adam divides by sqrt(v) + 1e-8: where a gradient is rounding noise (the key bias, whose
        # gradient is exactly zero under softmax) the two steps differ by ~1e-11; 1e-9 = 1e-6 x lr
        assert torch.allclose(v, mapped[k], rtol=1e-9, atol=1e-9), k


# ----------------------------------------------------------------------------- from scratch
def _role(key):
    """Our parameter name -> (role, 0-based stage) for the init table of docs/design.md."""
    stage = int(next(ch for ch in key if ch.isdigit())) - 1
    if key.endswith('bias') or any(n.startswith('norm') for n in key.split('.')[:-1]):
        return 'bias or norm', stage
    for role in ('patch_embed', 'pos_embed', 'attn.q.', 'attn.kv.', 'attn.proj.', 'attn.sr.',
                 'mlp.fc1.', 'mlp.fc2.'):
        if role in key:
            return role.strip('.'), stage
    raise KeyError(key)


def mmdet_init_std(role, stage):
    """The std of mmdet's PVT-T weights from scratch, as docs/design.md states it: convolutions
    (the patch embeddings, the reductions, and the MLPs, 1x1 convolutions there) normal with std
    sqrt(2 / fan_out), fan_out = kernel area x out channels; q|k|v xavier-uniform over torch's
    fused (3C, C) ``in_proj``, std sqrt(2 / (C + 3C)); output projections and position tables 0.02.
    """
    c, r = PVT_T['embed_dims'][stage], PVT_T['mlp_ratio'][stage]
    return {'patch_embed': math.sqrt(2 / ((4 if stage == 0 else 2) ** 2 * c)),
            'attn.sr': math.sqrt(2 / ((8, 4, 2, 1)[stage] ** 2 * c)),
            'attn.q': math.sqrt(2 / (4 * c)), 'attn.kv': math.sqrt(2 / (4 * c)),
            'mlp.fc1': math.sqrt(2 / (r * c)), 'mlp.fc2': math.sqrt(2 / c),
            'attn.proj': .02, 'pos_embed': .02}[role]


def _inits(**kwargs):
    """(mmdet's PVT-T from scratch mapped to our names, our InLinePVT from scratch), float32."""
    from mmdet.models.backbones.pvt import PyramidVisionTransformer
    torch.manual_seed(0)
    ref = PyramidVisionTransformer(num_layers=PVT_T['depths'])
    ref.init_weights()
    torch.manual_seed(0)
    ours = InLinePVT(arch=PVT_T, attn_type='SSSS', **kwargs)
    ours.init_weights()
    return mmdet_pvt_to_ours(ref.state_dict(), PVT_T['depths']), ours.state_dict()


def test_mmdets_from_scratch_init_is_as_documented():
    """mmdet's PVT-T ``init_weights()`` without a checkpoint against the table of docs/design.md,
    and our default init beside it (every weight trunc-normal 0.02): the two scaffolds compute the
    same function but start learning from different weights."""
    theirs, ours = _inits()
    for key, v in ours.items():
        role, stage = _role(key)
        if role == 'bias or norm':  # biases 0, LayerNorm weights 1, in both
            assert torch.equal(theirs[key], v), key
            continue
        want = mmdet_init_std(role, stage)
        got = theirs[key].std().item()
        assert abs(got / want - 1) < 0.05, (key, got, want)
        assert abs(v.std().item() / .02 - 1) < 0.05, (key, v.std().item())


def test_mmdet_init_scheme_starts_from_mmdets_distribution():
    """The option for the from-scratch study: every tensor drawn as mmdet's PVT draws it (same
    std within sampling error; uniform q|k|v, normal elsewhere: mean |w| / std 0.866 vs 0.798)."""
    theirs, ours = _inits(init_scheme='mmdet_pvt')
    for key, v in ours.items():
        t = theirs[key]
        if _role(key)[0] == 'bias or norm':
            assert torch.equal(t, v), key
            continue
        assert abs(v.std().item() / t.std().item() - 1) < 0.05, (key, v.std(), t.std())
        shape_ours, shape_theirs = (w.abs().mean().item() / w.std().item() for w in (v, t))
        assert abs(shape_ours - shape_theirs) < 0.03, (key, shape_ours, shape_theirs)


def test_authors_init_scheme_keeps_torchs_conv_init():
    """The authors' InLine-PVT code initialises its Linears (trunc-normal 0.02, biases 0) and
    LayerNorms only; its convolutions - the patch embeddings and InLine's local residual - keep
    torch's default: weights and biases uniform within 1 / sqrt(fan_in). (Under our default, 0.02
    and zero biases, the local residual starts about a thousand times weaker: docs/design.md.)"""
    torch.manual_seed(0)
    model = InLinePVT(arch='tiny', init_scheme='authors')
    model.init_weights()
    convs = [m for m in model.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d))]
    assert len(convs) == 4 + 2 * sum(model.depths)  # patch embeddings, residual.0 and residual.2
    for m in convs:
        bound = 1 / math.sqrt(m.weight[0].numel())  # fan_in = in channels / groups x kernel area
        for p in (m.weight, m.bias):
            assert p.abs().max().item() <= bound
            tol = 0.05 if p.numel() >= 4096 else 0.3  # std of a uniform sample of that size
            assert abs(p.std().item() / (bound / math.sqrt(3)) - 1) < tol
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            assert abs(m.weight.std().item() / .02 - 1) < 0.05 and not m.bias.any()
