"""The attention math: linear-time forms vs their quadratic references (docs/design.md section
1)."""
import pytest
import torch

from mmlinattn.core.ops import (
    dynamic_depthwise_conv3x3,
    dynamic_depthwise_conv3x3_reference,
    inline_attention,
    inline_attention_matrix,
    inline_attention_reference,
    linear_attention,
    linear_attention_matrix,
    linear_attention_reference,
    mala_attention,
    mala_attention_matrix,
    mala_attention_reference,
    rope_angles,
    rope_sin_cos,
    softmax_attention,
    softmax_attention_matrix,
    softmax_attention_reference,
)

from helpers import on_devices

SHAPES = [(1, 1, 1, 1), (2, 3, 1, 8), (1, 2, 7, 1), (2, 1, 13, 4), (1, 4, 97, 16), (3, 2, 50, 32)]
D64 = dict(dtype=torch.float64)
# The linear-time forms against their quadratic references, chunked against whole, run in float64
# (rand): other orders of the sums put these values (|x| < 15) < 1e-14 apart (measured), far under
# atol 1e-10 (1e-12 for single small formulas) and a wrong term (1e-2 and up). The low-precision
# and the float32 kernel tests state their own bounds.


def rand(shape, scale=1.0):
    return torch.randn(*shape, **D64) * scale


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('kernel', ['identity', 'relu', 'leakyrelu', 'exp'])
def test_inline_linear_equals_quadratic(shape, kernel):
    q, k, v = rand(shape), rand(shape), rand(shape)
    out = inline_attention(q, k, v, kernel=kernel)
    ref = inline_attention_reference(q, k, v, kernel=kernel)
    assert out.shape == shape
    assert torch.allclose(out, ref, rtol=0, atol=1e-10), (out - ref).abs().max()


def test_inline_matches_design_formula_literally():
    """A_ij = s_ij - mean_j s_ij + 1/N written out element by element."""
    q, k, v = rand((1, 1, 5, 3)), rand((1, 1, 5, 3)), rand((1, 1, 5, 3))
    n, scale = 5, 3 ** -0.5
    out = torch.zeros(5, 3, **D64)
    for i in range(n):
        s = [(scale / n) * float(q[0, 0, i] @ k[0, 0, j]) for j in range(n)]
        m = sum(s) / n
        for j in range(n):
            out[i] += (s[j] - m + 1 / n) * v[0, 0, j]
    assert torch.allclose(inline_attention(q, k, v)[0, 0], out, atol=1e-12)


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('beta,gamma', [(True, True), (False, True), (True, False)])
def test_mala_linear_equals_quadratic(shape, beta, gamma):
    q, k, v = rand(shape), rand(shape), rand(shape)
    out = mala_attention(q, k, v, beta=beta, gamma=gamma)
    ref = mala_attention_reference(q, k, v, beta=beta, gamma=gamma)
    assert torch.allclose(out, ref, rtol=0, atol=1e-10), (out - ref).abs().max()


@pytest.mark.parametrize('hw,d', [((1, 1), 4), ((3, 5), 8), ((7, 4), 16)])
def test_mala_with_rope_equals_quadratic(hw, d):
    n = hw[0] * hw[1]
    q, k, v = rand((2, 2, n, d)), rand((2, 2, n, d)), rand((2, 2, n, d))
    rope = rope_sin_cos(hw, rope_angles(d, dtype=torch.float64))
    out = mala_attention(q, k, v, rope=rope)
    ref = mala_attention_reference(q, k, v, rope=rope)
    assert torch.allclose(out, ref, rtol=0, atol=1e-10)
    # RoPE changes the numerator only: without it the result differs
    assert not torch.allclose(out, mala_attention(q, k, v)) or n == 1


