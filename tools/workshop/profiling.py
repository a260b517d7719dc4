"""Where one training step's time and memory go, by model part: ``benchmark_step.py --profile``.

One warm training step of a whole detector / segmentor
(:func:`tools.workshop.benchmarking.bench_model`) runs under ``torch.profiler`` with a named
range around each part of the model:

* the backbone (``backbone``), its stages (``backbone/s1`` ... ``backbone/s4``; the patch
  embedding and downsampling layers are counted as ``embed``), and inside them the attention module
  (``attn``: its projections and reshapes), InLine's local residual (``local``), the attention core
  itself (``core:<name>``: MALA, InLine, softmax SDPA, ...), the 2-D RoPE rotations (``rope``), the
  feed-forward network (``ffn``) and the norms (``norm``);
* the neck, the RPN / dense heads, the RoI heads' extractors and heads (or the decode / auxiliary
  heads); what is left (``other``: the data preprocessor, target assignment, sampling and the loss
  terms) is reported as one row, and the optimizer step on its own.

Forward time is each operator's self time, charged to the innermost range it ran in. Backward time
is charged through the autograd sequence number that torch gives every node: the backward of an
operator goes to the range its forward ran in (the profiler records the number on both). Memory is
what the parts keep for backward: the bytes of every tensor autograd saves while a range is open
(one count per storage), which is what a training step's peak grows with.
"""
import re
import time
from collections import defaultdict
from typing import Dict, List

import torch
from torch import nn

from .benchmarking import bench_model

_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)
# a block's name -> its stage: ours and mmdet's Swin (layers.i.blocks.j / stages.i.blocks.j),
# mmdet's PVT (layers.i.1.j), InLine-PVT's flat blocks (block1.j ... block4.j)
_STAGE_OF_BLOCK = re.compile(r'(?:layers|stages)\.(\d+)\.(?:blocks|1)\.\d+|block(\d)\.\d+')


def _is_attention(module: nn.Module) -> bool:
    cls = type(module).__name__
    return 'Attention' in cls or cls.endswith('MSA')


def _kind(name: str, module: nn.Module):
    """The range a module opens (``None``: it adds no range of its own)."""
    cls = type(module).__name__
    parts = name.split('.')
    if name == 'backbone':
        return 'backbone'
    if name.startswith('backbone.'):
        stage = _STAGE_OF_BLOCK.fullmatch(name[len('backbone.'):])
        if stage:  # every block opens its stage's range (stage modules are not always called)
            i = stage.group(1) or stage.group(2)
            return f's{int(i) + (0 if stage.group(2) else 1)}'
        if cls == 'LocalResidual':
            return 'local'
        if isinstance(module, _NORMS) or 'Norm' in cls:
            return 'norm'
        if _is_attention(module) and not any(_is_attention(m) for m in module.modules()
                                             if m is not module):
            return 'attn'
        if cls in ('Mlp', 'FFN', 'ConvFFN', 'MLP') or parts[-1] in ('mlp', 'ffn'):
            return 'ffn'
        if 'Embed' in cls or 'Merging' in cls or parts[-1] in ('downsample', 'patch_embed'):
            return 'embed'
        return None
    if len(parts) == 1 and name in ('neck', 'rpn_head', 'bbox_head', 'decode_head',
                                     'auxiliary_head'):
        return name
    if len(parts) == 2 and parts[0] == 'roi_head':  # its loss() calls these, never roi_head itself
        return 'roi_head'
    return None


class _Ranges:
    """record_function ranges opened / closed by module hooks, the current path kept on a stack."""

    def __init__(self):
        self.stack: List[str] = []
        self.open = []
        self.saved: Dict[str, int] = defaultdict(int)
        self.seen = set()

    def path(self):
        return '/'.join(self.stack) or 'other'

    def enter(self, kind):
        self.stack.append(kind)
        rf = torch.profiler.record_function('range:' + self.path())
        rf.__enter__()
        self.open.append(rf)

    def exit(self):
        self.open.pop().__exit__(None, None, None)
        self.stack.pop()

    def pack(self, t):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in self.seen:
            self.seen.add(key)
            self.saved[self.path()] += key[1]
        return t


def _wrap(owner, attr, kind, ranges):
    """Open a range ``kind`` around every call of ``owner.attr`` (a function or method)."""
    fn = getattr(owner, attr)

    def wrapped(*args, **kwargs):
        ranges.enter(kind(args) if callable(kind) else kind)
        try:
            return fn(*args, **kwargs)
        finally:
            ranges.exit()
    setattr(owner, attr, wrapped)
    return lambda: setattr(owner, attr, fn)


