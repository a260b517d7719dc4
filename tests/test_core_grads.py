"""The InLine and MALA cores' autograd Functions (mmlinattn/core/ops/grad.py): their backward
against finite differences (gradcheck) and, through the public functions, against autograd through
the quadratic references, for every option the forward takes."""
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

from mmlinattn.core.ops import (
    inline_attention,
    inline_attention_reference,
    mala_attention,
    mala_attention_reference,
    rope_angles,
    rope_sin_cos,
)
from mmlinattn.core.ops.grad import InlineAttentionFunction, MalaAttentionFunction

from helpers import on_devices

KERNELS = ['identity', 'relu', 'leakyrelu', 'exp', 'elu']
D64 = dict(dtype=torch.float64)
HW = (3, 4)  # N = 12 tokens
D, DV = 8, 6


def _qkv(b=2, h=2, n=HW[0] * HW[1], d=D, dv=DV, dtype=torch.float64, device='cpu'):
    q, k = (torch.randn(b, h, n, d, dtype=dtype) for _ in range(2))
    return tuple(t.to(device) for t in (q, k, torch.randn(b, h, n, dv, dtype=dtype)))


def _rope(kind, n=HW[0] * HW[1], d=D, device='cpu'):
    if kind is None:
        return None
    if kind == 'tables':
        tables = rope_sin_cos(HW, rope_angles(d, dtype=torch.float64))
    else:  # any (N, d) tables, not only pair-equal sines: the backward uses the exact adjoint
        tables = torch.randn(n, d, **D64), torch.randn(n, d, **D64)
    return tuple(t.to(device) for t in tables)


def _grads_match(fn, ref, inputs, atol=1e-9):
    """Outputs and gradients of ``fn`` and of ``ref`` (one random upstream gradient) agree; the
    inputs are left untouched."""
    xs = [t.detach().clone().requires_grad_(True) for t in inputs]
    ys = [t.detach().clone().requires_grad_(True) for t in inputs]
    # float64, linear-time Function against autograd through the quadratic form: other orders of
    # the sums, ~1e-15 apart on these O(1) values; 1e-9 is far above that and far below a wrong term
    out, expected = fn(*xs), ref(*ys)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-10)
    g = torch.randn_like(expected)
    got = torch.autograd.grad(out, xs, g)
    want = torch.autograd.grad(expected, ys, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=atol)
    for x, t in zip(xs, inputs):
        assert torch.equal(x.detach(), t)
    return out


@pytest.mark.parametrize('kernel', KERNELS)
@pytest.mark.parametrize('scale', [0.35, 1.3])
@pytest.mark.parametrize('step', [5, 64])  # the forward in chunks, and in one piece
def test_inline_function_gradcheck(kernel, scale, step):
    q, k, v = (t.requires_grad_(True) for t in _qkv(b=1, n=9, d=4, dv=3))
    assert gradcheck(lambda q, k, v: InlineAttentionFunction.apply(q, k, v, kernel, scale, step),
                     (q, k, v))


@pytest.mark.parametrize('rope', [None, 'tables', 'random'])
@pytest.mark.parametrize('beta,gamma', list(itertools.product([True, False], repeat=2)))
@pytest.mark.parametrize('eps,step', [(1e-6, 5), (0.5, 64)])
def test_mala_function_gradcheck(rope, beta, gamma, eps, step):
    q, k, v = (t.requires_grad_(True) for t in _qkv(b=1, n=12, d=4, dv=3))
    tables = _rope(rope, n=12, d=4)
    sin, cos = (None, None) if tables is None else tables
    assert gradcheck(
        lambda q, k, v: MalaAttentionFunction.apply(q, k, v, sin, cos, 0.6, eps, beta, gamma, step),
        (q, k, v))


@pytest.mark.parametrize('kernel', KERNELS)
@pytest.mark.parametrize('scale', [None, 0.9])
@pytest.mark.parametrize('device', on_devices())
def test_inline_grads_equal_the_quadratic_reference(device, kernel, scale):
    out = _grads_match(lambda q, k, v: inline_attention(q, k, v, kernel=kernel, scale=scale),
                       lambda q, k, v: inline_attention_reference(q, k, v, kernel, scale),
                       _qkv(device=device))
    assert type(out.grad_fn).__name__ == 'InlineAttentionFunctionBackward'