def test_mala_matches_paper_form():
    """A_ij = beta_i phi(q_i) phi(k_j)^T - gamma_i with the paper's beta, gamma (phi absorbs
    s/N)."""
    q, k = rand((1, 1, 9, 4)), rand((1, 1, 9, 4))
    n, s = 9, 4 ** -0.5
    phq = (torch.nn.functional.elu(q) + 1) * (s / n) ** 0.5
    phk = (torch.nn.functional.elu(k) + 1) * (s / n) ** 0.5
    dot = phq @ phk.transpose(-2, -1)
    total = dot.sum(-1, keepdim=True)           # phi(q_i) sum_m phi(k_m)^T
    beta, gamma = 1 + 1 / total, total / n
    paper = beta * dot - gamma
    assert torch.allclose(mala_attention_matrix(q, k, eps=0.0), paper, atol=1e-12)


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('kernel', ['relu', 'elu'])
def test_linear_equals_quadratic(shape, kernel):
    q, k, v = rand(shape), rand(shape), rand(shape)
    out = linear_attention(q, k, v, kernel=kernel)
    ref = linear_attention_reference(q, k, v, kernel=kernel)
    assert torch.allclose(out, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize('shape', SHAPES)
def test_softmax_equals_quadratic(shape):
    q, k, v = rand(shape), rand(shape), rand(shape)
    assert torch.allclose(softmax_attention(q, k, v), softmax_attention_reference(q, k, v),
                          rtol=0, atol=1e-10)


@pytest.mark.parametrize('matrix', [
    lambda q, k: inline_attention_matrix(q, k),
    lambda q, k: mala_attention_matrix(q, k, eps=0.0),
    lambda q, k: linear_attention_matrix(q, k, kernel='elu', eps=0.0),
    lambda q, k: softmax_attention_matrix(q, k)])
def test_rows_sum_to_one(matrix):
    q, k = rand((2, 3, 31, 8), 3.0), rand((2, 3, 31, 8), 3.0)
    a = matrix(q, k)
    assert torch.allclose(a.sum(-1), torch.ones_like(a.sum(-1)), atol=1e-10)


def test_inline_and_mala_weights_can_be_negative():
    q, k = rand((1, 1, 64, 8), 3.0), rand((1, 1, 64, 8), 3.0)
    assert (inline_attention_matrix(q, k) < 0).any()
    assert (mala_attention_matrix(q, k) < 0).any()


def test_injectivity_collinear_queries():
    """Plain linear attention gives collinear queries q and 3q the same distribution; InLine not."""
    k = rand((1, 1, 20, 8))
    base = torch.rand(1, 1, 1, 8, **D64) + 0.1  # positive, so ReLU keeps the direction
    q = torch.cat([base, 3 * base], dim=2)
    lin = linear_attention_matrix(q, k, kernel='relu', eps=0.0)
    assert torch.allclose(lin[..., 0, :], lin[..., 1, :], atol=1e-12)
    inl = inline_attention_matrix(q, k)
    assert (inl[..., 0, :] - inl[..., 1, :]).abs().max() > 1e-3


def test_mala_gets_spikier_with_query_magnitude_linear_does_not():
    """Scaling phi(q) by a > 1 raises the ratio between a higher and a lower positive score (MALA
    paper eq. 10-12) and leaves plain linear attention's distribution unchanged."""
    k = rand((1, 1, 16, 8))
    phq = torch.rand(1, 1, 1, 8, **D64) + 0.5   # the wanted phi(q) > 0

    def inv_elu1(p):  # q with elu(q) + 1 == p
        return torch.where(p <= 1, torch.log(p), p - 1)
    q1, q2 = inv_elu1(phq), inv_elu1(3 * phq)
    a1 = mala_attention_matrix(q1, k, eps=0.0)[0, 0, 0]
    a2 = mala_attention_matrix(q2, k, eps=0.0)[0, 0, 0]
    pos = (a1 > 0) & (a2 > 0)
    hi, lo = torch.argmax(torch.where(pos, a1, -1e9)), torch.argmin(torch.where(pos, a1, 1e9))
    assert a2[hi] / a2[lo] > a1[hi] / a1[lo]
    assert a2.max() > a1.max()
    l1 = linear_attention_matrix(q1, k, kernel='elu', eps=0.0)
    l2 = linear_attention_matrix(q2, k, kernel='elu', eps=0.0)
    assert torch.allclose(l1, l2, atol=1e-12)


@pytest.mark.parametrize('fn', [
    lambda q, k, v: inline_attention(q, k, v),
    lambda q, k, v: mala_attention(q, k, v),
    lambda q, k, v: linear_attention(q, k, v, kernel='elu'),
    lambda q, k, v: softmax_attention(q, k, v)])
def test_gradcheck(fn):
    q, k, v = (rand((1, 2, 6, 4)).requires_grad_() for _ in range(3))
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6)