def _hook_ranges(model: nn.Module, kind_of, ranges: _Ranges) -> list:
    """Forward hooks that open the range ``kind_of(name, module)`` around each module that has
    one; returns their removers."""
    undo = []
    for name, module in model.named_modules():
        kind = kind_of(name, module)
        if kind is None:
            continue
        undo.append(module.register_forward_pre_hook(
            lambda m, a, kind=kind: ranges.enter(kind)).remove)
        undo.append(module.register_forward_hook(lambda m, a, o: ranges.exit()).remove)
    return undo


def _instrument(model: nn.Module, ranges: _Ranges):
    """Hooks and wrappers that open the ranges; returns the callables that remove them."""
    from mmlinattn.core.ops import attention as attention_ops
    from mmlinattn.core.ops import cores
    undo = _hook_ranges(model, _kind, ranges)
    undo.append(_wrap(cores.Core, 'run', lambda a: 'core:' + a[0].name, ranges))
    for owner in (attention_ops, cores):
        if hasattr(owner, 'apply_rope'):
            undo.append(_wrap(owner, 'apply_rope', 'rope', ranges))
    return undo


def _charge(events):
    """(forward ms, backward ms) per range path from the profiler's events."""
    fwd, bwd = defaultdict(float), defaultdict(float)
    seq_range = {}

    def range_of(e):
        p = e.cpu_parent
        while p is not None:
            if p.name.startswith('range:'):
                return p.name[len('range:'):]
            if p.name == 'step:backward':
                return None
            p = p.cpu_parent
        return 'other'

    def inside(e, name):
        p = e.cpu_parent
        while p is not None:
            if p.name == name:
                return True
            p = p.cpu_parent
        return False

    for e in events:
        if e.name.startswith('range:') and inside(e, 'step:forward'):
            # the range's own time: the Python between its operators
            fwd[e.name[len('range:'):]] += e.self_cpu_time_total / 1e3
            continue
        if e.name.startswith('step:') or e.name.startswith('autograd::engine'):
            continue
        if inside(e, 'step:forward'):
            where = range_of(e)
            fwd[where] += e.self_cpu_time_total / 1e3
            if getattr(e, 'sequence_nr', -1) >= 0:
                seq_range.setdefault(e.sequence_nr, where)
    for e in events:
        if e.name.startswith('autograd::engine::evaluate_function') and inside(e, 'step:backward'):
            where = seq_range.get(getattr(e, 'sequence_nr', -1), 'other')
            bwd[where] += e.cpu_time_total / 1e3
    return fwd, bwd


def profile_step(config, ref=None, device='cpu', batch=None, size=None, warmup=1) -> dict:
    """One warm training step of ``config`` (optionally with a reference backbone) under the
    profiler; returns the totals and one row per range path (``fwd_ms``, ``bwd_ms``,
    ``saved_mb``)."""
    bench = bench_model(config, ref, device, False, batch, size)
    for _ in range(warmup):
        bench.train_step()
    model, optim = bench.model, bench.optim
    data = model.data_preprocessor(bench.make(bench.n, bench.train_hw), True)
    ranges = _Ranges()
    undo = _instrument(model, ranges)
    model.train()
    activities = [torch.profiler.ProfilerActivity.CPU]
    try:
        with torch.profiler.profile(activities=activities) as prof:
            t0 = time.perf_counter()
            with torch.profiler.record_function('step:forward'):
                with torch.autograd.graph.saved_tensors_hooks(ranges.pack, lambda t: t):
                    loss, _ = model.parse_losses(model(**data, mode='loss'))
            t1 = time.perf_counter()
            with torch.profiler.record_function('step:backward'):
                optim.backward(loss)
            t2 = time.perf_counter()
            with torch.profiler.record_function('step:optimizer'):
                optim.step()
                optim.zero_grad()
            t3 = time.perf_counter()
    finally:
        for u in undo:
            u()
    fwd, bwd = _charge(prof.events())
    rows = [dict(path=p, fwd_ms=round(fwd.get(p, 0.), 1), bwd_ms=round(bwd.get(p, 0.), 1),
                 saved_mb=round(ranges.saved.get(p, 0) / 2 ** 20, 1))
            for p in sorted(set(fwd) | set(bwd) | set(ranges.saved))]
    return dict(config=config, backbone=ref or bench.cfg.model.backbone.type, batch=bench.n,
                train_hw=list(bench.train_hw), threads=torch.get_num_threads(),
                forward_s=round(t1 - t0, 3), backward_s=round(t2 - t1, 3),
                optimizer_s=round(t3 - t2, 3),
                saved_mb=round(sum(ranges.saved.values()) / 2 ** 20, 1),
                rows=rows)


