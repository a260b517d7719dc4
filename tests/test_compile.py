"""torch.compile: the backbones trace into one graph (no graph break anywhere in them, the attention
modules included), and the compiled backbones compute what the eager ones do.

The tracing checks use ``torch._dynamo.explain`` and the equality checks the ``aot_eager`` backend
(dynamo + AOTAutograd, no code generation), so they need no C++ toolchain and run in seconds; the
inductor speedups are measured by ``tools/analysis_tools/benchmark.py --compile``
(docs/benchmarks.md).
"""
import sys

import pytest
import torch

import mmlinattn  # noqa: F401  (registers the backbones)
from mmlinattn.core.registry import MODELS

from helpers import tiny_arch

FAMILIES = ['MAViT', 'InLinePVT', 'InLineSwin']
# Blocks a stage of the backbones traced here (T's widths, heads and cores otherwise): one, and two
# for InLine-Swin, whose odd blocks are the shifted-window ones. A stage's further blocks are the
# same block again (MAViT-T and InLine-Swin-T have 6 in stage 3, InLine-PVT-T 2 a stage; the
# blocks of MAViT and InLine-PVT do not depend on their index), so tracing them checks nothing
# more, while dynamo's trace time grows with the blocks: ~1 s a block on one thread (2 cores).
DEPTHS = {'MAViT': [1, 1, 1, 1], 'InLinePVT': [1, 1, 1, 1], 'InLineSwin': [2, 2, 2, 2]}


def _backbone(name, **kw):
    """The family's T backbone with ``DEPTHS`` blocks a stage."""
    torch.manual_seed(0)
    arch = tiny_arch(MODELS.get(name), DEPTHS[name])
    m = MODELS.build(dict(type=name, arch=arch, drop_path_rate=0.0, **kw))
    m.init_weights()
    return m


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize('name, grad', [
    (name, grad) for name in FAMILIES for grad in (True, False)
    if (name, grad) != ('MAViT', False)],
    ids=lambda v: v if isinstance(v, str) else 'train' if v else 'inference')
def test_backbone_is_one_graph(name, grad):
    """One graph and zero breaks, in training (autograd path) and under no_grad (the chunked,
    in-place inference path of the linear attentions). MAViT's inference case is
    test_compiled_backbone_matches_eager[MAViT]'s second size: the same eval-mode backbone under
    no_grad, compiled with ``fullgraph=True`` (a graph break raises) into exactly one more graph."""
    m = _backbone(name, out_norm=True).train(grad)
    x = torch.randn(1, 3, 64, 64)
    with torch.set_grad_enabled(grad):
        ex = torch._dynamo.explain(m)(x)
    reasons = [f'{r.reason} @ {r.user_stack[-1] if r.user_stack else "?"}'
               for r in ex.break_reasons]
    assert ex.graph_break_count == 0, reasons
    assert ex.graph_count == 1


def _recording_aot_eager(graphs):
    """The ``aot_eager`` backend, recording each graph dynamo hands it."""
    aot_eager = torch._dynamo.lookup_backend('aot_eager')

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)
    return backend


def _symbolic_inputs(gm):
    """The graph's inputs that carry a symbolic size (none in a static-shape graph)."""
    out = []
    for n in gm.graph.find_nodes(op='placeholder'):
        v = n.meta.get('example_value')
        if isinstance(v, torch.SymInt) or any(isinstance(d, torch.SymInt)
                                              for d in getattr(v, 'shape', ())):
            out.append(n.name)
    return out


def _assert_close(got, want):
    assert len(got) == len(want) == 4
    for e, c in zip(want, got):
        assert e.shape == c.shape
        assert torch.allclose(c, e, rtol=2e-4, atol=2e-4 * e.abs().max().item())


@pytest.mark.parametrize('name', FAMILIES)
def test_compiled_backbone_matches_eager(name):
    """Forward outputs and input gradients of the compiled backbone equal eager ones (float32,
    within 2e-4 of each output's scale), from one graph (``fullgraph``). The traced graph
    (functionalised, decomposed aten ops) does not call eager's kernels on the same layouts, so some
    sums run in another order: measured up to 2e-6 of the scale (MAViT-T, 1 and 2 threads), 100x
    under the tolerance, which is 50x under a missing or wrong term (1e-2).

    MAViT also checks ``compile=dict(dynamic=False)``, which tools/train.py lets through for inputs
    that change size, on the same compiled module: a second input size (under no_grad) gives a
    second graph, static-shaped like the first, that computes what eager does (``aot_eager``;
    inductor's compile takes minutes per size on 2 cores, and its automatic dynamic shapes fail at
    the second size, docs/benchmarks.md section 11). One compile serves both checks (each dynamo
    trace of a backbone is seconds on one thread, ~1 s a block: DEPTHS). That no_grad graph is
    also MAViT's one-graph check of the inference path (test_backbone_is_one_graph)."""
    m = _backbone(name, out_norm=True).eval()
    graphs = []
    compiled = torch.compile(m, backend=_recording_aot_eager(graphs), fullgraph=True,
                             dynamic=False)
    x = torch.randn(2, 3, 64, 96)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = m(xe)
    got = compiled(xc)
    _assert_close(got, eager)
    assert len(graphs) == 1 and not _symbolic_inputs(graphs[0])
    # a loss whose input gradient is not ~0 (a mean of squares after LayerNorm would be nearly
    # constant): fixed random weights on every output
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(e.shape, generator=g) for e in eager]
    sum((o * w).sum() for o, w in zip(eager, weights)).backward()
    sum((o * w).sum() for o, w in zip(got, weights)).backward()
    assert torch.allclose(xc.grad, xe.grad, rtol=2e-4, atol=2e-4 * xe.grad.abs().max().item())
    if name != 'MAViT':
        return
    x2 = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        _assert_close(compiled(x2), m(x2))
    assert len(graphs) == 2, 'the second size did not compile its own graph'
    assert not _symbolic_inputs(graphs[1]), 'dynamic=False, yet the second graph is symbolic'