def test_local_residual_equals_neighbourhood_sum():
    x = rand((2, 5, 7, 6))
    w = rand((2, 5 * 9))
    out = dynamic_depthwise_conv3x3(x, w)
    ref = dynamic_depthwise_conv3x3_reference(x, w)
    assert torch.allclose(out, ref, atol=1e-12)
    # one pixel by hand: channel 3 of sample 1 at (0, 0) sees only the bottom-right 2x2 of its
    # kernel
    kern = w[1, 27:36].reshape(3, 3)
    manual = (kern[1:, 1:] * x[1, 3, :2, :2]).sum()
    assert torch.allclose(out[1, 3, 0, 0], manual)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('name', ['inline', 'mala', 'linear'])
@pytest.mark.parametrize('device', on_devices())
def test_low_precision_matches_float64(device, dtype, name):
    """Large inputs (|x| up to 50) under autocast and as half tensors: the d x d state and the
    normalisers are accumulated in float32, so the result is within 2 % (relative L2) of float64
    (a bound of the half type's rounding, so CUDA's too)."""
    fn = dict(inline=inline_attention, mala=mala_attention,
              linear=lambda q, k, v: linear_attention(q, k, v, kernel='elu'))[name]
    q, k, v = (torch.empty(1, 2, 512, 32).uniform_(-50, 50).to(device) for _ in range(3))
    ref = fn(q.double(), k.double(), v.double())
    try:
        with torch.autocast(device, dtype=dtype):
            pass
    except RuntimeError as e:  # torch 2.1's CPU autocast takes bfloat16 only
        pytest.skip(f'{device} autocast to {dtype}: {e}')
    with torch.autocast(device, dtype=dtype):
        out = fn(q, k, v)
    out_h = fn(q.to(dtype), k.to(dtype), v.to(dtype))
    assert out_h.dtype == dtype
    for o in (out, out_h):
        assert torch.isfinite(o).all()
        rel = (o.double() - ref).norm() / ref.norm()
        assert rel < 2e-2, rel


def test_mala_normaliser_near_zero_stays_finite():
    """Very negative q, k drive phi towards 0 and z towards 0: 1/z must stay finite."""
    q = torch.full((1, 1, 64, 32), -50.0)
    k = torch.full((1, 1, 64, 32), -50.0)
    v = torch.randn(1, 1, 64, 32)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        out = mala_attention(q.to(dtype), k.to(dtype), v.to(dtype))
        assert torch.isfinite(out).all()


def test_bad_shapes_are_reported():
    with pytest.raises(ValueError, match='B, h, N, d'):
        inline_attention(torch.randn(3, 4, 5), torch.randn(3, 4, 5), torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match='disagree'):
        mala_attention(torch.randn(1, 2, 5, 4), torch.randn(1, 3, 5, 4), torch.randn(1, 3, 5, 4))
    with pytest.raises(ValueError, match='unknown attention kernel'):
        inline_attention(*(torch.randn(1, 1, 3, 4) for _ in range(3)), kernel='gelu')
    with pytest.raises(ValueError, match='divisible by 4'):
        rope_angles(6)


