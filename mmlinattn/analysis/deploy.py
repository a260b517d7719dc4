"""ONNX export of a model's backbone, backbone + neck or whole segmentor, and its check against
eager PyTorch with ONNX Runtime (CPU): the functions under ``tools/deployment/export_onnx.py``
(docs/deployment.md). :func:`export` and :func:`check` need requirements/deploy.txt.
"""
import logging
import math
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

PARTS = ('backbone', 'neck', 'model')
INPUT_NAME = 'input'
DEFAULT_RTOL = 1e-4
DEFAULT_OPSET = 18
JIT_OPSET = 17  # the highest the jit exporter of torch 2.1 writes
EXPORTERS = ('dynamo', 'jit')


class ExportError(ValueError):
    """A part or shape that cannot be exported as asked; the message says what to change."""


def build_model(cfg, checkpoint: Optional[str] = None) -> nn.Module:
    """The config's model in eval mode on the CPU, SyncBN reverted to BN: the whole-model
    ``checkpoint`` loaded (read once; it must fit key for key), else a random initialisation (no
    ImageNet ``init_cfg``)."""
    from mmengine.logging import MMLogger

    from mmlinattn.core.weights import check_model_checkpoint, extract_state_dict, read_checkpoint

    from .benchmarking import build_untrained
    backbone = cfg.model.get('backbone')
    model = build_untrained(cfg)
    if checkpoint:
        obj = read_checkpoint(checkpoint)
        check_model_checkpoint(model, checkpoint, obj=obj, what='checkpoint', backbone_cfg=backbone,
                               allow_attention_change=bool(cfg.get('allow_attention_change')))
        model.load_state_dict(extract_state_dict(obj, path=checkpoint))
        return model.eval()
    # init_weights without mmengine's one log record per parameter
    logger = MMLogger.get_current_instance()
    level, _ = logger.level, logger.setLevel(logging.WARNING)
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)
    return model.eval()


