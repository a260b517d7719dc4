"""The table of attention cores: every entry's linear-time function against its own matrix, the
``attn_type`` syntax, and a fifth core added as one table entry plus its function."""
import warnings

import pytest
import torch

from mmlinattn.core.models import InLinePVT, InLineSwin, MAViT
from mmlinattn.core.models.layers import QKVOAttention, TokenAttention
from mmlinattn.core.ops import apply_rope, mala_attention_reference, rope_angles, rope_sin_cos
from mmlinattn.core.ops.cores import (
    CORES,
    Core,
    format_attn_type,
    get_core,
    parse_attn_type,
    register_core,
    unregister_core,
)

from helpers import on_devices


# Every comparison below is float64 against float64 (linear-time form or module against the explicit
# matrix or formula): another order of the sums moves an O(1) result by ~1e-15, far under the
# tolerances (1e-9, or assert_close's float64 default 1e-7) and a wrong formula (1e-2 and up).
def _qkv(n=24, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize('name', list(CORES))
@pytest.mark.parametrize('device', on_devices())
def test_every_core_linear_equals_its_matrix_times_v(name, device):
    """What the modules run (``core(q, k, v)``) is ``A @ v`` with the core's own explicit matrix,
    for every entry of the table, with the RoPE tables passed the way the table says (on CUDA too:
    its kernels, SDPA's among them, in float64)."""
    core = get_core(name)
    q, k, v = (t.to(device) for t in _qkv(n=24, d=8))
    rope = tuple(t.double().to(device)
                 for t in rope_sin_cos((4, 6), rope_angles(8, dtype=torch.float64)))
    for kernel in core.kernels or (None,):
        out = core(q, k, v, scale=0.3, kernel=kernel, rope=rope)
        a = core.attention_matrix(q, k, scale=0.3, kernel=kernel, rope=rope)
        assert a.shape == (2, 3, 24, 24)
        torch.testing.assert_close(out, a @ v, rtol=1e-9, atol=1e-9)


def test_core_entries_state_how_the_papers_use_rope():
    """MALA rotates only its numerator (its z uses un-rotated features: docs/design.md 1.2), softmax
    rotates q and k; InLine and plain linear take no RoPE (their authors use none)."""
    assert get_core('mala').rope == 'inside' and get_core('softmax').rope == 'qk'
    assert get_core('inline').rope == get_core('linear').rope == 'none'
    q, k, v = _qkv(n=12, d=8, seed=1)
    rope = tuple(t.double() for t in rope_sin_cos((3, 4), rope_angles(8, dtype=torch.float64)))
    # softmax with RoPE == softmax of the rotated q and k, written out here
    qr, kr = apply_rope(q, *rope), apply_rope(k, *rope)
    want = torch.softmax(qr @ kr.transpose(-2, -1) * 8 ** -0.5, dim=-1) @ v
    torch.testing.assert_close(get_core('softmax')(q, k, v, rope=rope), want)
    # the RoPE tables do not reach InLine
    torch.testing.assert_close(get_core('inline')(q, k, v, rope=rope), get_core('inline')(q, k, v))


def test_core_rejects_what_it_cannot_take():
    with pytest.raises(ValueError, match="kernels"):
        get_core('inline').kwargs(kernel='sigmoid')
    with pytest.raises(ValueError, match='no attention bias'):
        get_core('mala').kwargs(attn_bias=torch.zeros(1))
    with pytest.raises(ValueError, match="unknown attention core 'nope'"):
        get_core('nope')
    with pytest.raises(ValueError, match='taken by the inline core'):
        register_core(Core('other', 'I', None, None))


# ------------------------------------------------------------------ attn_type
DEPTHS = [2, 2, 6, 2]


def test_attn_type_letters_and_mixed_stages():
    assert parse_attn_type('IIIS', DEPTHS) == [['inline'] * 2, ['inline'] * 2, ['inline'] * 6,
                                               ['softmax'] * 2]
    got = parse_attn_type('MS(I2S)L', DEPTHS)
    assert got[2] == ['inline', 'inline'] + ['softmax'] * 4
    assert got[0] == ['mala'] * 2 and got[3] == ['linear'] * 2
    assert parse_attn_type('II(I1L2S)S', DEPTHS)[2] == \
        ['inline', 'linear', 'linear'] + ['softmax'] * 3
    # a list: letters, names or one name per block
    assert parse_attn_type(['I', 'softmax', ['mala'] * 6, 'L'], DEPTHS)[1] == ['softmax'] * 2
    for cores in (parse_attn_type('MS(I2S)L', DEPTHS), parse_attn_type('IIIS', DEPTHS)):
        assert parse_attn_type(format_attn_type(cores), DEPTHS) == cores


@pytest.mark.parametrize('spec,match', [
    ('IIS', 'one entry per stage'),
    ('IIXS', r'I \(InLine\)'),
    ('II(I2)S', 'has 2 blocks but the stage has 6'),
    ('II(I7S)S', 'has 7 blocks'),
    ('II(IS2)S', 'only the last run'),
    ('II()S', 'cannot read'),
    ('II-S', "cannot read '-'"),
])
def test_attn_type_errors_name_the_problem(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_attn_type(spec, DEPTHS, 'X')


def test_swin_old_mixed_spelling_still_reads_with_a_warning():
    """``IIMS2`` (M = mixed, 2 InLine blocks) was InLine-Swin-B's spelling; M now means MALA."""
    with pytest.warns(FutureWarning, match=r"write 'II\(I2S\)S'"):
        old = InLineSwin(arch='base', attn_type='IIMS2')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        new = InLineSwin(arch='base')  # the arch default is written in the new syntax
    assert [[b.core for b in layer.blocks] for layer in old.layers] == \
        [[b.core for b in layer.blocks] for layer in new.layers]
    assert [b.core for b in new.layers[2].blocks][:3] == ['inline', 'inline', 'softmax']
    # M alone is MALA in InLine-Swin as everywhere; it runs over the whole map like InLine
    m = InLineSwin(arch='tiny', attn_type='IIMS')
    assert {b.core for b in m.layers[2].blocks} == {'mala'} and not m.layers[2].blocks[0].windowed


# ------------------------------------------------------------------ a fifth core
def cosine_attention(q, k, v, scale=None):
    """A_ij = (1 + cos(q_i, k_j)) / sum_m (1 + cos(q_i, k_m)), in linear time."""
    qn, kn = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    num = v.sum(dim=-2, keepdim=True) + qn @ (kn.transpose(-2, -1) @ v)
    den = k.shape[-2] + qn @ kn.sum(dim=-2, keepdim=True).transpose(-2, -1)
    return num / den


def cosine_attention_matrix(q, k, scale=None):
    cos = torch.nn.functional.cosine_similarity(q[..., :, None, :], k[..., None, :, :], dim=-1)
    return (1 + cos) / (1 + cos).sum(dim=-1, keepdim=True)


@pytest.fixture
def cosine_core():
    core = register_core(Core('cosine', 'C', cosine_attention, cosine_attention_matrix,
                              title='cosine'))
    yield core
    unregister_core('cosine')


def test_a_fifth_core_is_one_table_entry(cosine_core):
    """Registering the entry is all it takes: every family accepts its letter, the modules run it,
    and their attention matrices (the analysis tools' input) come from it."""
    q, k, v = _qkv(n=20, d=8, seed=3)
    torch.testing.assert_close(cosine_core(q, k, v), cosine_core.attention_matrix(q, k) @ v)
    torch.manual_seed(0)
    x = torch.randn(1, 3, 64, 64)
    for model in (InLinePVT(arch='tiny', attn_type='CCII'),
                  InLineSwin(arch='tiny', attn_type='C(C1I)IS'),
                  MAViT(arch='tiny', attn_type='CCSS')):
        model.init_weights()
        model.eval()
        with torch.no_grad():
            outs = model(x)
        assert len(outs) == 4 and all(torch.isfinite(o).all() for o in outs)
        mods = [m for m in model.modules() if isinstance(m, (TokenAttention, QKVOAttention))
                and m.core == 'cosine']
        assert mods, type(model).__name__
    # the module's matrix is the new core's, computed from the module's own q and k
    attn = TokenAttention(16, 2, core='cosine').double().eval()
    tokens = torch.randn(1, 12, 16, dtype=torch.float64)
    a = attn.attention_matrix(tokens, (3, 4))
    rows = a.sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))
    assert (a >= 0).all()