@pytest.mark.parametrize('grad', [False, True])
def test_chunked_inference_path_equals_reference(monkeypatch, grad):
    """Without autograd the ops stream over N in chunks (and work in place): same results."""
    from mmlinattn.core.ops import attention
    monkeypatch.setattr(attention, 'CHUNK_TOKENS', 7)
    hw, d = (5, 6), 8
    q, k, v = (rand((2, 3, 30, d)).requires_grad_(grad) for _ in range(3))
    rope = rope_sin_cos(hw, rope_angles(d, dtype=torch.float64))
    with torch.set_grad_enabled(grad):
        pairs = [
            (inline_attention(q, k, v), inline_attention_reference(q, k, v)),
            (mala_attention(q, k, v), mala_attention_reference(q, k, v)),
            (mala_attention(q, k, v, rope=rope), mala_attention_reference(q, k, v, rope=rope)),
            (mala_attention(q, k, v, beta=False), mala_attention_reference(q, k, v, beta=False)),
            (linear_attention(q, k, v, kernel='elu'),
             linear_attention_reference(q, k, v, kernel='elu')),
        ]
    for out, ref in pairs:
        assert torch.allclose(out, ref, rtol=0, atol=1e-10)
    q0 = q.detach().clone()
    if not grad:  # the in-place passes must not touch the inputs
        mala_attention(q, k, v)
        assert torch.equal(q, q0)


def test_a_jit_traced_core_runs_at_other_lengths(monkeypatch):
    """torch.jit.trace (the legacy ONNX exporter's tracer, mmdeploy's route) records the cores
    without the chunk loop: a graph traced at 30 tokens (chunks of 7) gives the float64 reference
    at 45 tokens too, where an unrolled loop would still cut the example's five chunks."""
    from mmlinattn.core.ops import attention
    monkeypatch.setattr(attention, 'CHUNK_TOKENS', 7)
    fns = {'inline': (inline_attention, inline_attention_reference),
           'mala': (mala_attention, mala_attention_reference),
           'linear': (lambda q, k, v: linear_attention(q, k, v, kernel='elu'),
                      lambda q, k, v: linear_attention_reference(q, k, v, kernel='elu'))}
    for name, (fn, ref) in fns.items():
        example = [rand((1, 2, 30, 8)) for _ in range(3)]
        with torch.no_grad():
            traced = torch.jit.trace(fn, example, check_trace=False)
            other = [rand((1, 2, 45, 8)) for _ in range(3)]
            # the traced graph holds the scale s / N as a float32 scalar: float32 rounding
            assert torch.allclose(traced(*other), ref(*other), rtol=1e-6, atol=1e-6), name


def test_eager_kernels_match_torchs_own_exp_and_elu():
    """The eager inference path computes exp as exp2 (faster on CPU) and ELU + 1 in scratch
    buffers: torch.exp and F.elu are the oracle, in float64 and to float32 rounding."""
    import torch.nn.functional as F

    from mmlinattn.core.ops.kernels import KERNELS, elu_plus_one, elu_plus_one_into, exp_
    x64 = torch.cat([torch.linspace(-80, 20, 20001, **D64), rand((1000,), 5.0)])
    # elementwise, no sums (no thread or order dependence): float32's error is the rounding of
    # t * log2(e) (up to 4e-6 at t = -80, the same on every CPU) plus exp2's 1 ulp (1.2e-7)
    for dtype, rtol in ((torch.float64, 1e-13), (torch.float32, 5e-6)):
        x = x64.to(dtype)
        x64 = x.double()  # the oracle sees the same (rounded) inputs
        assert torch.allclose(exp_(x.clone(), 0.2), torch.exp(0.2 * x64).to(dtype), rtol=rtol,
                              atol=0)
        with torch.inference_mode():
            x0 = x.clone()
            outs = [elu_plus_one(x), KERNELS['exp'](x),
                    elu_plus_one_into(x, torch.empty_like(x), torch.empty_like(x))]
            assert torch.equal(x, x0)  # the input is left alone
        ref = torch.where(x64 > 0, x64 + 1, torch.exp(x64))  # the definition of ELU + 1
        assert torch.allclose(ref, F.elu(x64) + 1, rtol=0, atol=1e-14)
        for out in (outs[0], outs[2]):
            assert torch.allclose(out, ref.to(dtype), rtol=rtol, atol=0)
        assert torch.allclose(outs[1], torch.exp(0.2 * x64).to(dtype), rtol=rtol, atol=0)


