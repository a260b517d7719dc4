"""The test-time options of the toolboxes' own ``tools/test.py`` as edits of a config:
``--show`` / ``--show-dir`` (:func:`trigger_visualization_hook`), ``--tta`` (:func:`apply_tta`,
with mmdet's and mmpretrain's defaults for a config without ``tta_model``) and ``--out``
(:func:`add_out`). Our tools/test.py applies them; a script or notebook can apply them to a
config the same way."""
import logging
from typing import Optional

from mmengine.config import ConfigDict

from .config import ConfigError


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
