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
  saves them: detection under ``WORK_DIR/TIMESTAMP/DIR`` (mmdet's ``test_out_dir``), segmentation in
  ``DIR/vis_image`` (mmseg's visualizer ``save_dir``; every ``interval``-th image, as mmseg);
- ``--tta``: the config's ``tta_model`` / ``tta_pipeline`` (ADE20K: multi-scale 0.5-1.75 + flip); a
  detection config without them gets mmdet's default, ``DetTTAModel`` over a flip / no-flip
  pipeline, a classification config mmpretrain's, ``AverageClsScoreTTA`` over the same flips;
- mmpretrain's: ``--show-dir DIR`` saves every ``--interval``-th drawn image (default 1) in DIR,
  ``--out FILE --out-item metrics`` dumps the metrics instead of the predictions;
  ``--no-pin-memory`` and ``--amp`` (the test loop under autocast, ``test_cfg.fp16``) apply to any
  config.

Ours only: ``--json-prefix`` writes COCO-format result files (``PREFIX.bbox.json`` /
``PREFIX.segm.json``) for detection configs; checkpoints are loaded weights-only, and the config,
data and checkpoint are checked first (one line on stderr, exit 2). Test-server submissions (COCO
test-dev, the ADE20K test set): docs/user_guide.md "7. Test-server submission".
"""
import argparse
import logging
import numbers
import os.path as osp
import sys
from typing import Optional

from mmengine.config import ConfigDict

import mmlinattn  # noqa: F401  (registers our modules)
import mmlinattn.upstream_fixes  # noqa: F401  (mmengine on torch >= 2.6: see the module)
from mmlinattn.core.weights import CheckpointError, local_checkpoint
from mmlinattn.core.weights.reading import read_contents

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..')))  # for tools.workshop
from tools.workshop.apis import (
    ConfigError,
    add_common_args,
    build_runner,
    close_distributed,
    config_from_args,
    parse_with_common_args,
    preflight,
    tool_error,
)
from tools.workshop.apis.datafaults import DataFileError
from tools.workshop.apis.runner import check_finite_checkpoint
from tools.workshop.apis.runs import check_work_dir


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
                                      'work_dir/timestamp; segmentation: DIR/vis_image)')
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


def instance_mask_keys(model_cfg, prefix='model') -> list:
    """The keys of a detector config that make it predict instance masks (``roi_head.mask_head``
    and any other ``mask_head``), e.g. ``['model.roi_head.mask_head']``."""
    found = []
    if isinstance(model_cfg, dict):
        for k, v in model_cfg.items():
            if k == 'mask_head' and v:
                found.append(f'{prefix}.{k}')
            else:
                found += instance_mask_keys(v, f'{prefix}.{k}')
    elif isinstance(model_cfg, (list, tuple)):
        for i, v in enumerate(model_cfg):
            found += instance_mask_keys(v, f'{prefix}[{i}]')
    return found


def check_tta(cfg, config_path: str) -> None:
    """--tta on a detector that predicts instance masks: mmdet 3.x's DetTTAModel merges boxes only
    and asserts on masks after the first batch ("TTA of instance segmentation does not support
    now"); stop before any work instead."""
    masks = instance_mask_keys(cfg.get('tta_model', {}).get('module', cfg.get('model')))
    if cfg.get('default_scope') == 'mmdet' and masks:
        raise ConfigError(
            f'--tta: {config_path} predicts instance masks ({masks[0]}), and mmdet has test-time '
            'augmentation for boxes only (DetTTAModel); run it without --tta, or use --tta with a '
            'box detector (RetinaNet) or a segmentation config')


def build_cfg(args):
    """The run's config (its checks passed); :func:`prepare` also returns the checkpoint's
    contents."""
    return prepare(args)[0]


def prepare(args):
    """``(cfg, contents)``: the run's config, checked, and the checkpoint read once
    (:class:`~mmlinattn.core.weights.reading.CheckpointContents`), for the fit check and the
    Runner's load (:func:`~tools.workshop.apis.build_runner`)."""
    cfg = config_from_args(args)
    if args.tta:
        check_tta(cfg, args.config)
    check_work_dir(cfg.work_dir)  # unwritable: one line naming it, exit 2
    # a URL: fetched once into torch's hub cache
    args.checkpoint = local_checkpoint(args.checkpoint)
    if not osp.isfile(args.checkpoint):
        raise ConfigError(f'checkpoint file not found: {args.checkpoint}')
    cfg.load_from = args.checkpoint
    # the backbone's own ImageNet init is pointless (and may be absent) when a full checkpoint loads
    backbone = cfg.get('model', {}).get('backbone')
    if isinstance(backbone, dict) and isinstance(backbone.get('init_cfg'), dict):
        backbone['init_cfg'] = None
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
    # mmseg's SegVisualizationHook draws with step=runner.iter, which builds the training loop and
    # with it train_dataloader: a --show / --show-dir run reads the training set's folders too
    reads_train = bool((args.show or args.show_dir) and is_segmentation(cfg)
                       and cfg.get('train_dataloader'))
    try:
        preflight(cfg, ('test_dataloader', 'train_dataloader') if reads_train else
                  ('test_dataloader',))
    except ConfigError as e:
        if reads_train and 'train_dataloader' in str(e):
            raise ConfigError(f"{e} (--show / --show-dir: mmseg's SegVisualizationHook builds "
                              'the training loop, which builds train_dataloader; point it at '
                              'existing folders with --cfg-options)') from None
        raise
    # read once, as the runner will (else one line, exit 2); the checks below, the fit check and
    # the Runner's load take these contents
    contents = read_contents(args.checkpoint)
    # a diverged run's weights score a believable number: refused
    check_finite_checkpoint(args.checkpoint, contents.obj)
    return cfg, contents


def _evaluators(cfg):
    ev = cfg.get('test_evaluator')
    return list(ev) if isinstance(ev, (list, tuple)) else [ev] if ev else []


def is_segmentation(cfg) -> bool:
    return cfg.get('default_scope') == 'mmseg' or \
        any(isinstance(e, dict) and str(e.get('type', '')).endswith('IoUMetric')
            for e in _evaluators(cfg))


def trigger_visualization_hook(cfg, args) -> None:
    """--show / --show-dir / --wait-time, set as the toolbox's own test.py sets them: the
    visualization hook draws; ``show`` and ``wait_time`` with --show; with --show-dir mmdet's hook
    takes ``test_out_dir`` (saved under work_dir/timestamp), mmseg's visualizer ``save_dir``."""
    vis = (cfg.get('default_hooks') or {}).get('visualization')
    if vis is None:
        raise ConfigError("the config has no default_hooks.visualization for --show / --show-dir "
                          "(add visualization=dict(type='DetVisualizationHook') or "
                          "'SegVisualizationHook' to default_hooks)")
    if cfg.get('default_scope') == 'mmpretrain':  # mmpretrain's VisualizationHook
        vis.update(enable=True, show=args.show, wait_time=args.wait_time, out_dir=args.show_dir,
                   interval=args.interval or 1)
        return
    vis['draw'] = True
    if args.interval:
        vis['interval'] = args.interval
    if args.show:
        vis['show'] = True
        vis['wait_time'] = args.wait_time
    if args.show_dir:
        if str(vis.get('type', '')).endswith('SegVisualizationHook') or \
                (cfg.get('default_scope') == 'mmseg' and 'Det' not in str(vis.get('type', ''))):
            if not isinstance(cfg.get('visualizer'), dict):
                raise ConfigError('--show-dir: the config has no visualizer to save with')
            cfg.visualizer['save_dir'] = args.show_dir
        else:
            vis['test_out_dir'] = args.show_dir


def default_det_tta(cfg) -> None:
    """mmdet's tools/test.py default when a detection config has no ``tta_model`` /
    ``tta_pipeline``: ``DetTTAModel`` (NMS at IoU 0.5, 100 per image) over the test pipeline with
    its last step replaced by a flip / no-flip ``TestTimeAug`` that packs the flip keys."""
    from mmengine.logging import print_log
    if 'tta_model' not in cfg:
        print_log('--tta: the config has no tta_model; using DetTTAModel (mmdet\'s default)',
                  logger='current', level=logging.WARNING)
        cfg.tta_model = dict(type='DetTTAModel',
                             tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
    flip_tta_pipeline(cfg, 'mmdet', dict(
        type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                         'scale_factor', 'flip', 'flip_direction')))


def default_cls_tta(cfg) -> None:
    """mmpretrain's tools/test.py default: ``AverageClsScoreTTA`` over the test pipeline with a
    flip / no-flip ``TestTimeAug`` before its last step."""
    from mmengine.logging import print_log
    if 'tta_model' not in cfg:
        print_log('--tta: the config has no tta_model; using AverageClsScoreTTA (mmpretrain\'s '
                  'default)', logger='current', level=logging.WARNING)
        cfg.tta_model = dict(type='mmpretrain.AverageClsScoreTTA')
    flip_tta_pipeline(cfg, 'mmpretrain')


def flip_tta_pipeline(cfg, toolbox: str, pack: Optional[dict] = None) -> None:
    """Unless the config has a ``tta_pipeline``: its test pipeline with the last step (the packing,
    or ``pack``) inside a flip / no-flip ``TestTimeAug``, the toolbox's default."""
    from copy import deepcopy

    from mmengine.logging import print_log
    if 'tta_pipeline' in cfg:
        return
    print_log(f'--tta: the config has no tta_pipeline; using a flip TTA of the test pipeline '
              f'({toolbox}\'s default)', logger='current', level=logging.WARNING)
    ds = cfg.test_dataloader.dataset
    while 'dataset' in ds:
        ds = ds['dataset']
    pipeline = deepcopy(ds.pipeline)
    pipeline[-1] = dict(
        type='TestTimeAug',
        transforms=[[dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
                    [pack or pipeline[-1]]])
    cfg.tta_pipeline = pipeline


def apply_tta(cfg, config_path: str) -> None:
    """--tta: the model wrapped by the config's ``tta_model`` and the test set read through its
    ``tta_pipeline``; detection and classification configs without them get their toolbox's
    default (:func:`default_det_tta`, :func:`default_cls_tta`)."""
    if cfg.get('default_scope') == 'mmdet':
        default_det_tta(cfg)
    elif cfg.get('default_scope') == 'mmpretrain':
        default_cls_tta(cfg)
    if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
        raise ConfigError(f'{config_path} defines no tta_model / tta_pipeline for --tta')
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)


def add_out(cfg, out: str) -> None:
    """--out: ``.pkl`` / ``.pickle`` dumps the predictions (detection: mmdet's ``DumpDetResults``,
    as its tool); for a segmentation config any other value is the folder of PNG predictions
    (mmseg's tool: ``output_dir`` and ``keep_results`` on its ``IoUMetric``)."""
    evs = _evaluators(cfg)
    if out.endswith(('.pkl', '.pickle')):
        dump = 'DumpDetResults' if cfg.get('default_scope') == 'mmdet' else 'DumpResults'
        cfg.test_evaluator = evs + [dict(type=dump, out_file_path=out)]
        return
    if not is_segmentation(cfg):
        raise ConfigError(f'--out {out}: must end with .pkl or .pickle (a folder of PNG '
                          'predictions is for segmentation configs)')
    ious = [e for e in evs if isinstance(e, dict) and str(e.get('type', '')).endswith('IoUMetric')]
    if not ious:
        raise ConfigError(f'--out {out}: a folder of PNG predictions needs an IoUMetric '
                          'test_evaluator')
    for e in ious:
        e['output_dir'] = out
        e['keep_results'] = True


def main(argv=None):
    args = parse_args(argv)
    try:
        cfg, contents = prepare(args)
        runner = build_runner(cfg, args.checkpoint, contents=contents)
    except (ConfigError, CheckpointError) as e:
        return tool_error('tools/test.py', e)
    try:
        metrics = runner.test()
    except (DataFileError, CheckpointError) as e:  # a data file / the checkpoint, named
        close_distributed()
        return tool_error('tools/test.py', e)

    def plain(v):  # numpy scalars printed as plain numbers
        real = isinstance(v, numbers.Real) and not isinstance(v, numbers.Integral)
        return round(float(v), 4) if real else v
    from mmengine.dist import get_rank
    if get_rank() == 0:  # every rank gets the metrics; print them once
        print({k: plain(v) for k, v in (metrics or {}).items()})
        if args.out and args.out_item == 'metrics':
            import mmengine
            mmengine.dump(metrics, args.out)
    close_distributed()
    return 0


if __name__ == '__main__':
    sys.exit(main())
