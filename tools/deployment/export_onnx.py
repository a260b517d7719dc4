"""Export a config's backbone, backbone + neck, or whole segmentor to ONNX, and check the file
against eager PyTorch with ONNX Runtime (CPU).

    python tools/deployment/export_onnx.py CONFIG [CHECKPOINT] --shape H W --part backbone \
        --out work_dirs/onnx/backbone.onnx [--dynamic] [--check-shape H W ...] \
        [--cfg-options k=v ...]

* ``--part backbone``: the backbone's outputs, in its ``out_indices`` order (``out0``, ``out1``,
  ...);
* ``--part neck``: backbone + neck (``model.extract_feat``), the neck's outputs in order (``neck0``,
  ...): detectors (FPN) and segmentors that have a neck;
* ``--part model``: a whole segmentor (mmseg ``EncoderDecoder``, through the decode head), one
  output ``seg_logits`` (B, classes, H, W): the decode head's logits **resized to the input size**
  (bilinear, the head's ``align_corners``), i.e. mmseg's ``encode_decode``, before the argmax and
  before any crop / resize back to the original image. A detector's RoI heads, box decoding and NMS
  are not exported: that is mmdeploy's job (its rewriters and custom ops); export ``--part neck``
  and run the heads there.

The graph's input ``input`` is the *normalised* image tensor (B, 3, H, W), float32: the data
preprocessor (mean / std, BGR -> RGB, padding) stays outside the graph, as in mmdeploy. Without a
CHECKPOINT the weights are a random initialisation (enough to check an export).

Two exporters (``--exporter``): ``dynamo`` (torch.export, then
``torch.onnx.export(dynamo=True)``; the default where torch >= 2.5 has it) and ``jit``
(``torch.onnx.export`` tracing with the jit, opset 17: the route mmdeploy takes, and the default
before torch 2.5). Both take ``--dynamic`` within the same size rule and are checked the same
way.

``--dynamic`` makes height and width dynamic (the batch stays fixed: InLine's local residual is one
grouped convolution with B x C groups, a static attribute in ONNX). Every family exports dynamic
sizes, within a size rule that the tool works out, prints and writes into the ONNX file's metadata
(``mmlinattn.size_rule``); ONNX Runtime does not check it, so inputs outside the rule give wrong
results or a shape error:

* every side at least twice the largest output stride (smaller maps make 1 x 1 feature maps, which
  torch.export treats as a special case);
* InLine-Swin: sides a multiple of 32 (no padding before the patch embedding, the patch merging or
  the windows), and every stage with windowed attention (Swin's 7 x 7 softmax windows, or InLine's
  literal windows with ``inline_window``) on the same side of "one window" as the example shape:
  at most one window per side, or more than one (window branch and shift are fixed in the graph).
  InLine-Swin-T (stage 4 softmax) exports 64-224 px from an example <= 224, or >= 256 px from an
  example >= 256.

A shape outside the rule is refused with the rule in the message. By default the file is checked
with ONNX Runtime at ``--shape`` and, with ``--dynamic``, at a second shape (``--check-shape``,
default H + 64 x W + 32 rounded to the rule): every output must match eager PyTorch within
``--rtol`` (1e-4) relative to its largest value (``|onnx - eager| <= rtol * (|eager| +
max|eager|)``); the tool prints the largest absolute and relative errors and exits 1 if an output
does not match.
"""
import argparse
import os.path as osp
import sys
import time

import mmlinattn  # noqa: F401  (registers the backbones)
from mmlinattn.core import settings
from mmlinattn.core.weights import CheckpointError
from mmlinattn.training.cli import load_config
from mmlinattn.training.config import ConfigError
from mmlinattn.training.preflight import CfgOptionsAction
from tools.workshop.deploy import (
    DEFAULT_OPSET,
    DEFAULT_RTOL,
    EXPORTERS,
    JIT_OPSET,
    PARTS,
    Exportable,
    ExportError,
    build_model,
    check,
    default_exporter,
    export,
    format_rows,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config', help='config file (mmdet, mmseg or mmpretrain)')
    p.add_argument('checkpoint', nargs='?', help='whole-model checkpoint (default: random weights)')
    p.add_argument('--shape', type=int, nargs=2, required=True, metavar=('H', 'W'),
                   help='input height and width of the export (the example for --dynamic)')
    p.add_argument('--part', choices=PARTS, default='backbone')
    p.add_argument('--out', required=True, help='the ONNX file to write')
    p.add_argument('--dynamic', action='store_true',
                   help='dynamic height and width (see the size rule)')
    p.add_argument('--batch', type=int, default=1, help='batch size (static)')
    p.add_argument('--check-shape', type=int, nargs=2, action='append', metavar=('H', 'W'),
                   help='further input sizes to check with ONNX Runtime (--dynamic: default one '
                        'near --shape); repeatable')
    p.add_argument('--no-check', action='store_true', help='skip the ONNX Runtime check')
    p.add_argument('--rtol', type=float, default=DEFAULT_RTOL)
    p.add_argument('--exporter', choices=EXPORTERS, default=None,
                   help=f'dynamo or jit (default: {default_exporter()} on this torch)')
    p.add_argument('--opset', type=int, default=None,
                   help=f'ONNX opset (default: {DEFAULT_OPSET} with dynamo, {JIT_OPSET} with jit)')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction,
                   help='override config settings, key=value')
    return p.parse_args(argv)