def test_unknown_letter_lists_registered_cores(cosine_core):
    with pytest.raises(ValueError, match=r'C \(cosine\)'):
        MAViT(arch='tiny', attn_type='MMSX')


def test_core_options_are_the_one_way_to_set_malas_switches():
    """QKVOAttention takes MALA's beta / gamma in ``core_options`` like every module; its output is
    the paper's reference function (``mala_attention_reference``) on the module's own q, k, v, with
    the same switch. The former ``beta=`` keyword is refused (tests/test_attention_modules.py)."""
    torch.manual_seed(0)
    x = torch.randn(1, 16, 4, 5, dtype=torch.float64)
    ref_mod = QKVOAttention(16, 2, core='mala', use_rope=False).double().eval()
    for opts in (dict(beta=False), dict(gamma=False), dict(beta=False, gamma=False)):
        m = QKVOAttention(16, 2, core='mala', use_rope=False, core_options=opts).double().eval()
        m.load_state_dict(ref_mod.state_dict())
        qkvo = m.qkvo(x)
        q, k, v = (qkvo[:, i * 16:(i + 1) * 16].reshape(1, 2, 8, 20).transpose(-2, -1)
                   for i in range(3))
        core = mala_attention_reference(q, k, v, scale=8 ** -0.5, **opts)
        want = m.proj((core.transpose(-2, -1).reshape(1, 16, 4, 5) + m.lepe(qkvo[:, 32:48]))
                      * qkvo[:, 48:])
        with torch.no_grad():
            torch.testing.assert_close(m(x), want)
        got_q, got_k = m.queries_keys(x)
        torch.testing.assert_close(got_q, q.detach())
        torch.testing.assert_close(got_k, k.detach())
    # a MAViT block passes the backbone's attn_cfg through
    m = MAViT(arch='tiny', attn_cfg=dict(core_options=dict(gamma=False)))
    assert m.layers[0].blocks[0].attn.core_options == {'gamma': False}