def _group(path: str) -> str:
    """The table's row for a range path: the backbone by part (all stages together; the stage
    splits stay in the JSON), the rest by head."""
    parts = path.split('/')
    if parts[0] != 'backbone':
        return parts[0]
    leaf = parts[-1]
    if leaf == 'backbone' or (leaf[0] == 's' and leaf[1:].isdigit()):
        return 'backbone: rest'
    return f'backbone: {leaf}'


def summary_table(results: List[dict]) -> str:
    """Markdown: one column pair (forward / backward ms) and saved-for-backward MB per model."""
    groups = defaultdict(dict)
    for i, res in enumerate(results):
        for r in res['rows']:
            g = groups[_group(r['path'])].setdefault(i, [0., 0., 0.])
            g[0] += r['fwd_ms']
            g[1] += r['bwd_ms']
            g[2] += r['saved_mb']
    cols = [f"{r['backbone']}: fwd / bwd ms, saved MB" for r in results]
    head = '| part | ' + ' | '.join(cols) + ' |'
    out = [head, '|---' * (len(results) + 1) + '|']
    order = sorted(groups, key=lambda g: (not g.startswith('backbone'), g))
    for g in order:
        cells = []
        for i in range(len(results)):
            f, b, m = groups[g].get(i, (0., 0., 0.))
            cells.append(f'{f:.0f} / {b:.0f}, {m:.0f}')
        out.append(f'| {g} | ' + ' | '.join(cells) + ' |')
    tot = [f"{r['forward_s'] * 1e3:.0f} / {r['backward_s'] * 1e3:.0f}, {r['saved_mb']:.0f}"
           for r in results]
    out.append('| **step (wall)** | ' + ' | '.join(tot) + ' |')
    out.append('| optimizer step (wall ms) | ' +
               ' | '.join(f"{r['optimizer_s'] * 1e3:.0f}" for r in results) + ' |')
    return '\n'.join(out)


# ops that move no data (views, allocations, no-op casts) and RoPE's pair shuffle, not counted
_NOT_PASSES = frozenset(f'aten::{n}' for n in (
    'alias', 'transpose', 't', 'reshape', 'view', '_unsafe_view', 'slice', 'select', 'as_strided',
    'unsqueeze', 'squeeze', 'expand', 'flatten', 'unflatten', 'unbind', 'detach', 'to', 'empty',
    'empty_like', 'new_empty', 'empty_strided', 'stack'))


