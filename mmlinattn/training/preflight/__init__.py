"""The checks that run before any model is built or any step is taken, each failing with a
:class:`~mmlinattn.training.ConfigError` that names the config key to change.

:func:`preflight` is the one entry point (tools/train.py and tools/test.py call it). It builds one
:class:`~.datasets.DatasetView` per dataset of the loaders it is given - the dataset's class and
classes resolved once, its paths joined to its ``data_root`` - and runs the checks over those views
in one order, each stage only when the ones before it passed:

1. the config itself: every dataset key is an argument of its dataset class
   (:func:`~.datasets.check_dataset_args`), a training run's ``param_scheduler`` phases end after
   they begin in this run's length (:mod:`.schedules`), a ``format_only`` evaluator says where
   its files go (:func:`~.datasets.check_format_only`), then every head's ``num_classes`` against
   the datasets' classes (:mod:`.classes`);
2. the paths of every loader: dataset roots, annotation files and ``data_prefix`` folders, all
   missing ones reported together (:func:`check_paths`);
3. the files' contents: COCO annotation files (:mod:`.coco`) and segmentation label maps
   (:mod:`.segmentation`);
4. the model: the neck's / heads' ``in_channels`` against the backbone's channels
   (:mod:`.channels`), on the backbone built once on the ``meta`` device (:mod:`.backbone`).

It returns a :class:`Preflight`: the views and that :class:`~.backbone.MetaBackbone`, which
tools/train.py hands to :func:`.checkpoints.prepare_checkpoints` (the backbone is not built again).

Beside it: :mod:`.cfg_options` checks ``--cfg-options`` when the config is loaded, and
:mod:`.checkpoints` the files a training run will load (tools/train.py, after :func:`preflight`).
"""
import os.path as osp
from typing import List, NamedTuple, Optional, Sequence

from mmengine.config import Config
from mmengine.logging import MMLogger

from ..config import ConfigError
from .backbone import MetaBackbone
from .cfg_options import CfgOptionsAction, check_cfg_options
from .channels import check_model_channels
from .classes import check_num_classes
from .coco import COCO_CHECK_MAX_BYTES, check_coco_annotations
from .datasets import DatasetView, check_dataset_args, check_format_only, dataset_views
from .schedules import check_optimizer_lr, check_param_schedulers
from .segmentation import SEG_CHECK_ALL_MAX, SEG_CHECK_SAMPLE, check_seg_annotations

__all__ = ['preflight', 'Preflight', 'MetaBackbone', 'DatasetView', 'dataset_views',
           'CfgOptionsAction', 'check_cfg_options',
           'check_paths', 'check_contents', 'check_coco_annotations', 'check_seg_annotations',
           'check_dataset_args', 'check_param_schedulers',
           'check_model_channels', 'check_num_classes', 'COCO_CHECK_MAX_BYTES',
           'SEG_CHECK_ALL_MAX', 'SEG_CHECK_SAMPLE']

ALL_LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


class Preflight(NamedTuple):
    """What :func:`preflight` found, for the checks that come after it: the dataset views and the
    config's backbone on the ``meta`` device (built once, at the channels check)."""
    views: List[DatasetView]
    backbone: MetaBackbone


def preflight(cfg: Config, loaders: Sequence[str] = ALL_LOADERS,
              backbone: Optional[MetaBackbone] = None,
              training: Optional[bool] = None) -> Preflight:
    """Check ``cfg`` for a run that reads the dataloaders ``loaders``, in the order of the module's
    docstring (config, paths, contents, model); the first stage that fails raises
    :class:`ConfigError`. ``backbone``: the config's, built already (else built here).
    ``training``: whether the run builds the optimizer and schedule (default: it reads
    ``train_dataloader``); a test that reads the training set (mmseg's drawing hook) does not."""
    backbone = backbone or MetaBackbone(cfg)
    views = dataset_views(cfg, tuple(loaders))
    check_dataset_args(views)
    if training if training is not None else 'train_dataloader' in loaders:
        check_optimizer_lr(cfg)
        check_param_schedulers(cfg, MMLogger.get_current_instance())
    check_format_only(views)
    check_num_classes(cfg, views=views)
    check_paths(views)
    check_contents(cfg, views)
    check_model_channels(cfg, backbone)
    return Preflight(views, backbone)


def check_paths(views: Sequence[DatasetView]) -> None:
    """Every dataset root, annotation file and ``data_prefix`` folder of ``views`` exists; else one
    :class:`ConfigError` lists every missing path with the config key that sets it (a missing
    ``data_root`` hides the paths under it)."""
    problems = []
    for view in views:
        key, root = view.key, view.data_root
        if root and not osp.isdir(root):
            problems.append(f'{key}.data_root = {root!r}: directory not found')
            continue
        if view.ann_file and not osp.isfile(view.ann_path):
            problems.append(f'{key}.ann_file = {view.ann_file!r}: file not found ({view.ann_path})')
        for sub, (folder, path) in view.folders.items():
            if not osp.isdir(path):
                problems.append(f'{key}.data_prefix.{sub} = {folder!r}: directory not found '
                                f'({path})')
    if problems:
        raise ConfigError.listing(
            'dataset paths do not exist', problems,
            'Fix them with --cfg-options (e.g. --cfg-options '
            'train_dataloader.dataset.data_root=/path/to/data/), or see docs/user_guide.md '
            '"4. Data" for the expected layout (python tools/misc/make_toy_datasets.py writes a '
            'small one).')


def check_contents(cfg: Config, views: Sequence[DatasetView]) -> None:
    """The annotation files of ``views``, whose paths exist: a COCO json (up to
    ``COCO_CHECK_MAX_BYTES``) through :func:`check_coco_annotations` with the dataset's classes,
    filter and image folder; an mmseg dataset's label maps through :func:`check_seg_annotations`."""
    logger = MMLogger.get_current_instance()
    for view in views:
        if view.is_coco_json and osp.getsize(view.ann_path) <= COCO_CHECK_MAX_BYTES:
            check_coco_annotations(view.ann_path, logger, classes=view.classes,
                                   filter_cfg=view.filter_cfg, ds_key=view.key,
                                   img_dir=view.coco_image_dir, labels=view.labels)
        if view.scope == 'mmseg' and view.cfg.get('data_prefix'):
            check_seg_annotations(cfg, view, logger)

