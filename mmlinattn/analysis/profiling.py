"""Where a training step's time and saved memory go, by model part (``benchmark_step.py --profile``;
docs/benchmarks.md section 8; a classifier's split as section 12's), and passes over memory
(``benchmark_attention.py --passes``). Forward time is each operator's self time, in the innermost
named range it ran in; backward time goes to the range whose forward made the autograd node (the
profiler records its sequence number on both); saved memory is what autograd packs while a range
is open, each storage once.
"""
import contextlib
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
_HEADS = ('neck', 'rpn_head', 'bbox_head', 'decode_head', 'auxiliary_head')


def _is_attention(module: nn.Module) -> bool:
    cls = type(module).__name__
    return 'Attention' in cls or cls.endswith('MSA')


def classifier_part(name: str, module: nn.Module):
    """The range a module opens, by what it is, so that ours and the authors' classifiers split
    alike: ``attn`` (innermost attention module), ``local``, ``ffn``, ``norm``, ``embed``,
    ``head``; None (``other``) for the rest."""
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


def detector_part(name: str, module: nn.Module):
    """The range a detector's / segmentor's module opens: the backbone, its stages ``s1``-``s4``
    and parts (as :func:`classifier_part`), the neck and the heads; None: none of its own."""
    if name == 'backbone':
        return 'backbone'
    if name.startswith('backbone.'):
        stage = _STAGE_OF_BLOCK.fullmatch(name[len('backbone.'):])
        if stage:  # every block opens its stage's range (stage modules are not always called)
            return f's{int(stage.group(1) or stage.group(2)) + (0 if stage.group(2) else 1)}'
        part = classifier_part(name[len('backbone.'):], module)
        return None if part == 'head' else part
    parts = name.split('.')
    if name in _HEADS:
        return name
    # its loss() calls these, never roi_head itself; a cascade's are each stage's (bbox_head.0, ...)
    if parts[0] == 'roi_head' and (len(parts) == 2 or len(parts) == 3 and parts[2].isdigit()):
        return 'roi_head'
    return None


class _Ranges:
    """record_function ranges opened / closed by module hooks, the current path kept on a stack."""

    def __init__(self):
        self.stack, self.open, self.seen = [], [], set()
        self.saved: Dict[str, int] = defaultdict(int)

    def path(self):
        return '/'.join(self.stack) or 'other'

    def enter(self, kind):
        self.stack.append(kind)
        self.open.append(torch.profiler.record_function('range:' + self.path()))
        self.open[-1].__enter__()

    def exit(self):
        self.open.pop().__exit__(None, None, None)
        self.stack.pop()

    def pack(self, t):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in self.seen:
            self.seen.add(key)
            self.saved[self.path()] += key[1]
        return t

    def wrap(self, owner, attr, kind):
        """A range ``kind`` (or ``kind(args)``) around every call of ``owner.attr``; the undo."""
        fn = getattr(owner, attr)

        def wrapped(*args, **kwargs):
            self.enter(kind(args) if callable(kind) else kind)
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit()
        setattr(owner, attr, wrapped)
        return lambda: setattr(owner, attr, fn)

    def hook(self, model: nn.Module, part) -> list:
        """Hooks opening the range ``part(name, module)`` around each module; their removers."""
        undo = []
        for name, module in model.named_modules():
            kind = part(name, module)
            if kind is not None:
                undo.append(module.register_forward_pre_hook(
                    lambda m, a, kind=kind: self.enter(kind)).remove)
                undo.append(module.register_forward_hook(lambda m, a, o: self.exit()).remove)
        return undo


def _charge(events):
    """(forward ms, backward ms) per range path from the profiler's events."""
    fwd, bwd = defaultdict(float), defaultdict(float)
    seq_range = {}

    def ancestors(e):
        p = e.cpu_parent
        while p is not None:
            yield p.name
            p = p.cpu_parent

    def range_of(e):
        for name in ancestors(e):
            if name.startswith('range:'):
                return name[len('range:'):]
            if name == 'step:backward':
                return None
        return 'other'

    for e in events:
        if e.name.startswith('range:') and 'step:forward' in ancestors(e):
            # the range's own time: the Python between its operators
            fwd[e.name[len('range:'):]] += e.self_cpu_time_total / 1e3
        elif not e.name.startswith(('step:', 'range:', 'autograd::engine')) and \
                'step:forward' in ancestors(e):
            where = range_of(e)
            fwd[where] += e.self_cpu_time_total / 1e3
            if getattr(e, 'sequence_nr', -1) >= 0:
                seq_range.setdefault(e.sequence_nr, where)
    for e in events:
        if e.name.startswith('autograd::engine::evaluate_function') and \
                'step:backward' in ancestors(e):
            bwd[seq_range.get(getattr(e, 'sequence_nr', -1), 'other')] += e.cpu_time_total / 1e3
    return fwd, bwd