def test_mala_eager_inference_takes_exp2_and_a_trace_keeps_exp():
    """Without autograd, MALA's eager forward computes phi's exp as exp2 (faster on CPU); a jit
    trace (what the FLOP counter and the exporters see) keeps plain exp and the three products
    K'^T V, phi(Q) w and phi~(Q) kv."""
    q, k, v = (torch.randn(1, 2, 64, 8) for _ in range(3))
    with torch.inference_mode():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            mala_attention(q, k, v)
    names = {e.name for e in prof.events()}
    assert 'aten::exp2_' in names and not names & {'aten::exp', 'aten::exp_'}, sorted(names)
    graph = torch.jit.trace(lambda a, b, c: mala_attention(a, b, c), (q, k, v),
                            check_trace=False).graph
    kinds = [n.kind() for n in graph.nodes()]
    assert sum(kind == 'aten::matmul' for kind in kinds) == 3
    assert any(kind.startswith('aten::exp') and 'exp2' not in kind for kind in kinds), kinds
    assert not any('exp2' in kind for kind in kinds), kinds


def _sdpa_kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith('aten::_scaled_dot_product')}


def test_softmax_stages_run_sdpas_fused_kernel():
    """MAViT's softmax stages (heads cut out of one channels-first projection: a strided last dim)
    and Swin's windows (5-D, (B, nW, h, N, d)) reach SDPA's fused flash kernel, in training and in
    inference, instead of its math path, which materialises every head's N x N matrix. Which kernel
    ran is read from the profiler's op names (torch's own). Swin's training step stays on the math
    path: the fused CPU kernel computes no gradient for the learned relative position bias."""
    from mmlinattn.core.models.layers import QKVOAttention, RoPE, WindowSoftmaxAttention
    # the fused CPU kernel's name: its own op since torch 2.2, the generic flash op on 2.1
    cpu_op = '_scaled_dot_product_flash_attention_for_cpu'
    flash = 'aten::' + (cpu_op if hasattr(torch.ops.aten, cpu_op)
                        else '_scaled_dot_product_flash_attention')
    math = 'aten::_scaled_dot_product_attention_math'
    m = QKVOAttention(64, 2, core='softmax')
    rope = RoPE(64, 2)((6, 7))
    x = torch.randn(2, 64, 6, 7, requires_grad=True)
    with torch.no_grad():
        got = _sdpa_kernels(lambda: m(x, rope))
    assert flash in got and math not in got, got
    got = _sdpa_kernels(lambda: m(x, rope).sum().backward())
    assert flash in got and flash + '_backward' in got and math not in got, got
    w = WindowSoftmaxAttention(48, 3, window_size=7)
    windows = torch.randn(2, 4, 49, 48)
    # Swin's windows always carry the relative position bias: an attention mask, which the fused
    # CPU kernel takes from torch 2.3 on (its schema names attn_mask); before, SDPA's math path
    op = getattr(torch.ops.aten, cpu_op, None)
    takes_mask = op is not None and 'attn_mask' in str(op.default._schema)
    for mask in (None, torch.zeros(4, 49, 49)):
        with torch.no_grad():
            got = _sdpa_kernels(lambda: w(windows, (7, 7), mask))
        assert (flash in got and math not in got) if takes_mask else math in got, got


