"""One API for every attention module (docs/design.md section 1.6): the shared constructor
vocabulary, the same three methods, a backbone's ``attn_cfg`` reaching the module of every block
(Swin's window blocks included), and MALA's ``beta=`` / ``gamma=`` keywords refused with the
spelling to use instead.

Expected values are typed here from the design (the vocabulary, the defaults), computed from the
papers' widths and depths (how many parameters the biases hold) or recomputed from the module's
weights with formulas written here (Swin's relative position bias, a tempered softmax core)."""
import inspect

import pytest
import torch

from mmlinattn.core.models import InLinePVT, InLineSwin, MAViT
from mmlinattn.core.models.layers import QKVOAttention, TokenAttention, WindowSoftmaxAttention
from mmlinattn.core.ops.cores import Core, register_core, unregister_core

MODULES = (TokenAttention, QKVOAttention, WindowSoftmaxAttention)
# the shared keywords and their defaults, as docs/design.md section 1.6 lists them
SHARED = {'qkv_bias': True, 'kernel': None, 'attn_drop': 0., 'proj_drop': 0.,
          'core_options': None}
DEFAULT_CORE = {TokenAttention: 'inline', QKVOAttention: 'mala',
                WindowSoftmaxAttention: 'softmax'}
OWN = {TokenAttention: {'qkv_layout', 'local_residual', 'sr_ratio', 'norm_eps'},
       QKVOAttention: {'use_rope'}, WindowSoftmaxAttention: {'window_size'}}


# ----------------------------------------------------------------------------- a test core
def tempered_matrix(q, k, scale=None, attn_bias=None, temperature=1.):
    logits = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    logits = logits / temperature
    if attn_bias is not None:
        logits = logits + attn_bias
    return logits.softmax(-1)


def tempered(q, k, v, scale=None, attn_bias=None, temperature=1.):
    return tempered_matrix(q, k, scale, attn_bias, temperature) @ v


@pytest.fixture
def tempered_core():
    """A windowed softmax with one option of its own (``temperature``), to see core_options reach
    window attention."""
    core = register_core(Core('tempered', 'T', tempered, tempered_matrix, bias=True, windowed=True,
                              options=('temperature',)))
    yield core
    unregister_core('tempered')


def swin_bias(table, ws):
    """Swin's relative position bias, (h, ws*ws, ws*ws): the table row of the offset (dr, dc) is
    (dr + ws - 1) * (2 ws - 1) + (dc + ws - 1)."""
    n = ws * ws
    out = torch.empty(table.shape[1], n, n, dtype=table.dtype)
    for i in range(n):
        for j in range(n):
            dr, dc = i // ws - j // ws, i % ws - j % ws
            out[:, i, j] = table[(dr + ws - 1) * (2 * ws - 1) + (dc + ws - 1)]
    return out


# ----------------------------------------------------------------------------- the vocabulary
@pytest.mark.parametrize('cls', MODULES)
def test_every_module_has_the_shared_signature(cls):
    """(dim, num_heads) by position, then core, the shared keywords and the module's own, all by
    keyword; the same defaults in every module."""
    params = inspect.signature(cls.__init__).parameters
    assert list(params)[:3] == ['self', 'dim', 'num_heads']
    assert all(params[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
               for p in ('dim', 'num_heads'))
    rest = {n: p for n, p in params.items() if n not in ('self', 'dim', 'num_heads')}
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in rest.values()), rest
    assert set(rest) == {'core', *SHARED, *OWN[cls]}
    assert rest['core'].default == DEFAULT_CORE[cls]
    assert {n: rest[n].default for n in SHARED} == SHARED
    with pytest.raises(TypeError):  # e.g. the former WindowSoftmaxAttention(48, 3, 7)
        cls(48, 3, 7)


def _build(cls, **kw):
    if cls is WindowSoftmaxAttention:
        return cls(16, 2, window_size=3, **kw)
    return cls(16, 2, **kw)


def _input(cls):
    """An input and the forward context of each module (a 3 x 4 map; windows of 3 x 3)."""
    if cls is TokenAttention:
        return torch.randn(2, 12, 16), ((3, 4),)
    if cls is QKVOAttention:
        return torch.randn(2, 16, 3, 4), ()
    return torch.randn(2, 2, 9, 16), ((3, 3),)


# the bias parameters of the q / k / v projection of a 16-channel module: q, k, v (and MAViT's
# gate o, which comes out of the same convolution)
BIAS_PARAMS = {TokenAttention: 3 * 16, QKVOAttention: 4 * 16, WindowSoftmaxAttention: 3 * 16}


