"""Export a config's backbone (``--part backbone``), backbone + neck (``neck``) or whole mmseg
segmentor (``model``) to ONNX, and check the file against eager PyTorch with ONNX Runtime (CPU):
``|onnx - eager| <= rtol * (|eager| + max|eager|)`` at ``--shape`` (and, with ``--dynamic``, a
second shape), exit 1 otherwise. The input is the normalised image (B, 3, H, W); no CHECKPOINT:
random weights. The parts, the exporters and the size rule of ``--dynamic``: docs/deployment.md.

    python tools/deployment/export_onnx.py CONFIG [CHECKPOINT] --shape H W --part backbone \
        --out work_dirs/onnx/backbone.onnx [--dynamic] [--check-shape H W ...] \
        [--cfg-options k=v ...]
"""
import argparse
import os.path as osp
import sys
import time

import mmlinattn  # noqa: F401  (registers the backbones)
from mmlinattn.analysis import deploy as D
from mmlinattn.analysis.deploy import ExportError, build_model
from mmlinattn.core import settings
from mmlinattn.core.weights import CheckpointError
from mmlinattn.training.cli import load_config
from mmlinattn.training.config import ConfigError
from mmlinattn.training.fileio import nearest_existing, probe_writable
from mmlinattn.training.preflight import CfgOptionsAction


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config', help='config file (mmdet, mmseg or mmpretrain)')
    p.add_argument('checkpoint', nargs='?', help='whole-model checkpoint (default: random weights)')
    p.add_argument('--shape', type=int, nargs=2, required=True, metavar=('H', 'W'),
                   help='input height and width of the export (the example for --dynamic)')
    p.add_argument('--part', choices=D.PARTS, default='backbone')
    p.add_argument('--out', required=True, help='the ONNX file to write')
    p.add_argument('--dynamic', action='store_true',
                   help='dynamic height and width (see the size rule)')
    p.add_argument('--batch', type=int, default=1, help='batch size (static)')
    p.add_argument('--check-shape', type=int, nargs=2, action='append', metavar=('H', 'W'),
                   help='further input sizes to check with ONNX Runtime (--dynamic: default one '
                        'near --shape); repeatable')
    p.add_argument('--no-check', action='store_true', help='skip the ONNX Runtime check')
    p.add_argument('--rtol', type=float, default=D.DEFAULT_RTOL)
    p.add_argument('--exporter', choices=D.EXPORTERS, default=None,
                   help=f'dynamo or jit (default: {D.default_exporter()} on this torch)')
    p.add_argument('--opset', type=int, default=None,
                   help=f'ONNX opset (default: {D.DEFAULT_OPSET} with dynamo, {D.JIT_OPSET} with '
                        'jit)')
    p.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction,
                   help='override config settings, key=value')
    return p.parse_args(argv)


def check_args(args) -> None:
    """:class:`ExportError` for arguments no export can take (sizes, ``--out``), before any work."""
    for flag, shape in [('--shape', args.shape)] + [('--check-shape', s)
                                                    for s in args.check_shape or []]:
        if min(shape) < 1:
            raise ExportError(f'{flag} {shape[0]} {shape[1]}: height and width must be positive '
                              '(pixels), e.g. --shape 512 512')
    if args.batch < 1:
        raise ExportError(f'--batch {args.batch}: the batch size must be at least 1')
    for s in [] if args.dynamic else args.check_shape or []:  # a static file: its own size only
        if tuple(s) != tuple(args.shape):
            raise ExportError(f'--check-shape {s[0]} {s[1]}: a static export takes only its own '
                              f'{args.shape[0]}x{args.shape[1]} (add --dynamic)')
    check_out(args.out)


def check_out(out: str) -> None:
    """:class:`ExportError` unless a file can be written at ``out`` (probed in the nearest existing
    folder on its path: root passes permission bits, not a read-only file system)."""
    path = osp.abspath(out)
    if osp.isdir(path):
        raise ExportError(f'--out {out} is a folder; give the ONNX file to write, e.g. '
                          f'{osp.join(out, "model.onnx")}')
    existing = nearest_existing(osp.dirname(path))
    if not osp.isdir(existing):
        raise ExportError(f'--out {out}: its folder cannot be created, {existing} is a file; give '
                          '--out a path in a folder you can write')
    try:
        probe_writable(existing, '.export_onnx-write-test-', file=True)
    except OSError as e:
        raise ExportError(f'--out {out}: cannot write in {existing} ({e.strerror or e}); give '
                          '--out a path in a folder you can write') from None


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)  # before any work: a bad size or an unwritable --out is one line
        settings.check_all()  # a bad MMLINATTN_* value: one line, before any work
        cfg = load_config(args.config, args.cfg_options)
        wrapper = D.Exportable(build_model(cfg, args.checkpoint), args.part)
        shape = tuple(args.shape)
        # every refusal before the file is written: the dynamic size rule and --check-shape
        rule = D.dynamic_rule(wrapper, shape) if args.dynamic else None
        for s in (args.check_shape or []) if rule else []:
            rule.check(s, '--check-shape')
        t0 = time.time()
        exporter = args.exporter or D.default_exporter()
        D.export(wrapper, shape, args.out, args.dynamic, args.batch, args.opset,
                 meta={'mmlinattn.config': osp.basename(args.config)}, exporter=exporter,
                 rule=rule)
        print(f'exported {args.part} of {args.config} at {shape[0]}x{shape[1]} to {args.out} '
              f'with the {exporter} exporter ({time.time() - t0:.0f} s)')
        print(f'size rule: {rule.text()}' if rule else
              f'static input {args.batch}x3x{shape[0]}x{shape[1]} (--dynamic for other sizes)')
        if args.no_check:
            return 0
        shapes = [shape] + [tuple(s) for s in (args.check_shape or [])]
        if rule and not args.check_shape:
            shapes.append(rule.near(shape))
        rows = D.check(args.out, wrapper, shapes, args.batch, args.rtol)
    except (ConfigError, ExportError, CheckpointError, settings.SettingError) as e:
        print(f'export_onnx: error: {e}', file=sys.stderr)
        return 2
    print(D.format_rows(rows))
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