def count_passes(fn, n: int, d: int) -> List[str]:
    """The passes over (n x d) memory of one call of ``fn()``: the outermost aten ops (top level,
    or directly under a range that is not an aten op: an autograd node of the backward, a custom
    Function's forward) with an input whose last two dims are (n, d) or, transposed, (d, n); views,
    allocations and ops on (n x 1) tensors are not passes. Pick n and d unlike every other size of
    the call. Returns the op names in call order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        fn()

    def counted(e) -> bool:
        top = e.cpu_parent is None or not e.cpu_parent.name.startswith('aten::')
        return (top and e.name.startswith('aten::') and e.name not in _NOT_PASSES
                and any(isinstance(s, list) and len(s) >= 2 and s[-2:] in ([n, d], [d, n])
                        for s in e.input_shapes))
    return [e.name for e in sorted(prof.events(), key=lambda e: e.time_range.start) if counted(e)]


def classifier_part(name: str, module: nn.Module):
    """The range a module of an ImageNet classifier opens, by what it is rather than by its name,
    so that ours and the authors' models (``benchmark_authors.py --profile``) split alike:
    ``attn`` (the innermost attention module: projections, core, local residual, LePE, RoPE,
    reshapes), ``local`` (our local residual, inside ``attn``), ``ffn``, ``norm``, ``embed`` (stem,
    patch embedding, downsampling) and ``head`` (pooling, classification neck and head);
    everything else (residual adds, CPE, layout changes between blocks) is ``other``."""
    cls = type(module).__name__
    last = name.rsplit('.', 1)[-1]
    if not name:
        return None
    if cls == 'LocalResidual':
        return 'local'
    if _is_attention(module):
        return 'attn' if not any(_is_attention(m) for m in module.modules() if m is not module) \
            else None
    if isinstance(module, _NORMS) or 'Norm' in cls:
        return 'norm'
    if cls in ('Mlp', 'FFN', 'ConvFFN', 'MLP', 'FeedForwardNetwork') or last in ('mlp', 'ffn'):
        return 'ffn'
    if any(s in cls for s in ('Embed', 'Merging', 'Downsample', 'Stem')) or \
            last in ('downsample', 'patch_embed'):
        return 'embed'
    if name in ('head', 'neck') or cls in ('LinearClsHead', 'GlobalAveragePooling',
                                           'MAViTClsNeck'):
        return 'head'
    return None


def profile_parts(model: nn.Module, loss_fn, optim, part=classifier_part,
                  cores: bool = False) -> dict:
    """One training step ``loss_fn(model).backward(); optim.step()`` under the profiler, charged
    to the ranges ``part(name, module)`` opens (forward / backward ms per range path, as
    :func:`profile_step`), plus the step's self time by kind of operator
    (:func:`op_kind`). ``cores``: also a range around each of our attention cores."""
    ranges = _Ranges()
    undo = _hook_ranges(model, part, ranges)
    if cores:
        from mmlinattn.core.ops import cores as core_ops
        undo.append(_wrap(core_ops.Core, 'run', lambda a: 'core:' + a[0].name, ranges))
    model.train()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            with torch.profiler.record_function('step:forward'):
                loss = loss_fn(model)
            t1 = time.perf_counter()
            with torch.profiler.record_function('step:backward'):
                loss.backward()
            t2 = time.perf_counter()
            with torch.profiler.record_function('step:optimizer'):
                optim.step()
                optim.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
    finally:
        for u in undo:
            u()
    fwd, bwd = _charge(prof.events())
    kinds = defaultdict(float)
    for e in prof.key_averages():
        if e.key.startswith(('range:', 'step:', 'autograd::engine', 'ProfilerStep')):
            continue
        kinds[op_kind(e.key)] += e.self_cpu_time_total / 1e3
    rows = [dict(path=p, fwd_ms=round(fwd.get(p, 0.), 1), bwd_ms=round(bwd.get(p, 0.), 1))
            for p in sorted(set(fwd) | set(bwd))]
    return dict(forward_s=round(t1 - t0, 3), backward_s=round(t2 - t1, 3),
                optimizer_s=round(t3 - t2, 3), rows=rows,
                op_kinds={k: round(v, 1) for k, v in sorted(kinds.items())})


_OP_KINDS = (
    ('GEMM', ('mm', 'addmm', 'bmm', 'baddbmm', 'matmul', 'linear', 'addbmm')),
    ('softmax attention (SDPA)', ('_scaled_dot_product', 'scaled_dot_product', 'softmax',
                                  '_softmax')),
    ('convolution (incl. depthwise)', ('conv', 'convolution', 'mkldnn_convolution',
                                       '_convolution', 'thnn_conv')),
    ('norms', ('layer_norm', 'batch_norm', 'group_norm', 'native_layer_norm',
               'native_batch_norm')),
    ('layout copies', ('copy_', 'clone', 'contiguous', 'cat', 'index', 'roll', 'index_select',
                       'gather', 'scatter', 'im2col', 'col2im', 'unfold', 'fill_', 'zero_',
                       'zeros', 'stack', 'flip', 'constant_pad_nd', 'pad')),
    ('reductions', ('sum', 'mean', 'norm', 'linalg_vector_norm', 'max', 'amax')),
    ('activations', ('gelu', 'silu', 'relu', 'sigmoid', 'hardswish', 'elu', 'tanh')),
    ('optimizer', ('_foreach', 'addcdiv', 'lerp')),
)


def op_kind(name: str) -> str:
    """The kind of an aten operator (forward or backward) for the step's by-operator split."""
    op = name.split('::', 1)[-1]
    base = op[:-len('_backward')] if op.endswith('_backward') else op
    for kind, names in _OP_KINDS:
        for n in names:
            if base == n or base.startswith(n + '_') or (len(n) > 3 and n in base):
                return kind
    if op in ('add', 'add_', 'mul', 'mul_', 'sub', 'rsub', 'div', 'div_', 'neg', 'pow', 'exp',
              'where', 'masked_fill', 'masked_fill_', 'threshold_backward', 'sub_', 'addcmul_',
              'reciprocal', 'rsqrt', 'clamp', 'clamp_min'):
        return 'element-wise (adds, scales)'
    return 'other'