@pytest.mark.parametrize('cls', MODULES)
def test_every_module_takes_the_shared_keywords(cls):
    """Each shared keyword does what it says in every module: qkv_bias removes exactly the
    projection's biases, proj_drop drops the output, attn_drop the attention weights (softmax
    core), core_options and kernel reach the core."""
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(_build(cls)) - count(_build(cls, qkv_bias=False)) == BIAS_PARAMS[cls]
    x, ctx = _input(cls)
    # proj_drop = 1 zeroes the whole output while training, nothing in eval
    m = _build(cls, proj_drop=1.0)
    assert (m.train()(x, *ctx) == 0).all()
    assert (m.eval()(x, *ctx) != 0).any()
    # attn_drop: two training passes differ (different weights dropped), eval is deterministic;
    # without it training equals eval
    torch.manual_seed(0)
    m = _build(cls, core='softmax', attn_drop=0.5, core_options=dict(beta=False))
    with torch.no_grad():
        a, b = m.train()(x, *ctx), m(x, *ctx)
        assert not torch.allclose(a, b)
        torch.testing.assert_close(m.eval()(x, *ctx), m(x, *ctx))
        m0 = _build(cls, core='softmax')
        m0.load_state_dict(m.state_dict())
        torch.testing.assert_close(m0.train()(x, *ctx), m0.eval()(x, *ctx))
    # a kernel the core lists is taken, one it does not is refused naming both; a core that takes
    # no kernel (softmax) leaves it to the others, so one attn_cfg serves every stage
    if cls is not WindowSoftmaxAttention:
        assert _build(cls, core='linear', kernel='elu').kernel == 'elu'
        with pytest.raises(ValueError, match=r"linear core takes the kernels .*'tanh'"):
            _build(cls, core='linear', kernel='tanh')
    _build(cls, core='softmax', kernel='relu')


def test_core_options_reach_window_attention(tempered_core):
    """WindowSoftmaxAttention hands its core_options to its core (here a temperature); its three
    methods agree with Swin's window attention recomputed from its weights: queries / keys are the
    qkv projection, the matrix is softmax(q k^T s / t + relative position bias + mask), forward is
    proj(A v)."""
    torch.manual_seed(0)
    ws, dim, nh, t = 3, 16, 2, 3.0
    m = WindowSoftmaxAttention(dim, nh, core='tempered', window_size=ws,
                               core_options=dict(temperature=t)).double().eval()
    torch.nn.init.normal_(m.relative_position_bias_table, std=1.)
    x = torch.randn(2, 4, ws * ws, dim, dtype=torch.float64)
    mask = torch.zeros(4, ws * ws, ws * ws, dtype=torch.float64)
    mask[1, :4, 4:] = mask[1, 4:, :4] = -100.
    qkv = (x @ m.qkv.weight.T + m.qkv.bias).reshape(2, 4, ws * ws, 3, nh, dim // nh)
    q, k, v = (qkv[:, :, :, i].transpose(2, 3) for i in range(3))   # (B, nW, h, N, d)
    got_q, got_k = m.queries_keys(x)
    torch.testing.assert_close(got_q, q)
    torch.testing.assert_close(got_k, k)
    bias = swin_bias(m.relative_position_bias_table.detach(), ws)
    want_a = torch.softmax(q @ k.transpose(-2, -1) * (dim // nh) ** -0.5 / t
                           + bias + mask[:, None], -1)
    torch.testing.assert_close(m.attention_matrix(x, (ws, ws), mask), want_a)
    want = m.proj((want_a @ v).transpose(2, 3).reshape(x.shape))
    with torch.no_grad():
        torch.testing.assert_close(m(x, (ws, ws), mask), want)
        plain = WindowSoftmaxAttention(dim, nh, core='tempered', window_size=ws).double().eval()
        plain.load_state_dict(m.state_dict())
        assert not torch.allclose(plain(x, (ws, ws), mask), want)  # the temperature shows


# ----------------------------------------------------------------------------- attn_cfg
def _blocks(model):
    """Every block of a backbone, read from the families' layouts (design.md section 2)."""
    if isinstance(model, InLinePVT):
        return [b for i in range(4) for b in getattr(model, f'block{i + 1}')]
    return [b for stage in model.layers for b in stage.blocks]


# the tiny variants' widths and depths as the papers' tables give them (design.md section 2), and
# the biases per block of their q/k/v projection: 3 per channel (MAViT: 4, its gate's included)
TINY = {InLinePVT: ([64, 128, 320, 512], [2, 2, 2, 2], 3),
        InLineSwin: ([96, 192, 384, 768], [2, 2, 6, 2], 3),
        MAViT: ([64, 128, 256, 512], [2, 2, 6, 2], 4)}


@pytest.mark.parametrize('cls', [InLinePVT, InLineSwin, MAViT])
def test_attn_cfg_reaches_every_blocks_attention_module(cls):
    """The shared keywords in a backbone's attn_cfg reach the attention module of every block of
    every family, Swin's window (softmax) blocks included: qkv_bias=False removes every block's
    projection biases (counted from the widths and depths), and each module keeps the dropouts and
    core options it was given."""
    cfg = dict(qkv_bias=False, attn_drop=0.25, proj_drop=0.5, core_options=dict(beta=False))
    base, model = cls(arch='tiny'), cls(arch='tiny', attn_cfg=cfg)
    widths, depths, per_channel = TINY[cls]
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(base) - count(model) == per_channel * sum(w * d for w, d in zip(widths, depths))
    blocks = _blocks(model)
    assert len(blocks) == sum(depths)
    for blk in blocks:
        attn = blk.attn
        assert attn.attn_drop == 0.25 and attn.proj_drop.p == 0.5, type(attn).__name__
        assert attn.core_options == {'beta': False}
    if cls is InLineSwin:  # tiny is IIIS: the two blocks of stage 4 are window blocks
        window = [b for b in blocks if isinstance(b.attn, WindowSoftmaxAttention)]
        assert window == list(model.layers[3].blocks)
    model.eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 64))
    assert all(torch.isfinite(o).all() for o in outs)


