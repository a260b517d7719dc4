"""COCO pre-flight: an annotation file checked before training, naming the file and the record."""
import json
import os.path as osp
from typing import List, Optional

from ..config import ConfigError

# COCO files above this size are not pre-checked (real COCO train is ~450 MB; mmdet parses it
# anyway).
COCO_CHECK_MAX_BYTES = 100 * 2 ** 20


def check_coco_annotations(path: str, logger=None, classes=None, filter_cfg=None,
                           ds_key: str = 'dataset', img_dir: Optional[str] = None,
                           labels: bool = True) -> List[str]:
    """Validate a COCO-format annotation file before training.

    With ``labels=False`` (a test set whose evaluator has ``format_only=True``, see
    ``DatasetView.labels``), an image-info file - ``images`` and ``categories`` only, as
    COCO's ``image_info_test-dev2017.json`` - is accepted; with labels needed, its missing
    ``annotations`` list is an error that says how to write a test-server submission instead.

    Structural problems (not JSON, truncated, no ``images``/``annotations``/``categories`` list, an
    annotation without ``image_id``/``bbox``) raise :class:`ConfigError` naming the file and record.
    Records mmdet would silently drop or ignore - a box of zero area, a polygon with fewer than 3
    points, a ``category_id`` not in ``categories`` - are reported as warnings (returned, and
    logged) naming the annotation id. With the dataset's ``classes`` and ``filter_cfg`` (``ds_key``
    is its config key), a set that mmdet's filter would leave empty (no image with an annotation of
    those classes, or every image below ``min_size``) is an error naming the file and the filter.
    With ``img_dir`` (the folder the ``file_name``s are relative to), images listed but not on disk
    are an error naming them (existence only: a stat per image).
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f'{path}: not valid JSON (truncated or corrupt?) at line {e.lineno} '
                          f'column {e.colno}: {e.msg}') from None
    if not isinstance(data, dict):
        raise ConfigError(f'{path}: a COCO annotation file must hold a JSON object')
    for key in ('images', 'categories'):
        if not isinstance(data.get(key), list):
            raise ConfigError(f'{path}: no "{key}" list - not a COCO instances file')
    if not isinstance(data.get('annotations'), list):
        if 'annotations' in data or labels:
            ev = ds_key.split('.', 1)[0].replace('_dataloader', '_evaluator')
            hint = '' if ev.startswith('train') or ev == ds_key.split('.', 1)[0] else (
                '. An image-info file (images and categories only, as COCO test-dev) has no '
                f'labels to score: to write a test-server submission set {ev}.format_only=True '
                f'and {ev}.outfile_prefix=DIR/NAME (docs/user_guide.md "7. Test-server '
                'submission")')
            raise ConfigError(f'{path}: no "annotations" list - not a COCO instances file' + hint)
        data['annotations'] = []
    image_ids = set()
    for i, img in enumerate(data['images']):
        for key in ('id', 'file_name', 'width', 'height'):
            if key not in img:
                raise ConfigError(f'{path}: images[{i}] has no "{key}"')
        image_ids.add(img['id'])
    if not data['images']:
        raise ConfigError(f'{path}: "images" is empty - the dataset ({ds_key}) would hold no '
                          'sample')
    cat_ids = {c.get('id') for c in data['categories'] if isinstance(c, dict)}
    warnings = []
    for i, ann in enumerate(data['annotations']):
        rid = ann.get('id', f'index {i}')
        for key in ('image_id', 'bbox', 'category_id'):
            if key not in ann:
                raise ConfigError(f'{path}: annotation {rid} has no "{key}"')
        if ann['image_id'] not in image_ids:
            warnings.append(f'annotation {rid}: image_id {ann["image_id"]} is not in "images" '
                            '(dropped)')
        if ann['category_id'] not in cat_ids:
            warnings.append(f'annotation {rid}: category_id {ann["category_id"]} is not in '
                            f'"categories" (ids {sorted(cat_ids)[:10]}) (dropped)')
        bbox = ann['bbox']
        if len(bbox) != 4 or bbox[2] < 1 or bbox[3] < 1 or ann.get('area', 1) <= 0:
            warnings.append(f'annotation {rid}: box {bbox} has zero area (skipped)')
        seg = ann.get('segmentation')
        if isinstance(seg, list):
            bad = [p for p in seg if len(p) < 6 or len(p) % 2]
            if bad:
                warnings.append(f'annotation {rid}: {len(bad)} polygon(s) with fewer than 3 points '
                                f'(dropped; the instance is ignored if none is left)')
    if img_dir is not None:
        _check_images_exist(path, data['images'], img_dir, ds_key)
    if labels:
        _check_filtered_coco(path, data, classes, filter_cfg, ds_key)
    if warnings and logger is not None:
        logger.warning(f'{path}: {len(warnings)} annotation record(s) will be skipped:\n  ' +
                       '\n  '.join(warnings[:20]) + ('\n  ...' if len(warnings) > 20 else ''))
    return warnings


def _check_images_exist(path, images, img_dir, key):
    missing = [im['file_name'] for im in images
               if not osp.isfile(osp.join(img_dir, im['file_name']))]
    if missing:
        more = f', ... ({len(missing)} in all)' if len(missing) > 5 else ''
        shown = ', '.join(missing[:5]) + more
        raise ConfigError(f'{path}: {len(missing)} of {len(images)} image(s) listed in "images" '
                          f'are not in {img_dir} ({key}.data_prefix.img): {shown}')


def _check_filtered_coco(path, data, classes, filter_cfg, key):
    """mmdet's CocoDataset.filter_data, counted from the json: error if nothing would be left."""
    if not filter_cfg or classes is None:
        return
    names = {c.get('name'): c.get('id') for c in data['categories'] if isinstance(c, dict)}
    wanted = {names[c] for c in classes if c in names}
    min_size = filter_cfg.get('min_size', 0) or 0
    with_ann = {a['image_id'] for a in data['annotations'] if a['category_id'] in wanted}
    kept = [im for im in data['images']
            if (not filter_cfg.get('filter_empty_gt', False) or im['id'] in with_ann)
            and min(im['width'], im['height']) >= min_size]
    if kept:
        return
    if not wanted:
        why = (f'none of the dataset\'s classes {list(classes)[:5]}... is among the file\'s '
               f'categories {list(names)[:5]} (set {key}.metainfo.classes)')
    elif not with_ann:
        why = (f'no image has an annotation of the dataset\'s classes ({len(data["annotations"])} '
               f'annotation(s) in the file); {key}.filter_cfg.filter_empty_gt=True drops such '
               'images')
    else:
        why = f'every image is smaller than {key}.filter_cfg.min_size={min_size}'
    raise ConfigError(f'{path}: the dataset ({key}) would be empty after filtering '
                      f'(filter_cfg={dict(filter_cfg)}): {why}')