def profile_parts(model: nn.Module, loss_fn, optim, part=classifier_part, cores: bool = False,
                  rope: bool = False, saved: bool = False) -> dict:
    """One profiled training step ``loss_fn(model).backward(); optim.step()``: forward / backward ms
    per range path of ``part(name, module)``, wall times, self time by operator kind; ``cores`` /
    ``rope``: ranges around our cores / RoPE; ``saved``: the bytes saved per range."""
    from mmlinattn.core.ops import attention as attention_ops
    from mmlinattn.core.ops import cores as core_ops
    ranges = _Ranges()
    undo = ranges.hook(model, part)
    if cores:
        undo.append(ranges.wrap(core_ops.Core, 'run', lambda a: 'core:' + a[0].name))
    for owner in (attention_ops, core_ops) if rope else ():
        if hasattr(owner, 'apply_rope'):
            undo.append(ranges.wrap(owner, 'apply_rope', 'rope'))
    model.train()
    pack = torch.autograd.graph.saved_tensors_hooks(ranges.pack, lambda t: t) if saved else \
        contextlib.nullcontext()
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            with torch.profiler.record_function('step:forward'), pack:
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
        if not e.key.startswith(('range:', 'step:', 'autograd::engine', 'ProfilerStep')):
            kinds[op_kind(e.key)] += e.self_cpu_time_total / 1e3
    rows = [dict(path=p, fwd_ms=round(fwd.get(p, 0.), 1), bwd_ms=round(bwd.get(p, 0.), 1),
                 **(dict(saved_mb=round(ranges.saved.get(p, 0) / 2 ** 20, 1)) if saved else {}))
            for p in sorted(set(fwd) | set(bwd) | set(ranges.saved))]
    return dict(forward_s=round(t1 - t0, 3), backward_s=round(t2 - t1, 3),
                optimizer_s=round(t3 - t2, 3), rows=rows,
                saved_mb=round(sum(ranges.saved.values()) / 2 ** 20, 1),
                op_kinds={k: round(v, 1) for k, v in sorted(kinds.items())})


def profile_step(config, ref=None, device='cpu', batch=None, size=None, warmup=1) -> dict:
    """:func:`profile_parts` of one warm training step of ``config`` (with a reference backbone)."""
    bench = bench_model(config, ref, device, False, batch, size)
    for _ in range(warmup):
        bench.train_step()
    data = bench.model.data_preprocessor(bench.make(bench.n, bench.train_hw), True)
    res = profile_parts(bench.model, lambda m: m.parse_losses(m(**data, mode='loss'))[0],
                        bench.optim, detector_part, cores=True, rope=True, saved=True)
    return dict(config=config, backbone=ref or bench.cfg.model.backbone.type, batch=bench.n,
                train_hw=list(bench.train_hw), threads=torch.get_num_threads(), **res)


def _group(path: str) -> str:
    """The table's row of a range path: the backbone by part (stages together), the rest by head."""
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
            for j, k in enumerate(('fwd_ms', 'bwd_ms', 'saved_mb')):
                g[j] += r[k]
    out = ['| part | ' + ' | '.join(f"{r['backbone']}: fwd / bwd ms, saved MB" for r in results)
           + ' |', '|---' * (len(results) + 1) + '|']
    for g in sorted(groups, key=lambda g: (not g.startswith('backbone'), g)):
        out.append(f'| {g} | ' + ' | '.join('{:.0f} / {:.0f}, {:.0f}'.format(
            *groups[g].get(i, (0., 0., 0.))) for i in range(len(results))) + ' |')
    out.append('| **step (wall)** | ' + ' | '.join(
        f"{r['forward_s'] * 1e3:.0f} / {r['backward_s'] * 1e3:.0f}, {r['saved_mb']:.0f}"
        for r in results) + ' |')
    out.append('| optimizer step (wall ms) | ' +
               ' | '.join(f"{r['optimizer_s'] * 1e3:.0f}" for r in results) + ' |')
    return '\n'.join(out)


# ops that move no data (views, allocations, no-op casts) and RoPE's pair shuffle, not counted
_NOT_PASSES = frozenset(f'aten::{n}' for n in (
    'alias', 'transpose', 't', 'reshape', 'view', '_unsafe_view', 'slice', 'select', 'as_strided',
    'unsqueeze', 'squeeze', 'expand', 'flatten', 'unflatten', 'unbind', 'detach', 'to', 'empty',
    'empty_like', 'new_empty', 'empty_strided', 'stack'))


def count_passes(fn, n: int, d: int) -> List[str]:
    """The passes over (n x d) memory of one call of ``fn()``, in call order: the outermost aten ops
    (not under another aten op) with an input whose last two dims are (n, d) or (d, n); views,
    allocations and (n x 1) ops are not passes. Pick n and d unlike every other size of the call."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        fn()

    def counted(e) -> bool:
        top = e.cpu_parent is None or not e.cpu_parent.name.startswith('aten::')
        return (top and e.name.startswith('aten::') and e.name not in _NOT_PASSES
                and any(isinstance(s, list) and len(s) >= 2 and s[-2:] in ([n, d], [d, n])
                        for s in e.input_shapes))
    return [e.name for e in sorted(prof.events(), key=lambda e: e.time_range.start) if counted(e)]


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
_ELEMENTWISE = ('add', 'add_', 'mul', 'mul_', 'sub', 'rsub', 'div', 'div_', 'neg', 'pow', 'exp',
                'where', 'masked_fill', 'masked_fill_', 'threshold_backward', 'sub_', 'addcmul_',
                'reciprocal', 'rsqrt', 'clamp', 'clamp_min')


def op_kind(name: str) -> str:
    """The kind of an aten operator (forward or backward) for the step's by-operator split."""
    op = name.split('::', 1)[-1]
    base = op[:-len('_backward')] if op.endswith('_backward') else op
    for kind, names in _OP_KINDS:
        if any(base == n or base.startswith(n + '_') or (len(n) > 3 and n in base) for n in names):
            return kind
    return 'element-wise (adds, scales)' if op in _ELEMENTWISE else 'other'
