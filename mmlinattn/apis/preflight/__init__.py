"""Checks that run before any model is built or any step is taken, each failing with a
:class:`~mmlinattn.apis.ConfigError` that names the config key to change:

- :mod:`.cfg_options`: ``--cfg-options`` items and values against the config;
- :func:`check_data_paths`: dataset roots, annotation files and image folders, then the contents of
  :mod:`.coco` annotation files and :mod:`.segmentation` label maps;
- :mod:`.channels`: the neck's / heads' ``in_channels`` against the backbone's ``num_features``;
- :mod:`.classes`: the heads' ``num_classes`` against the datasets' classes (run first by
  :func:`check_data_paths`).
"""
import os.path as osp
from typing import Optional

from mmengine.config import Config
from mmengine.logging import MMLogger

from ..config import ConfigError
from .cfg_options import CfgOptionsAction, check_cfg_options
from .channels import check_model_channels
from .classes import check_num_classes
from .coco import COCO_CHECK_MAX_BYTES, check_coco_annotations
from .datasets import check_format_only, dataset_cfgs, dataset_classes, labels_needed
from .segmentation import SEG_CHECK_ALL_MAX, SEG_CHECK_SAMPLE, check_seg_annotations

__all__ = ['CfgOptionsAction', 'check_cfg_options', 'check_data_paths', 'check_coco_annotations',
           'check_seg_annotations', 'check_model_channels', 'COCO_CHECK_MAX_BYTES',
           'SEG_CHECK_ALL_MAX', 'SEG_CHECK_SAMPLE', 'check_num_classes']


def _coco_image_dir(ds) -> Optional[str]:
    """The folder a COCO dataset's ``file_name``s are relative to, if it exists (a missing one is
    reported with its key by :func:`check_data_paths`)."""
    prefix = ds.get('data_prefix') or {}
    folder = prefix.get('img', '') if isinstance(prefix, dict) else ''
    root = ds.get('data_root') or ''
    path = folder if osp.isabs(folder) or not root else osp.join(root, folder)
    return path if osp.isdir(path or '.') else None


def check_data_paths(cfg: Config, which=('train_dataloader', 'val_dataloader', 'test_dataloader')):
    """Fail before any model is built if a dataset root, annotation file or image folder is missing,
    naming the path and the config key that sets it; then check the COCO annotation files and the
    segmentation label maps of the datasets found. The heads' class counts are checked first
    (:func:`check_num_classes`)."""
    check_num_classes(cfg, tuple(which))
    check_format_only(cfg, tuple(which))
    problems = []
    for key, ds in dataset_cfgs(cfg, list(which)):
        root = ds.get('data_root') or ''
        if root and not osp.isdir(root):
            problems.append(f'{key}.data_root = {root!r}: directory not found')
            continue
        ann = ds.get('ann_file')
        if ann:
            path = ann if osp.isabs(ann) or not root else osp.join(root, ann)
            if not osp.isfile(path):
                problems.append(f'{key}.ann_file = {ann!r}: file not found ({path})')
            elif 'Coco' in str(ds.get('type', '')) and path.endswith('.json') and \
                    osp.getsize(path) <= COCO_CHECK_MAX_BYTES:
                filter_cfg = None if ds.get('test_mode') else ds.get('filter_cfg')
                check_coco_annotations(path, MMLogger.get_current_instance(),
                                       classes=dataset_classes(cfg, ds), filter_cfg=filter_cfg,
                                       ds_key=key, img_dir=_coco_image_dir(ds),
                                       labels=labels_needed(cfg, key))
        prefix = ds.get('data_prefix') or {}
        if isinstance(prefix, str):  # mmpretrain: data_prefix='train'
            prefix = dict(img_path=prefix)
        for sub, folder in prefix.items():
            if not folder or not isinstance(folder, str):
                continue
            path = folder if osp.isabs(folder) or not root else osp.join(root, folder)
            if not osp.isdir(path):
                problems.append(f'{key}.data_prefix.{sub} = {folder!r}: directory not found ({path})')
    if not problems:
        for key, ds in dataset_cfgs(cfg, list(which)):
            if cfg.get('default_scope') == 'mmseg' and ds.get('data_prefix'):
                check_seg_annotations(cfg, key, ds)
    if problems:
        raise ConfigError(
            'dataset paths do not exist:\n  ' + '\n  '.join(problems) +
            '\nFix them with --cfg-options (e.g. --cfg-options '
            'train_dataloader.dataset.data_root=/path/to/data/), or see README.md "Data" for the '
            'expected layout (python tools/misc/make_toy_datasets.py writes a small one).')
