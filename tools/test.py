"""Evaluate a checkpoint on a config's test set (OpenMMLab style).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl | PRED_DIR]
                         [--out-item pred|metrics] [--json-prefix PREFIX] [--tta] [--show]
                         [--show-dir DIR] [--wait-time S] [--interval N] [--no-pin-memory] [--amp]
                         [--cfg-options key=value ...] [--launcher none|pytorch|slurm|mpi]

Every flag of mmdet's, mmseg's and mmpretrain's own ``tools/test.py``, with the same effect:

- ``--out FILE.pkl`` dumps the raw predictions (detection: mmdet's ``DumpDetResults``, masks as
  RLE); for a segmentation config ``--out DIR`` (not ending in .pkl) writes one PNG prediction per
  image there, as mmseg's tool (``test_evaluator.output_dir`` + ``keep_results``);
- ``--show`` / ``--wait-time`` display each drawn prediction (needs a display); ``--show-dir DIR``
  saves them: detection under ``WORK_DIR/TIMESTAMP/DIR`` (mmdet's ``test_out_dir``),
  segmentation in ``DIR/vis_data/vis_image`` (mmseg's visualizer ``save_dir``: mmengine's local
  backend writes there; every ``interval``-th image, as mmseg);
- ``--tta``: the config's ``tta_model`` / ``tta_pipeline`` (ADE20K: multi-scale 0.5-1.75 + flip); a
  detection config without them gets mmdet's default, ``DetTTAModel`` over a flip / no-flip
  pipeline, a classification config mmpretrain's, ``AverageClsScoreTTA`` over the same flips;
- mmpretrain's: ``--show-dir DIR`` saves every ``--interval``-th drawn image (default 1) in DIR,
  ``--out FILE --out-item metrics`` dumps the metrics instead of the predictions;
  ``--no-pin-memory`` and ``--amp`` (the test loop under autocast, ``test_cfg.fp16``) apply to any
  config.

Ours only: ``--json-prefix`` writes COCO-format result files (``PREFIX.bbox.json`` /
``PREFIX.segm.json``) for detection configs. The checks before the test (config, data, the
checkpoint against the model: fit, trained-as attention, finite weights) are the config's Runner's
(``LinAttnRunner``), under this tool as under mmdet's or mmseg's own ``tools/test.py``. Test-server
submissions (COCO test-dev, the ADE20K test set): docs/user_guide.md "7. Test-server submission".
"""
import argparse
import numbers
import sys

from mmengine.config import ConfigDict

import mmlinattn  # noqa: F401  (registers our modules)
import mmlinattn.upstream_fixes  # noqa: F401  (mmengine on torch >= 2.6: see the module)
from mmlinattn.training import refusal
from mmlinattn.training.cli import (
    add_common_args,
    config_from_args,
    parse_with_common_args,
    tool_error,
)
from mmlinattn.training.config import ConfigError
from mmlinattn.training.runner import RunRefused, close_distributed
from mmlinattn.training.testing import add_out, apply_tta, check_tta, trigger_visualization_hook


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Test (and evaluate) a model')
    p.add_argument('config', help='test config file path')
    p.add_argument('checkpoint', help='checkpoint file')
    p.add_argument('--work-dir', help='the dir to save the evaluation metrics')
    p.add_argument('--out', help='dump predictions to a pickle file (.pkl); segmentation: or a '
                                 'directory for PNG predictions (as mmseg)')
    p.add_argument('--json-prefix', help='detection: also write COCO-format json results')
    p.add_argument('--show', action='store_true', help='show prediction results (needs a display)')
    p.add_argument('--show-dir', help='save painted predictions here (detection: under '
                                      'work_dir/timestamp; segmentation: DIR/vis_data/vis_image)')
    p.add_argument('--wait-time', type=float, default=2, help='the interval of --show (s)')
    p.add_argument('--tta', action='store_true',
                   help="test-time augmentation: the config's, or the toolbox's default flip TTA "
                        '(detection, classification) for a config without one')
    p.add_argument('--interval', type=int,
                   help='--show / --show-dir: draw every N-th image (classification: default 1)')
    p.add_argument('--out-item', choices=['pred', 'metrics'],
                   help='with --out FILE: dump the predictions (default) or the metrics')
    p.add_argument('--no-pin-memory', action='store_true', help="the test dataloader's pin_memory "
                                                                'off')
    p.add_argument('--amp', action='store_true', help='the test loop under autocast '
                                                      '(test_cfg.fp16)')
    add_common_args(p)
    return parse_with_common_args(p, argv)


def build_cfg(args):
    """The run's config: the file, ``--cfg-options`` and the flags, as the toolboxes' own tools set
    them (the checks are the Runner's, before the test reads any data)."""
    cfg = config_from_args(args)
    if args.tta:
        check_tta(cfg, args.config)
    cfg.load_from = args.checkpoint  # a URL: the Runner fetches it once, into torch's cache
    if args.tta and (args.show or args.show_dir) and cfg.get('default_scope') == 'mmpretrain':
        raise ConfigError("--tta with --show / --show-dir: mmpretrain's VisualizationHook cannot "
                          'draw test-time-augmented batches (its own test.py stops there too); '
                          'run the two separately')
    if args.show or args.show_dir:
        trigger_visualization_hook(cfg, args)
    if args.tta:
        apply_tta(cfg, args.config)
    if args.json_prefix:
        ev = cfg.test_evaluator
        for e in (ev if isinstance(ev, list) else [ev]):
            if e.get('type', '').endswith('CocoMetric'):
                e['outfile_prefix'] = args.json_prefix
                break
        else:
            raise ConfigError('--json-prefix needs a CocoMetric test_evaluator (detection configs)')
    if args.out_item and not args.out:
        raise ConfigError('--out-item needs --out FILE')
    if args.out and args.out_item != 'metrics':
        add_out(cfg, args.out)
    if args.no_pin_memory:
        cfg.test_dataloader['pin_memory'] = False
    if args.amp:
        import torch
        if cfg.get('default_scope') == 'mmdet' and not torch.cuda.is_available():
            raise ConfigError('--amp on the CPU runs the test under bfloat16 autocast, which '
                              "mmcv's CPU ops of the detectors do not take (Mask R-CNN stops at "
                              'its first image: expected Float, found BFloat16); test detectors '
                              'in fp32 (drop --amp) or on a CUDA GPU')
        cfg.test_cfg = ConfigDict(cfg.get('test_cfg') or {}, fp16=True)
    return cfg


def main(argv=None):
    from mmengine.dist import get_rank
    from mmengine.registry import RUNNERS
    args = parse_args(argv)
    refusal.PROG = 'tools/test.py'  # the Runner's one-line errors name this tool
    try:
        cfg = build_cfg(args)
    except ConfigError as e:
        return tool_error('tools/test.py', e)
    try:
        metrics = RUNNERS.build(cfg).test()
    except RunRefused as e:  # said in one line by the Runner
        return e.code

    def plain(v):  # numpy scalars printed as plain numbers
        real = isinstance(v, numbers.Real) and not isinstance(v, numbers.Integral)
        return round(float(v), 4) if real else v
    if get_rank() == 0:  # every rank gets the metrics; print them once
        print({k: plain(v) for k, v in (metrics or {}).items()})
        if args.out and args.out_item == 'metrics':
            import mmengine
            mmengine.dump(metrics, args.out)
    close_distributed()
    return 0


if __name__ == '__main__':
    sys.exit(main())