@pytest.mark.parametrize('with_mask', [False, True])
def test_window_softmax_layout_keeps_the_math(with_mask):
    """Folding Swin's windows into the heads for the fused kernel gives the reference's result:
    softmax(q k^T s + bias) v per window, the bias (and shift mask) broadcast over the images."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 3, 9, 8, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(3, 9, 9, dtype=torch.float64)
    if with_mask:
        bias = bias[None] + torch.randn(4, 1, 9, 9, dtype=torch.float64)
    want = torch.softmax(q @ k.transpose(-2, -1) * 8 ** -0.5 + bias, -1) @ v
    torch.testing.assert_close(softmax_attention(q, k, v, attn_bias=bias), want)


@pytest.mark.parametrize('nq,nk', [(30, 12), (12, 30)])
@pytest.mark.parametrize('grad', [False, True])
@pytest.mark.parametrize('chunk', [7, 4096])
def test_keys_and_queries_of_different_lengths(monkeypatch, nq, nk, grad, chunk):
    """The linear-time cores take keys / values of another length than the queries (the shape
    check allows it): the means run over the keys, as in the quadratic matrices, on every path
    (autograd Functions, chunked in-place inference with its scratch buffers)."""
    from mmlinattn.core.ops import attention
    monkeypatch.setattr(attention, 'CHUNK_TOKENS', chunk)
    d = 8
    q = rand((2, 3, nq, d)).requires_grad_(grad)
    k, v = rand((2, 3, nk, d)).requires_grad_(grad), rand((2, 3, nk, 5)).requires_grad_(grad)
    cases = [(inline_attention, inline_attention_reference, dict(kernel=kern))
             for kern in ('identity', 'elu', 'exp')]
    cases += [(mala_attention, mala_attention_reference, dict(beta=b, gamma=g))
              for b, g in ((True, True), (False, True), (True, False))]
    cases += [(linear_attention, linear_attention_reference, dict(kernel='elu'))]
    for fn, ref, kw in cases:
        out = fn(q, k, v, **kw)
        want = ref(q, k, v, **kw)
        assert out.shape == (2, 3, nq, 5)
        torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10, msg=f'{fn.__name__} {kw}')
        if grad:
            g = torch.randn_like(want)
            got = torch.autograd.grad(out, (q, k, v), g)
            exp = torch.autograd.grad(want, (q, k, v), g)
            for a, b in zip(got, exp):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9,
                                           msg=f'{fn.__name__} {kw} grad')


def test_mala_rope_needs_queries_and_keys_at_the_same_positions():
    rope = rope_sin_cos((3, 4), rope_angles(8, dtype=torch.float64))
    q, k, v = rand((1, 2, 12, 8)), rand((1, 2, 6, 8)), rand((1, 2, 6, 8))
    for fn in (mala_attention, mala_attention_reference):
        with pytest.raises(ValueError, match='q has 12 tokens and k 6'):
            fn(q, k, v, rope=rope)


# ------------------------------------------------------------------ chunk length by device
@pytest.fixture
def chunk_settings(monkeypatch):
    """set_chunk_tokens' choices for this test only."""
    from mmlinattn.core.ops import attention
    monkeypatch.setattr(attention, '_CHUNK_SET', {})
    return attention


def test_chunk_length_by_device_type(chunk_settings):
    """The CPU chunks at 4096 tokens (a cache optimisation), any other device runs the whole
    sequence (None) by default; set_chunk_tokens chooses per device type and puts it back."""
    from mmlinattn.core.ops import CHUNK_TOKENS, chunk_tokens, set_chunk_tokens
    assert CHUNK_TOKENS == 4096
    assert chunk_tokens() == chunk_tokens('cpu') == chunk_tokens(torch.zeros(1)) == 4096
    for where in ('cuda', 'cuda:1', torch.device('cuda', 0), torch.zeros(1, device='meta')):
        assert chunk_tokens(where) is None
    assert set_chunk_tokens('cuda', 8192) is None
    assert chunk_tokens('cuda:3') == 8192 and chunk_tokens('cpu') == 4096
    assert set_chunk_tokens('cpu', None) == 4096 and chunk_tokens('cpu') is None
    assert set_chunk_tokens('cuda') == 8192 and chunk_tokens('cuda') is None  # the default again
    set_chunk_tokens('cpu')
    assert chunk_tokens('cpu') == 4096
    for bad in (0, -5, 2.5, True, '64'):
        with pytest.raises(ValueError, match='positive number of tokens, or None'):
            set_chunk_tokens('cuda', bad)


