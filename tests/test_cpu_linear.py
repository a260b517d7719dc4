"""The token projections' CPU route (mmlinattn.core.ops.linear): oneDNN's 1x1 convolution on the
(B, N, C) tokens viewed as a channels-last map. The oracle is torch's own ``F.linear`` in float64;
the route must be as close to it as ``F.linear`` in float32 is, take oneDNN where it says it does,
and hand every case it does not cover (other dtypes, strides, devices, tracing, autocast) to
``F.linear`` unchanged."""
import pytest
import torch
import torch.nn.functional as F

from mmlinattn.core.ops import linear as L

ONEDNN = torch.backends.mkldnn.is_available()
needs_onednn = pytest.mark.skipif(not ONEDNN, reason='this torch has no oneDNN (mkldnn)')


@pytest.fixture(autouse=True)
def _onednn():
    """The route on, and two threads (with one, ATen keeps 1x1 convolutions off oneDNN and the
    route hands everything to F.linear; test_one_thread_takes_f_linear checks that)."""
    old, threads = L.set_cpu_linear('onednn'), torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    L.set_cpu_linear(old)
    torch.set_num_threads(threads)


def _routed(ops):
    return 'aten::mkldnn_convolution' in ops and 'aten::addmm' not in ops


def _ops(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


SHAPES = [((937, 24), 16), ((2, 500, 24), 40), ((2, 3, 700, 24), 8), ((1, 1, 24), 24),
          ((2, 50, 24), 40)]


@pytest.mark.parametrize('shape,out', SHAPES)
@pytest.mark.parametrize('bias', [True, False])
def test_matches_float64_linear_as_closely_as_blas(shape, out, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.randn(out, shape[-1], generator=g, requires_grad=True)
    b = torch.randn(out, generator=g, requires_grad=True) if bias else None
    grad = torch.randn(*shape[:-1], out, generator=g)
    leaves = [t for t in (x, w, b) if t is not None]

    def run(fn, dtype):
        xs = [t.detach().to(dtype).requires_grad_() for t in leaves]
        y = fn(xs[0], xs[1], xs[2] if bias else None)
        return [y] + list(torch.autograd.grad(y, xs, grad.to(dtype)))
    exact = run(F.linear, torch.float64)
    ops = _ops(lambda: run(L.linear, torch.float32))
    assert _routed(ops) == (ONEDNN and x.numel() > L.MIN_ELEMENTS)
    ours = run(L.linear, torch.float32)
    blas = run(F.linear, torch.float32)
    for e, o, r in zip(exact, ours, blas):
        assert o.shape == e.shape and o.dtype == torch.float32
        err_ours = (o.double() - e).abs().max().item()
        err_blas = (r.double() - e).abs().max().item()
        assert err_ours <= 4 * err_blas + 1e-5 * e.abs().max().item()


@needs_onednn
def test_takes_onednn_for_contiguous_float32_tokens():
    x, w, b = torch.randn(2, 500, 24), torch.randn(40, 24), torch.randn(40)
    assert _routed(_ops(lambda: L.linear(x, w, b)))
    L.set_cpu_linear('blas')
    ops = _ops(lambda: L.linear(x, w, b))
    assert 'aten::addmm' in ops and not any('conv' in o for o in ops)


def test_one_thread_takes_f_linear():
    x, w, b = torch.randn(2, 500, 24), torch.randn(40, 24), torch.randn(40)
    torch.set_num_threads(1)
    ops = _ops(lambda: L.linear(x, w, b))
    assert 'aten::addmm' in ops and not any('conv' in o for o in ops)


def test_fx_symbolic_trace_records_a_linear():
    """torch.fx passes Proxies: the traced graph is a plain linear, as nn.Linear's."""
    import torch.fx

    from mmlinattn.core.models.layers.common import Linear
    m = Linear(24, 40)
    g = torch.fx.symbolic_trace(m)
    assert 'linear' in g.code and 'conv' not in g.code
    x = torch.randn(2, 500, 24)
    assert torch.allclose(g(x), F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)


def test_shape_errors_and_empty_outputs_are_f_linears():
    x = torch.randn(2, 500, 24)
    assert L.linear(x, torch.randn(0, 24)).shape == (2, 500, 0)
    with pytest.raises(RuntimeError) as ours:
        L.linear(x, torch.randn(40, 23))
    with pytest.raises(RuntimeError) as theirs:
        F.linear(x, torch.randn(40, 23))
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize('case', ['float64', 'strided', 'jit-trace', 'autocast', 'empty',
                                  'small'])
def test_falls_back_to_f_linear(case):
    x, w, b = torch.randn(2, 500, 24), torch.randn(40, 24), torch.randn(40)
    if case == 'float64':
        x, w, b = x.double(), w.double(), b.double()
    if case == 'strided':
        x = torch.randn(2, 24, 500).transpose(1, 2)
    if case == 'empty':
        x = torch.randn(0, 500, 24)
    if case == 'small':  # not above L.MIN_ELEMENTS
        x = torch.randn(2, 50, 24)
    # the graph the jit records (what an exported / traced model runs)
    traced = torch.jit.trace(lambda t: L.linear(t, w, b), (x,), check_trace=False)

    def call():
        if case == 'jit-trace':
            return traced(x)
        if case == 'autocast':
            with torch.autocast('cpu', dtype=torch.bfloat16):
                return L.linear(x, w, b)
        return L.linear(x, w, b)
    ops = _ops(call)
    assert not any('conv' in o for o in ops)
    expected = F.linear(x, w, b)
    if case == 'autocast':
        with torch.autocast('cpu', dtype=torch.bfloat16):
            expected = F.linear(x, w, b)
    assert torch.equal(call(), expected)


def test_the_setting_is_checked_and_read_from_the_environment(monkeypatch):
    with pytest.raises(ValueError, match="'onednn', 'blas'"):
        L.set_cpu_linear('mkl')
    import importlib
    monkeypatch.setenv('MMLINATTN_CPU_LINEAR', 'blas')
    try:
        assert importlib.reload(L).cpu_linear() == 'blas'
    finally:
        monkeypatch.delenv('MMLINATTN_CPU_LINEAR')
        importlib.reload(L)
    assert L.cpu_linear() == 'onednn'


@pytest.mark.parametrize('kind', ['InLineSwin', 'InLinePVT'])
def test_backbones_project_through_it_and_agree_with_blas(kind):
    """Every Linear of the token backbones is ours (same parameters and keys as nn.Linear), and
    the backbone's maps agree with the BLAS route to float32 accuracy."""
    import mmlinattn  # noqa: F401
    from mmlinattn.core.models.layers.common import Linear
    from mmlinattn.core.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(dict(type=kind, arch='tiny', out_indices=(0, 1, 2, 3))).eval()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, Linear) for m in linears)
    x = torch.randn(1, 3, 64, 96)
    def convs():  # oneDNN convolutions in one forward (the patch embeddings' among them)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model(x)
        return sum(e.name == 'aten::mkldnn_convolution' for e in prof.events())
    with torch.no_grad():
        routed = convs()
        fast = model(x)
        L.set_cpu_linear('blas')
        plain = convs()
        slow = model(x)
    assert not ONEDNN or routed > plain
    for a, b in zip(fast, slow):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())


