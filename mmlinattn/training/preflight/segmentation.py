"""Segmentation pre-flight: label maps checked against their images and the model's classes."""
import os.path as osp
import random
from typing import Optional

import numpy as np
from mmengine.config import Config
from mmengine.logging import MMLogger
from PIL import Image

from ..config import ConfigError
from .datasets import DatasetView

# Segmentation sets up to this many files are checked file by file; larger ones by a seeded sample.
SEG_CHECK_ALL_MAX = 2000
SEG_CHECK_SAMPLE = 500


def _seg_num_classes(cfg: Config, view: DatasetView) -> Optional[int]:
    heads = cfg.get('model', {}).get('decode_head')
    head = heads[0] if isinstance(heads, (list, tuple)) and heads else heads
    if isinstance(head, dict) and isinstance(head.get('num_classes'), int):
        return head['num_classes']
    return len(view.classes) if view.classes else None


#: what an mmseg dataset raises for files or settings it cannot list (a folder or annotation file it
#: cannot read, a ``metainfo`` its classes do not cover, its own asserts); anything else is raised
SEG_LISTING_ERRORS = (OSError, ValueError, KeyError, AssertionError)


def check_seg_annotations(cfg: Config, view: DatasetView, logger=None) -> None:
    """Segmentation pre-flight: every (image, label map) pair the dataset ``view`` lists has the
    same size, and every label value - after ``reduce_zero_label`` and ``label_map``, as mmseg's
    loader applies them - lies in ``[0, num_classes)`` or is the ignore index. Sets of up to
    ``SEG_CHECK_ALL_MAX`` files are checked whole, larger ones by a seeded sample of
    ``SEG_CHECK_SAMPLE`` (the log says which). Only image headers are read for the sizes.

    An empty set, a label map that is missing or does not decode (truncated, corrupt), an image
    whose header does not read, a size mismatch or an out-of-range label raise
    :class:`ConfigError` naming the files, the values and the config key to change (mmseg would
    fail deep in the loss, or drop the pixels from the mIoU without a word).
    """
    logger = logger or MMLogger.get_current_instance()
    key, ds_cfg, cls = view.key, view.cfg, view.cls
    if cls is None or not hasattr(cls, 'load_data_list'):
        return
    try:
        ds = cls(**{k: v for k, v in ds_cfg.items() if k != 'type' and not k.startswith('_')},
                 lazy_init=True)
        infos = ds.load_data_list()
    except SEG_LISTING_ERRORS as e:  # the dataset raises it again when the Runner builds it
        first = (str(e).strip().splitlines() or [''])[0][:200]
        logger.warning(f'pre-flight: {key}: label maps not checked - {cls.__name__} does not list '
                       f'its samples ({type(e).__name__}: {first}); the Runner builds it next')
        return
    if not infos:
        prefix = ds_cfg.get('data_prefix', {})
        suffix = getattr(ds, 'img_suffix', '?')
        raise ConfigError(f'{key}: no image found under {ds_cfg.get("data_root", "")}'
                          f'{prefix.get("img_path", "")} with suffix {suffix!r}'
                          f' (set {key}.data_prefix.img_path / {key}.img_suffix)')
    if not view.labels:  # a test set for a server: images only, no label maps read
        logger.info(f'{key}: {len(infos)} images; the evaluator formats results only '
                    '(format_only=True), label maps not checked')
        return
    _check_labels_present(view, infos)
    num_classes = _seg_num_classes(cfg, view)
    if len(infos) > SEG_CHECK_ALL_MAX:
        chosen = random.Random(0).sample(infos, SEG_CHECK_SAMPLE)
        logger.info(f'{key}: checking a seeded sample of {SEG_CHECK_SAMPLE} of {len(infos)} label '
                    'maps (sizes, label range)')
    else:
        chosen = infos
        logger.info(f'{key}: checking all {len(infos)} label maps (sizes, label range)')
    reduce_zero = bool(getattr(ds, 'reduce_zero_label', False))
    ignore = getattr(ds, 'ignore_index', 255)
    label_map = getattr(ds, 'label_map', None)
    lut = None
    if label_map:
        lut = np.arange(256, dtype=np.int64)
        for old, new in label_map.items():
            lut[old] = new
    size_bad, range_bad, unread = [], [], []
    for info in chosen:
        seg_path = info.get('seg_map_path')
        if not seg_path:
            continue
        if not osp.isfile(seg_path):
            unread.append(f'{seg_path}: file not found (the label map of '
                          f'{osp.basename(info["img_path"])})')
            continue
        try:
            with Image.open(info['img_path']) as im:
                img_wh = im.size
        except Exception as e:  # PIL's decoders only, whose type varies: listed below
            unread.append(f'{info["img_path"]}: {type(e).__name__}: {e}')
            continue
        try:
            with Image.open(seg_path) as lab:
                lab_wh = lab.size
                values = np.unique(np.asarray(lab))  # decodes the whole map: a truncated one fails
        except Exception as e:  # PIL's decoders: a damaged file raises OSError,
            # SyntaxError, ValueError, struct.error, DecompressionBombError... - each one is listed
            # with its type as an unreadable file (and stops the run), none passes silently
            unread.append(f'{seg_path}: {type(e).__name__}: {e}')
            continue
        if img_wh != lab_wh:
            size_bad.append(f'{seg_path} is {lab_wh[0]}x{lab_wh[1]} but its image '
                            f'{osp.basename(info["img_path"])} is {img_wh[0]}x{img_wh[1]}')
        if num_classes is None:
            continue
        v = values.astype(np.int64)
        if reduce_zero:
            v = np.where(v == 0, 255, v - 1)
            v = np.where(v == 254, 255, v)
        if lut is not None:
            v = lut[np.clip(v, 0, 255)]
        bad = sorted(int(x) for x in np.unique(v) if (x < 0 or x >= num_classes) and x != ignore)
        if bad:
            range_bad.append(f'{seg_path}: {bad[:8]}')
    problems = []
    if unread:
        problems.append(f'{len(unread)} file(s) that cannot be read (missing, truncated or not an '
                        'image):\n    ' + '\n    '.join(unread[:10]))
    if size_bad:
        problems.append(f'{len(size_bad)} label map(s) of another size than their image (mmseg '
                        'would train on misaligned labels or fail to batch them):\n    ' +
                        '\n    '.join(size_bad[:10]))
    if range_bad:
        problems.append(
            f'{len(range_bad)} label map(s) with values outside [0, {num_classes}) other than the '
            f'ignore index {ignore} (after reduce_zero_label={reduce_zero}; values as the loss '
            'sees them):\n    ' + '\n    '.join(range_bad[:10]) +
            f'\n  Fix the files, or model.decode_head.num_classes / {key}.reduce_zero_label')
    if problems:
        raise ConfigError(f'{key}: ' + '\n  '.join(problems))