def check_args(args) -> None:
    """:class:`ExportError` for arguments no export can take, before any work: a size that is not
    positive (``--shape``, ``--check-shape``, ``--batch``), and an ``--out`` that is a folder or
    whose folder cannot be written (else found only after the export)."""
    for flag, shape in [('--shape', args.shape)] + [('--check-shape', s)
                                                    for s in args.check_shape or []]:
        if min(shape) < 1:
            raise ExportError(f'{flag} {shape[0]} {shape[1]}: height and width must be positive '
                              '(pixels), e.g. --shape 512 512')
    if args.batch < 1:
        raise ExportError(f'--batch {args.batch}: the batch size must be at least 1')
    check_out(args.out)


def check_out(out: str) -> None:
    """:class:`ExportError` unless a file can be written at ``out``: ``out`` is no folder, the
    nearest existing folder on its path is a folder (not a file) and a file can be created in it
    (a probe file, removed at once; root passes permission bits, not a read-only file system)."""
    import os
    import tempfile
    path = osp.abspath(out)
    if osp.isdir(path):
        raise ExportError(f'--out {out} is a folder; give the ONNX file to write, e.g. '
                          f'{osp.join(out, "model.onnx")}')
    existing = osp.dirname(path)
    while not osp.exists(existing) and osp.dirname(existing) != existing:
        existing = osp.dirname(existing)
    if not osp.isdir(existing):
        raise ExportError(f'--out {out}: its folder cannot be created, {existing} is a file; give '
                          '--out a path in a folder you can write')
    try:
        fd, probe = tempfile.mkstemp(prefix='.export_onnx-write-test-', dir=existing)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ExportError(f'--out {out}: cannot write in {existing} ({e.strerror or e}); give '
                          '--out a path in a folder you can write') from None


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)  # before any work: a bad size or an unwritable --out is one line
        settings.check_all()  # a bad MMLINATTN_* value: one line, before any work
        cfg = load_config(args.config, args.cfg_options)
        wrapper = Exportable(build_model(cfg, args.checkpoint), args.part)
        shape = tuple(args.shape)
        t0 = time.time()
        exporter = args.exporter or default_exporter()
        rule = export(wrapper, shape, args.out, args.dynamic, args.batch, args.opset,
                      meta={'mmlinattn.config': osp.basename(args.config)}, exporter=exporter)
        print(f'exported {args.part} of {args.config} at {shape[0]}x{shape[1]} to {args.out} '
              f'with the {exporter} exporter ({time.time() - t0:.0f} s)')
        print(f'size rule: {rule.text()}' if rule else
              f'static input {args.batch}x3x{shape[0]}x{shape[1]} (--dynamic for other sizes)')
        if args.no_check:
            return 0
        shapes = [shape] + [tuple(s) for s in (args.check_shape or [])]
        if rule and not args.check_shape:
            shapes.append(rule.near(shape))
        for s in shapes[1:]:
            if rule is None and tuple(s) != shape:
                raise ExportError(f'--check-shape {s[0]} {s[1]}: a static export takes only its '
                                  f'own {shape[0]}x{shape[1]} (add --dynamic)')
            if rule:
                rule.check(s, '--check-shape')
        rows = check(args.out, wrapper, shapes, args.batch, args.rtol)
    except (ConfigError, ExportError, CheckpointError, settings.SettingError) as e:
        print(f'export_onnx: error: {e}', file=sys.stderr)
        return 2
    print(format_rows(rows))
    bad = [r for r in rows if not r['ok']]
    if bad:
        print(f'export_onnx: {len(bad)} output(s) differ from eager PyTorch by more than rtol '
              f'{args.rtol}', file=sys.stderr)
        return 1
    print(f'ONNX Runtime matches eager PyTorch within rtol {args.rtol} at '
          + ', '.join(f'{s[0]}x{s[1]}' for s in shapes))
    return 0


if __name__ == '__main__':
    sys.exit(main())