class Exportable(nn.Module):
    """The exported ``part`` of ``model``: from the normalised image to a tuple of tensors."""

    def __init__(self, model: nn.Module, part: str):
        super().__init__()
        if part not in PARTS:
            raise ExportError(f'--part must be one of {PARTS}, got {part!r}')
        mro = [c.__module__.split('.')[0] for c in type(model).__mro__]
        kind = ('segmentor' if 'mmseg' in mro and hasattr(model, 'encode_decode') else
                'detector' if 'mmdet' in mro else type(model).__name__)
        if not hasattr(model, 'backbone'):
            raise ExportError(f'{type(model).__name__} has no backbone to export')
        if part == 'neck' and not getattr(model, 'with_neck', False):
            raise ExportError(f'{type(model).__name__} of this config has no neck: export --part '
                              'backbone' + (' or --part model' if kind == 'segmentor' else ''))
        if part == 'model' and kind != 'segmentor':
            if kind == 'detector':
                raise ExportError(
                    'the whole detector is not exported: its RoI heads, box decoding and NMS are '
                    "mmdeploy's job (its rewriters and custom ops). Export the backbone + neck "
                    '(--part neck) and run the heads there.')
            raise ExportError(f'--part model exports mmseg segmentors (EncoderDecoder) only, not '
                              f'{type(model).__name__}: use --part backbone')
        self.model, self.part, self.kind = model, part, kind
        self.train(model.training)  # the jit exporter restores this mode on every submodule

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if self.part != 'model':
            return self.features(x)
        # mmseg's encode_decode: extract_feat + decode head, resized to img_shape (a torch.Size is
        # used as the size as it is, so the traced graph resizes to the input's own height / width)
        return (self.model.encode_decode(x, [dict(img_shape=x.shape[2:])]),)

    def output_names(self, n: int) -> List[str]:
        if self.part == 'model':
            return ['seg_logits']
        return [('out' if self.part == 'backbone' else 'neck') + str(i) for i in range(n)]

    def features(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The backbone's outputs (``part='backbone'``), else ``extract_feat``'s."""
        model = self.model
        return tuple(model.backbone(x) if self.part == 'backbone' else model.extract_feat(x))


@dataclass
class SizeRule:
    """The input sizes one dynamic graph serves, per side: multiples of ``multiple`` in
    ``[low, high]`` (``high`` None: no upper bound); ``why`` lists the reasons, for messages."""
    multiple: int = 1
    low: Tuple[int, int] = (1, 1)
    high: Tuple[Optional[int], Optional[int]] = (None, None)
    why: List[str] = field(default_factory=list)

    def side(self, i: int) -> str:
        hi = self.high[i]
        m = f'a multiple of {self.multiple}, ' if self.multiple > 1 else ''
        return f'{m}>= {self.low[i]}' + (f' and <= {hi}' if hi is not None else '')

    def text(self) -> str:
        return (f'height {self.side(0)}; width {self.side(1)} ({"; ".join(self.why)})')

    def allows(self, shape: Sequence[int]) -> bool:
        return all(s % self.multiple == 0 and s >= self.low[i] and
                   (self.high[i] is None or s <= self.high[i]) for i, s in enumerate(shape))

    def check(self, shape: Sequence[int], what: str = 'shape') -> None:
        if not self.allows(shape):
            raise ExportError(f'{what} {shape[0]}x{shape[1]} is outside the size rule of this '
                              f'dynamic export: {self.text()}')

    def dims(self):
        """torch.export dims of height and width (a multiple of m: m times a dim of its own)."""
        from torch.export import Dim
        m = self.multiple
        return [Dim(name, min=lo, max=hi) if m == 1 else
                m * Dim(f'{name}_{m}', min=-(-lo // m), max=None if hi is None else hi // m)
                for name, lo, hi in zip(('height', 'width'), self.low, self.high)]

    def near(self, shape: Sequence[int]) -> Tuple[int, int]:
        """A second shape for the parity check: ``shape`` + (64, 32) on the rule's grid, clamped."""
        def grid(v):
            return int(math.ceil(v / self.multiple)) * self.multiple
        out = []
        for s, step, lo, hi in zip(shape, (64, 32), self.low, self.high):
            v = grid(s + step)
            out.append(max(grid(s - step) if hi is not None and v > hi else v, grid(lo)))
        return tuple(out)


def _windowed_stages(backbone) -> List[Tuple[int, int]]:
    """InLine-Swin: (stride, window) of every stage with windowed attention."""
    out = []
    patch = backbone.patch_embed.patch
    for s, layer in enumerate(backbone.layers):
        for blk in layer.blocks:
            win = blk.window_size if blk.windowed else blk.inline_window
            if win is not None:
                out.append((patch * 2 ** s, int(win)))
                break
    return out


def dynamic_blockers(wrapper: Exportable) -> List[str]:
    """What in the exported part cannot take a dynamic height / width (known cases, found before a
    long export fails): adaptive pooling to more than 1 x 1, upsampling by a scale factor."""
    model = wrapper.model
    parts = [('backbone', model.backbone)]
    if wrapper.part in ('neck', 'model') and getattr(model, 'with_neck', False):
        parts.append(('neck', model.neck))
    if wrapper.part == 'model':
        parts.append(('decode_head', model.decode_head))
    found = []
    for prefix, module in parts:
        for name, m in module.named_modules(prefix=prefix):
            if isinstance(m, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)) and \
                    m.output_size not in (1, (1, 1), None):
                found.append(f'{name}: adaptive pooling to {m.output_size} (no ONNX form for a '
                             'dynamic input size)')
            elif type(m).__name__ == 'Upsample' and getattr(m, 'scale_factor', None) and \
                    getattr(m, 'size', None) is None:
                found.append(f'{name}: upsampling by the scale factor {m.scale_factor} '
                             '(its output size is computed in Python: torch.export cannot relate '
                             'it to the other levels\', the jit fixes it at the example\'s)')
    return found