def test_core_options_reach_swins_window_blocks(tempered_core):
    """A core option in InLine-Swin's attn_cfg changes what its window blocks compute (their
    stage-4 output moves with the temperature), and the token blocks' own keyword
    (local_residual) still reaches the token blocks."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, 320, 320)  # stage 4 is 10 x 10: shifted, padded 7-windows
    models = [InLineSwin(arch='tiny', attn_type='IIIT', out_indices=(3,),
                         attn_cfg=dict(local_residual=False, core_options=opts))
              for opts in ({}, dict(temperature=4.0))]
    models[1].load_state_dict(models[0].state_dict())
    for m in models:
        m.eval()
        assert all(b.attn.residual is None for s in m.layers[:3] for b in s.blocks)
    assert [b.attn.core_options for b in models[1].layers[3].blocks] == [{'temperature': 4.0}] * 2
    with torch.no_grad():
        feats = [m(x)[0] for m in models]
        assert not torch.allclose(*feats)


def test_swin_attn_cfg_names_what_its_modules_take():
    """InLine-Swin's attn_cfg is checked against both of its modules: spatial-reduction keys (no
    Swin block reduces keys) are refused by name with the keys it takes."""
    with pytest.raises(ValueError, match=r"InLineSwin: attn_cfg \['norm_eps'\] .*TokenAttention, "
                                         r"WindowSoftmaxAttention.*'qkv_bias'.*'local_residual'"):
        InLineSwin(arch='tiny', attn_cfg=dict(norm_eps=1e-6))


# ----------------------------------------------------------------------------- beta= / gamma=
@pytest.mark.parametrize('key', ['beta', 'gamma'])
def test_beta_and_gamma_keywords_are_refused_naming_core_options(key):
    """QKVOAttention's beta= / gamma= (read with a FutureWarning until 0.2.0) are refused with the
    spelling to use instead; so is a core's option given to any module or in a backbone's attn_cfg
    directly. core_options is the one way."""
    with pytest.raises(TypeError, match=rf'QKVOAttention takes no keyword {key}.*'
                                        rf'core_options=dict\({key}=False\).*removed in 0\.2\.0'):
        QKVOAttention(16, 2, core='mala', **{key: False})
    for cls in (TokenAttention, WindowSoftmaxAttention):
        with pytest.raises(TypeError, match=rf'{cls.__name__} .*core_options=dict\({key}=False\)'):
            cls(16, 2, **{key: False})
    with pytest.raises(ValueError, match=rf"MAViT: attn_cfg \['{key}'\].*"
                                         rf'attn_cfg=dict\(core_options=dict\({key}=False\)\)'):
        MAViT(arch='tiny', attn_cfg={key: False})
    assert QKVOAttention(16, 2, core_options={key: False}).core_options == {key: False}


def test_core_options_that_no_core_takes_are_refused():
    """A misspelt core option would be ignored by every core: refused, naming the options the
    cores take; dropout_p belongs to attn_drop."""
    with pytest.raises(ValueError, match=r"core_options \['bta'\] .*beta \(mala\)"):
        TokenAttention(16, 2, core_options=dict(bta=False))
    with pytest.raises(ValueError, match='attn_drop=0.1'):
        WindowSoftmaxAttention(16, 2, core_options=dict(dropout_p=0.1))