@pytest.mark.parametrize('rope', [None, 'tables', 'random'])
@pytest.mark.parametrize('beta,gamma', list(itertools.product([True, False], repeat=2)))
@pytest.mark.parametrize('eps', [1e-6, 0.25])
@pytest.mark.parametrize('device', on_devices())
def test_mala_grads_equal_the_quadratic_reference(device, rope, beta, gamma, eps):
    tables = _rope(rope, device=device)
    opts = dict(rope=tables, eps=eps, beta=beta, gamma=gamma)
    out = _grads_match(lambda q, k, v: mala_attention(q, k, v, **opts),
                       lambda q, k, v: mala_attention_reference(q, k, v, **opts),
                       _qkv(device=device))
    assert type(out.grad_fn).__name__ == 'MalaAttentionFunctionBackward'


def test_mala_rope_tables_with_grad_take_plain_autograd():
    """Tables that need a gradient (none of ours do) fall back to autograd through the ops."""
    sin, cos = (t.requires_grad_(True) for t in _rope('random'))
    q, k, v = (t.requires_grad_(True) for t in _qkv())
    out = mala_attention(q, k, v, rope=(sin, cos))
    ref = mala_attention_reference(q, k, v, rope=(sin, cos))
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v, sin, cos), g),
                    torch.autograd.grad(ref, (q, k, v, sin, cos), g)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)  # float64: see _grads_match


@pytest.mark.parametrize('core', ['inline', 'mala'])
def test_backward_saves_q_k_v_and_small_states_only(core):
    """No (N x d) intermediate is kept for the backward: the only (N x >1) tensors saved are the
    inputs themselves (MALA adds z, N x 1)."""
    q, k, v = (t.requires_grad_(True) for t in _qkv(n=64))
    saved = []

    def pack(t):
        saved.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if core == 'inline':
            out = inline_attention(q, k, v, kernel='elu')
        else:
            out = mala_attention(q, k, v, rope=_rope('random', n=64))
    big = [t for t in saved if t.dim() == 4 and t.shape[-2] == 64 and t.shape[-1] > 1]
    assert len(big) == 3 and all(any(t is x for x in (q, k, v)) for t in big)
    out.sum().backward()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('core', ['inline', 'mala'])
@pytest.mark.parametrize('device', on_devices())
def test_half_inputs_promoted_output_and_grads_in_their_dtype(device, dtype, core):
    q64, k64, v64 = _qkv(device=device)
    fn = inline_attention if core == 'inline' else mala_attention
    ref = inline_attention_reference if core == 'inline' else mala_attention_reference
    q, k, v = (t.to(dtype).requires_grad_(True) for t in (q64, k64, v64))
    out = fn(q, k, v)
    assert out.dtype == dtype
    g = torch.randn(out.shape, **D64).to(device)
    out.backward(g.to(dtype))
    xs = [t.to(dtype).double().requires_grad_(True) for t in (q64, k64, v64)]
    want = torch.autograd.grad(ref(*xs), xs, g.to(dtype).double())
    for x, w in zip((q, k, v), want):
        assert x.grad.dtype == dtype
        # the half-precision rounding of the intermediates (2^-11, 2^-8 per value) dominates; the
        # order of the sums (float32 accumulation, N = 12) is ~1e-7 of that
        torch.testing.assert_close(x.grad.double(), w, rtol=0.05, atol=0.05)