def _products(fn, *args) -> int:
    """How many batched products ``fn(*args)`` runs (one per chunk of each pass)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(*args)
    return sum(e.name in ('aten::bmm', 'aten::baddbmm') for e in prof.events())


def test_chunk_length_follows_the_tensors_device(chunk_settings):
    """The chunk length is a function of the inputs' device type: 10,000 tokens run in chunks of
    4096 on the CPU and in one piece on another device (the meta device stands for CUDA: its
    tensors have a device type but no arithmetic, and autocast does not take it, so only the
    choice is checked there), unless set_chunk_tokens says otherwise; on the CPU the chunks are
    what runs: MALA without autograd makes one product per chunk in its key pass and two in its
    query pass."""
    from mmlinattn.core.ops import attention, set_chunk_tokens
    n = 10000
    cpu = [torch.randn(1, 1, n, 4) for _ in range(3)]
    meta = [t.to('meta') for t in cpu]
    with torch.inference_mode():
        assert attention._step(*cpu) == 4096 and attention._step(*meta) == n
        assert _products(mala_attention, *cpu) == 3 * 3
        set_chunk_tokens('meta', 2048)
        set_chunk_tokens('cpu', None)
        assert attention._step(*cpu) == n and attention._step(*meta) == 2048
        assert _products(mala_attention, *cpu) == 3
    # with autograd the sequence is whole whatever the setting (the Functions' forward chunks)
    assert attention._step(*(t.requires_grad_() for t in meta)) == n


def _chunking_cases(device='cpu'):
    rope = rope_sin_cos((5, 6), rope_angles(8, dtype=torch.float64, device=device))
    return {
        'inline': lambda q, k, v: inline_attention(q, k, v),
        'inline-exp': lambda q, k, v: inline_attention(q, k, v, kernel='exp', scale=0.4),
        'mala': lambda q, k, v: mala_attention(q, k, v),
        'mala-rope': lambda q, k, v: mala_attention(q, k, v, rope=rope),
        'mala-no-beta': lambda q, k, v: mala_attention(q, k, v, beta=False),
        'linear': lambda q, k, v: linear_attention(q, k, v, kernel='elu'),
    }


@pytest.mark.parametrize('case', list(_chunking_cases()))
@pytest.mark.parametrize('device', on_devices())
def test_chunked_and_whole_sequence_agree(chunk_settings, device, case):
    """Every core that chunks gives the same output and gradients whether the sequence runs in
    chunks (7 tokens: the CPU's choice) or in one piece (CUDA's default), float64, to 1e-10, on
    each device."""
    from mmlinattn.core.ops import set_chunk_tokens
    fn = _chunking_cases(device)[case]
    qkv = [rand((2, 3, 30, 8)).to(device) for _ in range(3)]
    g = rand((2, 3, 30, 8)).to(device)
    results = []
    for tokens in (7, None):
        set_chunk_tokens(device, tokens)
        with torch.inference_mode():
            inference = fn(*qkv)
        xs = [t.clone().requires_grad_(True) for t in qkv]
        out = fn(*xs)
        results.append([inference, out.detach(), *torch.autograd.grad(out, xs, g)])
    for chunked, whole in zip(*results):
        torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-10)
    # and both are the quadratic reference's (the oracle)
    ref = {'inline': inline_attention_reference, 'mala': mala_attention_reference}.get(case)
    if ref is not None:
        torch.testing.assert_close(results[0][0], ref(*qkv), rtol=0, atol=1e-10)


# ------------------------------------------------------------------ MALA's scratch and rotation
def _allocated_bytes(fn) -> int:
    """Bytes ``fn()`` allocates in all (the profiler's memory events, frees not subtracted)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        fn()
    return sum(e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0)


@pytest.mark.parametrize('with_rope', [False, True])
def test_mala_inference_reuses_its_scratch_from_call_to_call(chunk_settings, with_rope):
    """MALA's scratch buffers for phi(K) and phi(Q) (and their rotated copies) are the thread's
    CPU workspace, kept between calls: a repeated call allocates its output and the small states
    only, not the 2 x (chunk x d) of buffers whose fresh pages cost ~600 page faults a call at
    4096 tokens (the issue-58 slowdown). Exactly one chunk (N = the chunk length), the edge where
    a call's chunk is the whole sequence."""
    from mmlinattn.core.ops import set_chunk_tokens
    set_chunk_tokens('cpu', 256)
    q, k, v = (torch.randn(2, 2, 256, 16) for _ in range(3))
    rope = rope_sin_cos((16, 16), rope_angles(16)) if with_rope else None
    with torch.inference_mode():
        mala_attention(q, k, v, rope=rope)  # the first call may grow the workspace
        out_bytes = q.numel() * q.element_size()
        extra = _allocated_bytes(lambda: mala_attention(q, k, v, rope=rope)) - out_bytes
    # beside the 64 kB output: z (N x 1) twice, the d x d states twice and some d-vectors, ~20 kB
    # here; the scratch is 128 kB
    assert 0 <= extra < out_bytes // 2, extra


def test_mala_scratch_never_leaks_into_results(chunk_settings):
    """Outputs do not alias the reused workspace: results of earlier calls (other shapes, chunked
    and whole, under inference mode and under no_grad, with and without RoPE) stay equal to the
    float64 reference after later calls, and a workspace made in inference mode serves no_grad
    calls (in-place writes into an inference tensor outside the mode would raise)."""
    from mmlinattn.core.ops import set_chunk_tokens
    set_chunk_tokens('cpu', 30)
    cases = []
    for n, hw, mode in ((30, (5, 6), torch.inference_mode), (12, (3, 4), torch.no_grad),
                        (45, (5, 9), torch.no_grad), (30, (6, 5), torch.inference_mode)):
        q, k, v = (rand((2, 3, n, 8)) for _ in range(3))
        rope = rope_sin_cos(hw, rope_angles(8, dtype=torch.float64))
        with mode():
            cases.append((mala_attention(q, k, v), (q, k, v, None)))
            cases.append((mala_attention(q, k, v, rope=rope), (q, k, v, rope)))
    for out, (q, k, v, rope) in cases:
        torch.testing.assert_close(out, mala_attention_reference(q, k, v, rope=rope), rtol=0,
                                   atol=1e-10)


def test_mala_rotation_builds_no_interleaved_copy():
    """MALA's eager inference with RoPE rotates phi pair-wise into its scratch: no torch.stack /
    cat interleaving a rotated copy (element by element, the slowest pass of the old query pass);
    the result is the float64 reference's (the quadratic form with kernels.apply_rope)."""
    q, k, v = (rand((1, 2, 20, 8)) for _ in range(3))
    rope = rope_sin_cos((4, 5), rope_angles(8, dtype=torch.float64))
    with torch.inference_mode():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = mala_attention(q, k, v, rope=rope)
    names = {e.name for e in prof.events()}
    assert not names & {'aten::cat', 'aten::stack', 'aten::neg'}, names
    torch.testing.assert_close(out, mala_attention_reference(q, k, v, rope=rope), rtol=0,
                               atol=1e-10)


@pytest.mark.parametrize('chunk', [7, None])
def test_mala_in_mavits_layout_equals_reference(chunk_settings, chunk):
    """q, k, v as MAViT's module hands them - per-head views of one channels-first projection,
    the tokens as the unit-stride dim - take the path that keeps phi, its rotation and the RoPE
    tables in that layout (and z as w^T phi(q)^T): output and gradients are the float64
    reference's, chunked and whole, with RoPE and without."""
    from mmlinattn.core.ops import set_chunk_tokens
    from mmlinattn.core.ops.grad import _tokens_inner
    set_chunk_tokens('cpu', chunk)
    hw, d = (5, 6), 8
    qkv = rand((2, 3, 2, d, 30)).transpose(-2, -1).unbind(1)  # (B, 3, h, d, N) -> 3 x (B, h, N, d)
    assert _tokens_inner(qkv[0]) and not qkv[0].is_contiguous()
    g = rand((2, 2, 30, d))
    for rope in (None, rope_sin_cos(hw, rope_angles(d, dtype=torch.float64))):
        with torch.inference_mode():
            out = mala_attention(*qkv, rope=rope)
        want = mala_attention_reference(*qkv, rope=rope)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-10)
        xs = [t.detach().requires_grad_(True) for t in qkv]
        ys = [t.detach().clone().requires_grad_(True) for t in qkv]
        got = torch.autograd.grad(mala_attention(*xs, rope=rope), xs, g)
        exp = torch.autograd.grad(mala_attention_reference(*ys, rope=rope), ys, g)
        for a, b in zip(got, exp):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