def _transform_types(pipeline) -> set:
    """Every transform type in a pipeline, looking into TestTimeAug's nested lists."""
    found = set()
    for t in pipeline or []:
        if isinstance(t, (list, tuple)):
            found |= _transform_types(t)
        elif isinstance(t, dict):
            found.add(str(t.get('type', '')))
            found |= _transform_types(t.get('transforms'))
    return found


def _check_labels_present(view: DatasetView, infos) -> None:
    """A val / test set scored by a metric must have label maps and load them; a set of images only
    (the ADE20K test set) is for a test-server submission (``format_only=True``). Without this,
    mmseg's IoUMetric fails after the whole run (``KeyError: 'gt_sem_seg'``)."""
    key, ds_cfg = view.key, view.cfg
    if not view.evaluators:
        return
    ev_key = view.evaluators[0][0]
    why = None
    if not any(info.get('seg_map_path') for info in infos):
        why = f'lists no label maps ({key}.data_prefix has no seg_map_path)'
    elif ds_cfg.get('pipeline') and not any(t.endswith('LoadAnnotations')
                                            for t in _transform_types(ds_cfg['pipeline'])):
        why = 'loads no label maps (no LoadAnnotations in its pipeline)'
    if why:
        raise ConfigError(
            f'{key} {why} but {ev_key} computes metrics from them. For a test set without labels '
            f'(a test-server submission) set {ev_key}.format_only=True and {ev_key}.output_dir=DIR '
            '(or tools/test.py --out DIR); docs/user_guide.md "7. Test-server submission"')