def test_modules_keep_their_table_entry_and_expose_queries_and_keys():
    """``core_entry`` is the table's entry; ``queries_keys`` returns the projections of the input
    (computed here from the Linear weights directly)."""
    torch.manual_seed(0)
    attn = TokenAttention(16, 2, core='inline').double().eval()
    assert attn.core_entry is get_core('inline')
    tokens = torch.randn(2, 12, 16, dtype=torch.float64)
    q, k = attn.queries_keys(tokens, (3, 4))
    w, b = attn.qkv.weight, attn.qkv.bias
    want_q = (tokens @ w[:16].T + b[:16]).reshape(2, 12, 2, 8).transpose(1, 2)
    want_k = (tokens @ w[16:32].T + b[16:32]).reshape(2, 12, 2, 8).transpose(1, 2)
    torch.testing.assert_close(q, want_q)
    torch.testing.assert_close(k, want_k)


def test_spatial_reduction_needs_separate_kv_projections():
    """sr_ratio > 1 with one fused qkv Linear would build sr / norm layers that nothing uses (DDP
    fails on parameters without a gradient): refused, naming the layout to use."""
    with pytest.raises(ValueError, match="sr_ratio=2.*qkv_layout='q_kv'"):
        TokenAttention(16, 2, core='softmax', qkv_layout='qkv', sr_ratio=2)
    m = TokenAttention(16, 2, core='softmax', qkv_layout='q_kv', sr_ratio=2)
    out = m(torch.randn(1, 16, 16), (4, 4))
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_windowing_is_its_own_flag(cosine_core):
    """Whether an InLine-Swin block runs a core in shifted windows is the entry's ``windowed`` flag,
    not whether it takes a bias: a biased core that is not windowed runs globally."""
    from dataclasses import replace
    assert get_core('softmax').windowed and not get_core('inline').windowed
    with pytest.raises(ValueError, match='windowed core must take one'):
        Core('bad', 'B', cosine_attention, cosine_attention_matrix, windowed=True)
    soft = get_core('softmax')
    register_core(replace(soft, name='globalsoftmax', letter='G', windowed=False))
    try:
        m = InLineSwin(arch='tiny', attn_type='IIIG')
        blk = m.layers[3].blocks[0]
        assert not blk.windowed and isinstance(blk.attn, TokenAttention)
        blk = InLineSwin(arch='tiny').layers[3].blocks[0]
        assert blk.windowed and not isinstance(blk.attn, TokenAttention)
    finally:
        unregister_core('globalsoftmax')


def test_benchmark_records_the_shapes_the_backbones_give_their_cores():
    """benchmark_attention.py --stages times the cores at the shapes the models hand them, read
    from a forward on the meta device: MAViT-T at 64x64 runs MALA on 16x16 = 256 tokens with 1 head
    of 64 channels, then 8x8 = 64 tokens with 2 heads of 64 (docs/design.md 2.3: dims 64, 128,
    heads 1, 2, stride 4 then 8), each head a strided view of one channels-first projection (the
    tokens are the unit-stride dim), with RoPE tables; then softmax."""
    import importlib.util
    import os.path as osp
    path = osp.join(osp.dirname(__file__), '..', 'tools', 'analysis_tools',
                    'benchmark_attention.py')
    spec = importlib.util.spec_from_file_location('benchmark_attention', path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    calls = bench.stage_calls('mavit', 't', (64, 64), 2)
    mala = [c for c in calls if c['core'] == 'mala']
    assert [c['q'][0] for c in mala] == [(2, 1, 256, 64), (2, 2, 64, 64)]
    assert all(c['q'][1][-2] == 1 and c['rope'] == (c['q'][0][2], 64) for c in mala)
    assert {c['core'] for c in calls} == {'mala', 'softmax'}
    assert bench.parse_model('inline-swin-t@512x512x2') == ('inline_swin', 't', (512, 512), 2)
    with pytest.raises(SystemExit, match='family-arch@HxWxB'):
        bench.parse_model('mavit-q@512x512x2')