@pytest.mark.parametrize('backward_inside', [False, True])
@pytest.mark.parametrize('core', ['inline', 'mala'])
@pytest.mark.parametrize('device', on_devices())
def test_autocast_float32_inputs(device, core, backward_inside):
    """Under autocast (bfloat16) the cores still compute in float32, backward included - also
    when ``.backward()`` is called inside the autocast region (the Functions' backward is marked
    with custom_bwd and runs with autocast off, as their forward did); on CUDA too (float32 there:
    torch's matmuls leave TF32 off by default)."""
    q, k, v = (t.float().requires_grad_(True) for t in _qkv(device=device))
    fn = inline_attention if core == 'inline' else mala_attention
    with torch.autocast(device, dtype=torch.bfloat16):
        out = fn(q, k, v)
        if backward_inside:
            out.sum().backward()
    assert out.dtype == torch.float32
    if not backward_inside:
        out.sum().backward()
    xs = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = inline_attention_reference if core == 'inline' else mala_attention_reference
    want = torch.autograd.grad(ref(*xs).sum(), xs)
    for x, w in zip((q, k, v), want):
        assert x.grad.dtype == torch.float32
        # float32 against float64: sums of at most 12 x 8 O(1) terms, ~1e-6 in any order; bfloat16
        # (what autocast would have computed in) is 4e-3
        torch.testing.assert_close(x.grad.double(), w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('core', ['inline', 'mala'])
def test_half_inputs_give_the_float32_paths_numbers(dtype, core):
    """Saving half inputs as they are changes no number: output and gradients are bitwise those of
    the same core run on float32 copies and cast back (what the public functions did before they
    handed half inputs to the Functions; so the half-precision error against float64 of the test
    above stays where it was)."""
    fn = inline_attention if core == 'inline' else mala_attention
    opts = {} if core == 'inline' else dict(rope=_rope('tables'))
    half = [t.to(dtype) for t in _qkv()]
    xs = [t.clone().requires_grad_(True) for t in half]
    ys = [t.float().requires_grad_(True) for t in half]
    out, ref = fn(*xs, **opts), fn(*ys, **opts)
    assert out.dtype == dtype and torch.equal(out, ref.to(dtype))
    g = torch.randn(out.shape).to(dtype)
    out.backward(g)
    ref.backward(g.float())
    for x, y in zip(xs, ys):
        assert x.grad.dtype == dtype and torch.equal(x.grad, y.grad.to(dtype))


def _saved_bytes(fn, q, k, v, tables=None):
    """What autograd keeps for the core's backward: numel x element size of every tensor packed
    while ``fn(q, k, v)`` runs, each tensor once; the caller's RoPE tables (built once per stage
    and input size, shared by the stage's blocks) are left out. Also the tensors themselves."""
    saved = {}

    def pack(t):
        saved[(t.data_ptr(), t.dtype, tuple(t.shape), t.stride())] = t
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(q, k, v)
    theirs = {(t.data_ptr(), t.dtype) for t in tables or ()}
    kept = [t for key, t in saved.items() if key[:2] not in theirs]
    return sum(t.numel() * t.element_size() for t in kept), kept, out


@pytest.mark.parametrize('half', ['autocast', 'float16'])
@pytest.mark.parametrize('core', ['inline', 'mala'])
def test_half_inputs_saved_in_half(core, half):
    """Memory accounting (not timing): with q, k, v in half precision - from a projection under
    CPU bf16 autocast, or float16 tensors - the cores keep them for the backward in that dtype, not
    as float32 copies, so what they save is about half of what they save for float32 inputs.

    Tolerance: 2 bytes against 4 per q, k, v value is exactly 0.5; the small states stay float32 -
    d x dv, d and dv values per head, and MALA's z, N x 1 - here (N = 256, d = dv = 16) 2.3 % of
    the float32 total for InLine and 4.2 % for MALA, so the ratio must lie in [0.5, 0.55]; float32
    copies of q, k, v would give ~1.0."""
    b, h, n, d, c = 1, 2, 256, 16, 32
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, n, c, generator=gen, requires_grad=True)
    w = torch.randn(3 * h * d, c, generator=gen) / c ** 0.5
    tables = rope_sin_cos((16, 16), rope_angles(d)) if core == 'mala' else None
    fn = ((lambda q, k, v: inline_attention(q, k, v, kernel='elu')) if core == 'inline' else
          (lambda q, k, v: mala_attention(q, k, v, rope=tables)))

    def run(low):
        amp = low and half == 'autocast'
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):
            qkv = F.linear(x, w)
            if low and half == 'float16':  # float16 q, k, v (torch 2.1's CPU has no float16 GEMM)
                qkv = qkv.half()
            q, k, v = qkv.view(b, n, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
            nbytes, kept, out = _saved_bytes(fn, q, k, v, tables)
        out.float().sum().backward()
        return nbytes, kept, q.dtype

    full, kept32, dtype32 = run(False)
    low, kept16, dtype16 = run(True)
    assert dtype32 == torch.float32 and dtype16 == (torch.bfloat16 if half == 'autocast'
                                                    else torch.float16)
    assert 0.5 <= low / full <= 0.55, (low, full)
    big16 = [t for t in kept16 if t.dim() == 4 and t.shape[-2] == n and t.shape[-1] > 1]
    big32 = [t for t in kept32 if t.dim() == 4 and t.shape[-2] == n and t.shape[-1] > 1]
    assert len(big16) == len(big32) == 3 and all(t.dtype == dtype16 for t in big16)


@pytest.mark.filterwarnings('ignore::torch.jit.TracerWarning', 'ignore::FutureWarning')
@pytest.mark.parametrize('core', ['inline', 'mala'])
def test_jit_trace_sees_the_products_not_one_python_op(core):
    """The FLOP counter traces with jit: with gradients on, the products must stay visible."""
    q, k, v = (t.float().requires_grad_(True) for t in _qkv())
    fn = inline_attention if core == 'inline' else mala_attention
    graph = torch.jit.trace(fn, (q, k, v), check_trace=False).graph
    kinds = {n.kind() for n in graph.nodes()}
    assert 'prim::PythonOp' not in kinds
    assert kinds & {'aten::matmul', 'aten::bmm', 'aten::baddbmm'}