def test_plain_param_groups_hook_lets_the_optimizer_step_compile():
    """mmengine builds param groups as ConfigDicts; after PlainParamGroupsHook they are plain dicts
    with the same entries, and an optimizer step compiled with dynamo updates the weights exactly as
    the eager step does."""
    import copy
    from types import SimpleNamespace

    from mmengine.config import ConfigDict
    from mmengine.optim import build_optim_wrapper

    from mmlinattn.training.hooks import PlainParamGroupsHook

    def make():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
        # a ConfigDict, as the Runner passes it from the config file
        ow = build_optim_wrapper(m, ConfigDict(
            optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.05),
            paramwise_cfg=dict(norm_decay_mult=0.0)))
        return m, ow
    m_e, ow_e = make()
    m_c, ow_c = make()
    before = [copy.deepcopy(dict(g, params=None)) for g in ow_c.optimizer.param_groups]
    PlainParamGroupsHook().before_run(SimpleNamespace(optim_wrapper=ow_c))
    groups = ow_c.optimizer.param_groups
    assert all(type(g) is dict for g in groups)
    assert [dict(g, params=None) for g in groups] == before
    x = torch.randn(3, 4)

    def step(model, ow):
        loss = model(x).square().mean()
        ow.update_params(loss)
        return loss
    compiled = torch.compile(lambda: step(m_c, ow_c), backend='aot_eager')
    for _ in range(2):
        step(m_e, ow_e)
        compiled()
    # 3x4 inputs, sums of <= 8 terms; every |gradient| is >= 5e-3 (measured), far above AdamW's
    # eps 1e-8, so order noise moves a step by ~1e-9. What differs is the rounding of the update's
    # few elementwise ops in the traced step: a few ulps of these O(1) weights (2.4e-7 measured).
    for pe, pc in zip(m_e.parameters(), m_c.parameters()):
        assert torch.allclose(pe, pc, rtol=1e-5, atol=1e-6)
    assert not torch.equal(m_c[0].weight, make()[0][0].weight)  # the steps did change the weights


@pytest.mark.heavy
@pytest.mark.parametrize('config', ['configs/toy/fpn_mavit-t_toy-ade.py',
                                    'configs/toy/upernet_inline-swin-t_toy-ade.py',
                                    'configs/toy/mask-rcnn_inline-pvt-t_fpn_toy-coco.py',
                                    'configs/toy/retinanet_mavit-t_fpn_toy-coco.py'],
                         ids=lambda p: p.split('/')[-1][:-3])
def test_toy_model_trains_with_mmengine_compile(tmp_path, config):
    """``compile`` in the config (mmengine compiles ``train_step``) through tools/train.py: two
    training iterations and the evaluation run to the end (aot_eager backend; minutes per model on 2
    CPU cores, most of it dynamo tracing mmdet/mmseg code)."""
    from os import path as osp

    from mmlinattn.training.runs import read_metrics

    import warm
    from helpers import make_toy_sets
    root = osp.dirname(osp.dirname(osp.abspath(__file__)))
    data = make_toy_sets(tmp_path / 'data', seed=2, size=64, train=8, val=2)
    det = 'coco' in config
    opts = ['compile.backend=aot_eager', 'randomness.seed=0']
    if det:
        opts += [f'{k}.dataset.data_root={data}/toy_coco/'
                 for k in ('train_dataloader', 'val_dataloader')]
        opts += [f'val_evaluator.ann_file={data}/toy_coco/annotations/instances_val.json',
                 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
                 'train_dataloader.dataset.indices=8']
        # two iterations leave every score under 0.05: nothing to evaluate
        if 'retinanet' in config:
            opts.append('model.test_cfg.score_thr=0.0')
    else:
        opts += [f'{k}.dataset.data_root={data}/toy_ade'
                 for k in ('train_dataloader', 'val_dataloader')]
        opts += ['train_cfg.max_iters=2', 'train_cfg.val_interval=2',
                 'default_hooks.checkpoint.interval=2']
    r = warm.run([sys.executable, osp.join(root, 'tools/train.py'), osp.join(root, config),
                  '--work-dir', tmp_path / 'work', '--cfg-options', *opts], cwd=root, merge=True)
    assert r.returncode == 0, r.stdout[-3000:]
    assert 'Model has been "compiled"' in r.stdout
    assert ('coco/bbox_mAP' if det else 'mIoU') in read_metrics(str(tmp_path / 'work'))
