"""Class-count pre-flight: every head's ``num_classes`` against the classes of the dataset it trains
on.

The dataset's classes are its ``metainfo.classes`` or, without one, the default of its type (mmdet's
``CocoDataset``: COCO's 80; mmseg's ``ADE20KDataset``: ADE20K's 150; a type without default classes,
such as mmseg's ``BaseSegDataset`` without ``metainfo``, is not checked). In both toolboxes a head's
``num_classes`` is the number of those classes:

- mmdet: RetinaNet's sigmoid head, Mask R-CNN's box and mask heads, each of Cascade's box heads and
  its mask head (the background is implicit; the RPN head, class-agnostic, is not checked);
- mmseg: the decode head and the auxiliary head(s). ``metainfo.classes`` lists the classes the loss
  sees: with ``reduce_zero_label=True`` the stored label 0 is ignored and is not one of them
  (ADE20K: 150), with ``reduce_zero_label=False`` a background class 0 is kept and counts.

What stops, before any model is built, is a head whose class count differs from the dataset's:
fewer fails the loss later (an index error under the toolboxes' own tools); more trains, and then
mmdet's ``CocoMetric`` dies at the first prediction of a class that has no COCO category id (an
``IndexError`` after the first checkpoint), and mmseg scores classes nothing is labelled as. Both
are one line naming every head key with its value and the dataset key with its count;
``allow_extra_classes=True`` in the config says a larger head is meant (pre-sized for data that
comes later): one warning then instead of the stop.

Why not mmdet's ``NumClassCheckHook``: it runs once the Runner has built the model and the dataset
(``before_train_epoch`` / ``before_val_epoch``), exists for mmdet only (mmseg has none), compares
every module with a ``num_classes`` but the ``rpn_head`` with the built dataset's
``metainfo['classes']``, and fails with an assertion; this check reads the config, covers both
toolboxes, and stops before anything is built.
"""
import inspect
from typing import List, Optional, Sequence, Tuple

from mmengine.config import Config

from ..config import ConfigError
from .datasets import DatasetView, dataset_views

ALLOW_KEY = 'allow_extra_classes'


def _heads(model: dict, scope: str) -> List[Tuple[str, dict]]:
    """``(config key, head config)`` of every head whose ``num_classes`` must match the classes."""
    found = []

    def add(key, heads):
        if isinstance(heads, (list, tuple)):
            for i, h in enumerate(heads):
                add(f'{key}.{i}', h)
        elif isinstance(heads, dict) and 'num_classes' in heads:
            if heads.get('class_agnostic') is True:  # a class-agnostic mask head predicts 1 map
                return
            found.append((key, heads))

    if scope == 'mmseg':
        add('model.decode_head', model.get('decode_head'))
        add('model.auxiliary_head', model.get('auxiliary_head'))
    elif scope == 'mmdet':
        add('model.bbox_head', model.get('bbox_head'))  # one-stage detectors (RetinaNet, ...)
        roi = model.get('roi_head')
        if isinstance(roi, dict):
            for name in ('bbox_head', 'mask_head'):
                add(f'model.roi_head.{name}', roi.get(name))
    return found


def _where_classes(view: DatasetView) -> str:
    key, ds, classes = view.key, view.cfg, view.classes
    meta = ds.get('metainfo') or {}
    shown = ', '.join(repr(c) for c in list(classes)[:6]) + (', ...' if len(classes) > 6 else '')
    if meta.get('classes'):
        where = f'{key}.metainfo.classes has {len(classes)} ({shown})'
    else:
        where = (f'{key} ({view.type_name}, no metainfo.classes) has its default {len(classes)} '
                 f'classes ({shown}); set {key}.metainfo.classes to your own')
    if view.scope == 'mmseg':
        reduce_zero = ds.get('reduce_zero_label')
        if reduce_zero is None:  # the dataset type's default (ADE20KDataset: True)
            try:
                param = inspect.signature(view.cls).parameters.get('reduce_zero_label')
                reduce_zero = None if param is None else param.default
            except (TypeError, ValueError):
                reduce_zero = None
        if reduce_zero is not None:
            where += (f' [reduce_zero_label={reduce_zero}: '
                      + ('stored label 0 is ignored, not a class]' if reduce_zero else
                         'stored label 0 is a class and counts]'))
    return where


def check_num_classes(cfg: Config, which=('train_dataloader', 'val_dataloader', 'test_dataloader'),
                      allow_extra: Optional[bool] = None,
                      views: Optional[Sequence[DatasetView]] = None) -> List[str]:
    """Every head's ``num_classes`` equals the number of classes of each dataset the loaders
    ``which`` read (or of the dataset ``views`` given, as the pre-flight passes them); else
    :class:`ConfigError` names every head key with its value and the dataset key with its class
    count. ``allow_extra`` (default: the config's ``allow_extra_classes``) accepts heads with *more*
    classes than the dataset (one warning); fewer is always an error. The warning's lines are
    returned (empty: none)."""
    model = cfg.get('model')
    scope = cfg.get('default_scope')
    if not isinstance(model, dict) or scope not in ('mmdet', 'mmseg'):
        return []
    if isinstance(model.get('module'), dict):  # a TTA wrapper
        model = model['module']
    heads = _heads(model, scope)
    if not heads:
        return []
    if allow_extra is None:
        allow_extra = bool(cfg.get(ALLOW_KEY, False))
    if views is None:
        views = dataset_views(cfg, which)
    problems, larger, seen = [], [], set()
    for view in views:
        if not view.classes:
            continue
        n = len(view.classes)
        bad, extra = [], []
        for hkey, head in heads:
            got = head['num_classes']
            if not isinstance(got, int) or got == n:
                continue
            (extra if got > n and allow_extra else bad).append(f'{hkey}.num_classes={got}')
        for found, into in ((bad, problems), (extra, larger)):
            sig = (tuple(found), n)
            if found and sig not in seen:  # val and test loaders usually share the dataset config
                seen.add(sig)
                into.append(f'{", ".join(found)} but {_where_classes(view)}')
    if larger:
        from mmengine.logging import MMLogger
        MMLogger.get_current_instance().warning(
            f'heads with more classes than the dataset ({ALLOW_KEY}=True: meant): '
            + '; '.join(larger))
    if problems:
        raise ConfigError.listing(
            "the heads' num_classes do not match the dataset's classes", problems,
            'Set every listed head to the dataset\'s class count (Cascade: each of the '
            'roi_head.bbox_head stages and the mask_head; UperNet: decode_head and '
            f'auxiliary_head); a head larger than the dataset on purpose (pre-sized for later '
            f'data): {ALLOW_KEY}=True in the config.')
    return larger