def test_mavit_runs_channels_last_on_the_cpu_and_returns_nchw():
    """MAViT's image goes in channels-last where the oneDNN route applies; its maps come out as
    contiguous NCHW either way, with the BLAS route's values."""
    import mmlinattn  # noqa: F401
    from mmlinattn.core.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(dict(type='MAViT', arch='tiny', out_indices=(0, 1, 2, 3))).eval()
    x = torch.randn(1, 3, 64, 96)
    assert L.cpu_channels_last(x).is_contiguous(memory_format=torch.channels_last)
    assert L.cpu_channels_last(x.double()) is not None and \
        L.cpu_channels_last(x.double()).is_contiguous()
    seen = []
    hook = model.patch_embed.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        fast = model(x)
        L.set_cpu_linear('blas')
        slow = model(x)
    hook.remove()
    assert seen[0].is_contiguous(memory_format=torch.channels_last) and seen[1].is_contiguous()
    for a, b in zip(fast, slow):
        assert a.is_contiguous() and b.is_contiguous()
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())


def test_benchmark_linear_prints_one_row_per_shape(capsys):
    """tools/analysis_tools/benchmark_linear.py: a row per projection shape, the two routes'
    outputs within float32 rounding of each other, the CPU named."""
    from tools.analysis_tools import benchmark_linear as tool
    assert tool.main(['--batch', '1', '--reps', '1']) == 0
    out = capsys.readouterr().out
    assert tool.cpu_name() in out
    rows = [r for r in out.splitlines() if r.startswith('| ') and ' -> ' in r.split('|')[1]
            and 'C_in' not in r]
    assert len(rows) == len(tool.SHAPES)
    assert all(float(r.rstrip(' |').rsplit('|', 1)[-1]) < 1e-2 for r in rows)
    assert L.cpu_linear() == 'onednn'