def size_rule(wrapper: Exportable, shape: Sequence[int]) -> SizeRule:
    """The size rule of a dynamic export of ``wrapper`` from the example ``shape`` (H, W); raises
    :class:`ExportError` if ``shape`` itself breaks it."""
    from mmlinattn.core.models import InLineSwin
    backbone = wrapper.model.backbone
    rule = SizeRule()
    if isinstance(backbone, InLineSwin):
        rule.multiple = backbone.patch_embed.patch * 2 ** (len(backbone.layers) - 1)
        rule.why.append(f'InLine-Swin: a multiple of {rule.multiple}, so that nothing is padded')
    # every feature map at least 2 x 2 (torch.export specialises sizes 0 and 1)
    with torch.no_grad():
        feats = wrapper.features(torch.zeros(1, 3, *shape))
    stride = max(max(round(shape[0] / f.shape[-2]), round(shape[1] / f.shape[-1])) for f in feats)
    low = max(2 * stride, rule.multiple)
    rule.low = (low, low)
    rule.why.append(f'>= 2 x the largest feature stride ({stride})')
    if isinstance(backbone, InLineSwin):
        lows, highs = [low, low], [None, None]
        for stride_s, win in _windowed_stages(backbone):
            edge = stride_s * win  # the stage's map is one window per side up to this input size
            for i in range(2):
                if shape[i] <= edge:
                    highs[i] = edge if highs[i] is None else min(highs[i], edge)
                else:
                    lows[i] = max(lows[i], edge + 1)
            rule.why.append(f'the {win}x{win} windows of the stage at stride {stride_s}: one '
                            f'window per side up to {edge} px, several above, fixed by the example')
        rule.low = tuple(-(-v // rule.multiple) * rule.multiple for v in lows)
        rule.high = tuple(highs)
    rule.check(shape, 'the example shape')
    return rule


def dynamic_rule(wrapper: Exportable, shape: Sequence[int]) -> SizeRule:
    """The size rule of a dynamic export of ``wrapper`` from the example ``shape``; raises
    :class:`ExportError` where the part cannot take a dynamic size (:func:`dynamic_blockers`) or
    ``shape`` breaks the rule. Runs one forward; writes nothing."""
    blockers = dynamic_blockers(wrapper)
    if blockers:
        shown = '; '.join(blockers[:3]) + (f'; ... ({len(blockers)} in all)'
                                           if len(blockers) > 3 else '')
        raise ExportError(f'this {wrapper.part} cannot be exported with a dynamic height / '
                          f'width: {shown}. Export without --dynamic, one file per input size.')
    return size_rule(wrapper, shape)


def example_input(shape: Sequence[int], batch: int = 1, seed: int = 0) -> torch.Tensor:
    """A normalised-image-like input: standard normal values."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, *shape, generator=g)


def default_exporter() -> str:
    """``'dynamo'`` where this torch has it (torch >= 2.5), else ``'jit'``."""
    from mmlinattn.core.ops import probes
    return 'dynamo' if probes.has_export() else 'jit'


def export(wrapper: Exportable, shape: Sequence[int], out: str, dynamic: bool = False,
           batch: int = 1, opset: Optional[int] = None, meta: Optional[dict] = None,
           exporter: Optional[str] = None, rule: Optional[SizeRule] = None) -> Optional[SizeRule]:
    """Export ``wrapper`` at ``shape`` (H, W) to the ONNX file ``out`` with ``exporter`` (default
    :func:`default_exporter`); returns the size rule of a dynamic export (None for a static one),
    ``rule`` if given (:func:`dynamic_rule`'s, computed by the caller).
    Both exporters serve the same rule: the jit records the sizes' arithmetic (the models keep
    sizes as traced values) and fixes what Python branches on, which the rule keeps constant."""
    from mmlinattn.core.ops import probes
    exporter = exporter or default_exporter()
    if exporter not in EXPORTERS:
        raise ExportError(f'exporter must be one of {EXPORTERS}, got {exporter!r}')
    if exporter == 'dynamo' and not probes.has_export():
        raise ExportError(f'the dynamo exporter needs torch.export with dynamic shapes and '
                          f'torch.onnx.export(dynamo=True) (torch >= 2.5); this is torch '
                          f'{torch.__version__}: use the jit exporter (--exporter jit)')
    opset = opset or (DEFAULT_OPSET if exporter == 'dynamo' else JIT_OPSET)
    import onnx
    x = example_input(shape, batch)
    rule = (rule or dynamic_rule(wrapper, shape)) if dynamic else None
    with torch.no_grad():
        names = wrapper.output_names(len(wrapper(x)))
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    if exporter == 'jit':
        _export_jit(wrapper, x, out, names, opset, dynamic)
    else:
        _export_dynamo(wrapper, x, out, names, opset, rule)
    model = onnx.load(out)
    onnx.helper.set_model_props(model, {
        **{p.key: p.value for p in model.metadata_props}, **(meta or {}),
        'mmlinattn.part': wrapper.part, 'mmlinattn.exporter': exporter,
        'mmlinattn.input': f'{INPUT_NAME}: normalised image (B, 3, H, W), float32',
        'mmlinattn.size_rule': rule.text() if rule else f'static {batch}x3x{shape[0]}x{shape[1]}'})
    onnx.save(model, out)
    return rule


def _export_jit(wrapper: Exportable, x: torch.Tensor, out: str, names: List[str], opset: int,
                dynamic: bool) -> None:
    """The legacy exporter: ``torch.onnx.export`` tracing with the jit (``dynamic``: height and
    width of the input and of every output as named dynamic axes)."""
    import inspect
    import warnings
    axes = {INPUT_NAME: {2: 'height', 3: 'width'},
            **{n: {2: f'{n}_height', 3: f'{n}_width'} for n in names}} if dynamic else None
    kw = {'dynamo': False} if 'dynamo' in inspect.signature(torch.onnx.export).parameters else {}
    with torch.no_grad(), warnings.catch_warnings():
        # the jit's TracerWarnings name each Python branch on a size: the size rule keeps every
        # one of them constant (tests/test_deploy_jit.py checks parity at a second size)
        warnings.filterwarnings('ignore', category=torch.jit.TracerWarning)
        warnings.filterwarnings('ignore', message='.*legacy TorchScript-based ONNX export')
        torch.onnx.export(wrapper, (x,), out, input_names=[INPUT_NAME], output_names=names,
                          dynamic_axes=axes, opset_version=opset, **kw)


def _export_dynamo(wrapper: Exportable, x: torch.Tensor, out: str, names: List[str], opset: int,
                   rule: Optional[SizeRule]) -> None:
    """torch.export within ``rule`` (None: static), then ``torch.onnx.export(dynamo=True)``."""
    dynamic_shapes = (dict(zip((2, 3), rule.dims())),) if rule else None
    with torch.no_grad():
        try:
            program = torch.export.export(wrapper, (x,), dynamic_shapes=dynamic_shapes,
                                          strict=False)
        except torch._dynamo.exc.UserError as e:  # a guard the size rule did not foresee
            raise ExportError(
                f'torch.export could not keep height / width dynamic within the size rule '
                f'({rule.text() if rule else "static"}); a part of the model fixes them (below). '
                'Export without --dynamic, one file per input size.\n'
                + '\n'.join(str(e).splitlines()[:6])) from None
    torch.onnx.export(program, (x,), input_names=[INPUT_NAME], output_names=names,
                      opset_version=opset, dynamo=True, external_data=False,
                      verbose=False).save(out, external_data=False)


def ort_session(path: str, threads: Optional[int] = None):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=['CPUExecutionProvider'])


def compare(onnx_outs, eager_outs, names, rtol: float = DEFAULT_RTOL) -> List[dict]:
    """Per output: shape, largest absolute error, largest error relative to the output's largest
    magnitude, and whether ``|onnx - eager| <= rtol * (|eager| + max|eager|)`` holds everywhere."""
    import numpy as np
    rows = []
    for name, o, e in zip(names, onnx_outs, eager_outs):
        e = e.detach().float().numpy()
        if o.shape != e.shape:
            rows.append(dict(output=name, shape=list(e.shape), onnx_shape=list(o.shape), ok=False,
                             max_abs=float('nan'), max_rel=float('nan')))
            continue
        scale, err = float(np.abs(e).max()) or 1.0, np.abs(o - e)
        rows.append(dict(output=name, shape=list(e.shape), max_abs=float(err.max()),
                         max_rel=float(err.max() / scale),
                         ok=bool((err <= rtol * (np.abs(e) + scale)).all())))
    return rows


def check(path: str, wrapper: Exportable, shapes: Sequence[Sequence[int]], batch: int = 1,
          rtol: float = DEFAULT_RTOL, seed: int = 1) -> List[dict]:
    """ONNX Runtime (CPU) against eager PyTorch at each shape: one :func:`compare` row per output
    and shape."""
    sess = ort_session(path)
    names = [o.name for o in sess.get_outputs()]
    rows = []
    for shape in shapes:
        x = example_input(shape, batch, seed)
        with torch.no_grad():
            eager = wrapper(x)
        rows += [dict(r, input=list(shape)) for r in
                 compare(sess.run(None, {INPUT_NAME: x.numpy()}), eager, names, rtol)]
    return rows


def format_rows(rows: List[dict]) -> str:
    return '\n'.join([f'{"input":>11} | {"output":>10} | {"shape":>22} | {"max abs err":>11} | '
                      f'{"max rel err":>11} | ok'] + [
        f'{"x".join(map(str, r["input"])):>11} | {r["output"]:>10} | '
        f'{"x".join(map(str, r["shape"])):>22} | {r["max_abs"]:11.2e} | '
        f'{r["max_rel"]:11.2e} | {"yes" if r["ok"] else "NO"}' for r in rows])