def test_a_transposed_weight_is_taken_too():
    x, w = torch.randn(2, 500, 24), torch.randn(24, 40).t()  # (40, 24), not contiguous
    assert torch.allclose(L.linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


def _tiny(kind):
    import mmlinattn  # noqa: F401
    from mmlinattn.core.registry import MODELS
    torch.manual_seed(0)
    return MODELS.build(dict(type=kind, arch='tiny', out_indices=(0, 1, 2, 3))).eval()


@pytest.mark.parametrize('kind', ['InLineSwin', 'InLinePVT'])  # MAViT has no Linear
def test_plain_linear_gives_nn_linears_with_the_same_parameters(kind):
    """plain_linear turns every Linear of ours into torch's own nn.Linear (the type, exactly)
    holding the same tensors; the state dict and the BLAS route's outputs are unchanged."""
    from mmlinattn.core.models.layers import Linear, plain_linear
    model = _tiny(kind)
    ours = sum(type(m) is Linear for m in model.modules())
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    before = model.state_dict(keep_vars=True)
    x = torch.randn(1, 3, 64, 96)
    L.set_cpu_linear('blas')  # the same F.linear product on both sides: equal, not close
    with torch.no_grad():
        want = model(x)
        assert plain_linear(model) is model
        got = model(x)
    assert ours == linears > 0
    assert not any(type(m) is Linear for m in model.modules())
    assert sum(type(m) is torch.nn.Linear for m in model.modules()) == linears
    after = model.state_dict(keep_vars=True)
    assert list(after) == list(before)
    assert all(after[k] is before[k] for k in before)  # the same Parameter objects
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    # a Linear at the root is replaced and returned; training mode is kept
    root = Linear(4, 3, bias=False).train()
    plain = plain_linear(root)
    assert type(plain) is torch.nn.Linear and plain.weight is root.weight and plain.bias is None
    assert plain.training


def test_dynamic_quantization_takes_them_after_plain_linear():
    """torch's quantize_dynamic matches module types exactly: it leaves our Linear in float and
    quantizes every layer once plain_linear has run (torch's own swap is the oracle)."""
    import copy
    quantization = getattr(torch, 'ao', None) and getattr(torch.ao, 'quantization', None)
    if quantization is None or not hasattr(quantization, 'quantize_dynamic'):
        pytest.skip('this torch has no torch.ao.quantization.quantize_dynamic')
    import warnings

    from mmlinattn.core.models.layers import plain_linear
    model = _tiny('InLinePVT')
    n = sum(isinstance(m, torch.nn.Linear) for m in model.modules())

    def quantized(m):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # torch.ao.quantization's deprecation notice
            q = quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
        return q, sum(type(x).__name__ == 'Linear' and 'quantized' in type(x).__module__
                      for x in q.modules())

    _, as_is = quantized(copy.deepcopy(model))
    q, swapped = quantized(plain_linear(copy.deepcopy(model)))
    assert as_is == 0 and swapped == n
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        for a, b in zip(q(x), model(x)):  # int8 weights: close, not equal
            assert (a - b).norm() < 0.1 * b.norm()
