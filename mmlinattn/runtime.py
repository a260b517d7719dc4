"""What tools/train.py and tools/test.py share: config loading, pre-flight checks, runner setup."""
import os
import os.path as osp
from typing import List, Optional

import torch
from mmengine.config import Config, DictAction  # noqa: F401  (re-exported for the tools)


class ConfigError(ValueError):
    """A config that cannot run as given; the message names the key to set."""


class CfgOptionsAction(DictAction):
    """mmengine's ``--cfg-options`` parser, with an argparse error naming an item without ``=``."""

    def __call__(self, parser, namespace, values, option_string=None):
        for kv in values if isinstance(values, list) else [values]:
            if '=' not in kv or kv.startswith('='):
                parser.error(f'{option_string or "--cfg-options"} {kv!r}: expected key=value '
                             '(e.g. train_dataloader.batch_size=4)')
        super().__call__(parser, namespace, values, option_string)


_MISSING = object()


def _lookup(cfg, dotted: str):
    node = cfg
    for part in dotted.split('.'):
        if isinstance(node, (dict, Config)) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def check_cfg_options(cfg: Config, cfg_options: dict) -> None:
    """An override whose value cannot replace the config's (a word where the config has a number or
    a bool; mmengine parses what is not a number, bool, None or list as a string) is a :class:`ConfigError` naming the key, the value and the type expected; a key the
    config does not have, but that is close to one it has, gets a did-you-mean warning."""
    import difflib
    import warnings
    for key, new in cfg_options.items():
        old = _lookup(cfg, key)
        if old is _MISSING:
            parent, _, leaf = key.rpartition('.')
            node = _lookup(cfg, parent) if parent else cfg
            if isinstance(node, (dict, Config)):
                close = difflib.get_close_matches(leaf, list(node.keys()), n=1, cutoff=0.8)
                if close:
                    warnings.warn(f'--cfg-options {key}: the config has no such key (added as new); '
                                  f'did you mean {(parent + ".") if parent else ""}{close[0]}?',
                                  stacklevel=2)
            continue
        bad = None
        if isinstance(new, str) and isinstance(old, bool):
            bad = 'True or False'
        elif isinstance(new, str) and isinstance(old, (int, float)):
            bad = 'a number'
        if bad:
            raise ConfigError(f'--cfg-options {key}={new!r}: expected {bad} (the config has '
                              f'{key}={old!r})')


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    if not osp.isfile(path):
        raise ConfigError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
        check_cfg_options(cfg, cfg_options)
        cfg.merge_from_dict(cfg_options)
    if 'default_scope' not in cfg:
        raise ConfigError(f'{path}: no default_scope; inherit one of configs/_base_/default_runtime_*.py '
                          "or set default_scope='mmdet' / 'mmseg' / 'mmpretrain'")
    return cfg


def _dataset_cfgs(cfg: Config, which: List[str]):
    for name in which:
        loader = cfg.get(name)
        if not loader:
            continue
        ds = loader.get('dataset')
        key = f'{name}.dataset'
        # unwrap RepeatDataset / ClassBalancedDataset / ConcatDataset
        while isinstance(ds, dict) and 'dataset' in ds and 'data_root' not in ds:
            ds, key = ds['dataset'], key + '.dataset'
        if isinstance(ds, dict) and 'datasets' in ds:
            for i, sub in enumerate(ds['datasets']):
                yield f'{key}.datasets.{i}', sub
        elif isinstance(ds, dict):
            yield key, ds


# COCO files above this size are not pre-checked (real COCO train is ~450 MB; mmdet parses it anyway).
COCO_CHECK_MAX_BYTES = 100 * 2 ** 20


def check_coco_annotations(path: str, logger=None, classes=None, filter_cfg=None,
                           ds_key: str = 'dataset') -> List[str]:
    """Validate a COCO-format annotation file before training.

    Structural problems (not JSON, truncated, no ``images``/``annotations``/``categories`` list, an
    annotation without ``image_id``/``bbox``) raise :class:`ConfigError` naming the file and record.
    Records mmdet would silently drop or ignore - a box of zero area, a polygon with fewer than 3
    points, a ``category_id`` not in ``categories`` - are reported as warnings (returned, and logged)
    naming the annotation id. With the dataset's ``classes`` and ``filter_cfg`` (``ds_key`` is its config
    key), a set that mmdet's filter would leave empty (no image with an annotation of those classes,
    or every image below ``min_size``) is an error naming the file and the filter.
    """
    import json
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f'{path}: not valid JSON (truncated or corrupt?) at line {e.lineno} '
                          f'column {e.colno}: {e.msg}') from None
    if not isinstance(data, dict):
        raise ConfigError(f'{path}: a COCO annotation file must hold a JSON object')
    for key in ('images', 'annotations', 'categories'):
        if not isinstance(data.get(key), list):
            raise ConfigError(f'{path}: no "{key}" list - not a COCO instances file')
    image_ids = set()
    for i, img in enumerate(data['images']):
        for key in ('id', 'file_name', 'width', 'height'):
            if key not in img:
                raise ConfigError(f'{path}: images[{i}] has no "{key}"')
        image_ids.add(img['id'])
    if not data['images']:
        raise ConfigError(f'{path}: "images" is empty - the dataset ({ds_key}) would hold no sample')
    cat_ids = {c.get('id') for c in data['categories'] if isinstance(c, dict)}
    warnings = []
    for i, ann in enumerate(data['annotations']):
        rid = ann.get('id', f'index {i}')
        for key in ('image_id', 'bbox', 'category_id'):
            if key not in ann:
                raise ConfigError(f'{path}: annotation {rid} has no "{key}"')
        if ann['image_id'] not in image_ids:
            warnings.append(f'annotation {rid}: image_id {ann["image_id"]} is not in "images" (dropped)')
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
    _check_filtered_coco(path, data, classes, filter_cfg, ds_key)
    if warnings and logger is not None:
        logger.warning(f'{path}: {len(warnings)} annotation record(s) will be skipped:\n  ' +
                       '\n  '.join(warnings[:20]) + ('\n  ...' if len(warnings) > 20 else ''))
    return warnings


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
        why = (f'none of the dataset\'s classes {list(classes)[:5]}... is among the file\'s categories '
               f'{list(names)[:5]} (set {key}.metainfo.classes)')
    elif not with_ann:
        why = (f'no image has an annotation of the dataset\'s classes ({len(data["annotations"])} '
               f'annotation(s) in the file); {key}.filter_cfg.filter_empty_gt=True drops such images')
    else:
        why = f'every image is smaller than {key}.filter_cfg.min_size={min_size}'
    raise ConfigError(f'{path}: the dataset ({key}) would be empty after filtering '
                      f'(filter_cfg={dict(filter_cfg)}): {why}')


def _dataset_class(cfg: Config, ds: dict):
    import importlib
    try:
        reg = importlib.import_module(cfg.default_scope + '.registry').DATASETS
        from mmengine.registry import init_default_scope
        init_default_scope(cfg.default_scope)
        return reg.get(ds['type']) if isinstance(ds.get('type'), str) else ds.get('type')
    except Exception:  # noqa: BLE001 - an unknown type fails later with the registry's own error
        return None


def _dataset_classes(cfg: Config, ds: dict):
    """The class names a dataset config selects (its ``metainfo`` or the dataset type's default)."""
    meta = ds.get('metainfo') or {}
    if meta.get('classes'):
        return list(meta['classes'])
    cls = _dataset_class(cfg, ds)
    return list(getattr(cls, 'METAINFO', {}).get('classes', ())) or None


# Segmentation sets up to this many files are checked file by file; larger ones by a seeded sample.
SEG_CHECK_ALL_MAX = 2000
SEG_CHECK_SAMPLE = 500


def _seg_num_classes(cfg: Config, ds: dict) -> Optional[int]:
    heads = cfg.get('model', {}).get('decode_head')
    head = heads[0] if isinstance(heads, (list, tuple)) and heads else heads
    if isinstance(head, dict) and isinstance(head.get('num_classes'), int):
        return head['num_classes']
    classes = _dataset_classes(cfg, ds)
    return len(classes) if classes else None


def check_seg_annotations(cfg: Config, key: str, ds_cfg: dict, logger=None) -> None:
    """Segmentation pre-flight: every (image, label map) pair the dataset lists has the same size, and
    every label value - after ``reduce_zero_label`` and ``label_map``, as mmseg's loader applies them -
    lies in ``[0, num_classes)`` or is the ignore index. Sets of up to ``SEG_CHECK_ALL_MAX`` files are
    checked whole, larger ones by a seeded sample of ``SEG_CHECK_SAMPLE`` (the log says which). Only
    image headers are read for the sizes.

    An empty set, a size mismatch or an out-of-range label raise :class:`ConfigError` naming the files,
    the values and the config key to change (mmseg would fail deep in the loss, or drop the pixels
    from the mIoU without a word).
    """
    import random

    import numpy as np
    from mmengine.logging import MMLogger
    from PIL import Image
    logger = logger or MMLogger.get_current_instance()
    cls = _dataset_class(cfg, ds_cfg)
    if cls is None or not hasattr(cls, 'load_data_list'):
        return
    try:
        ds = cls(**{k: v for k, v in ds_cfg.items() if k != 'type' and not k.startswith('_')},
                 lazy_init=True)
        infos = ds.load_data_list()
    except Exception:  # noqa: BLE001 - listing failed: the dataset raises its own error when built
        return
    if not infos:
        prefix = ds_cfg.get('data_prefix', {})
        raise ConfigError(f'{key}: no image found under {ds_cfg.get("data_root", "")}'
                          f'{prefix.get("img_path", "")} with suffix {getattr(ds, "img_suffix", "?")!r}'
                          f' (set {key}.data_prefix.img_path / {key}.img_suffix)')
    num_classes = _seg_num_classes(cfg, ds_cfg)
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
    size_bad, range_bad = [], []
    for info in chosen:
        seg_path = info.get('seg_map_path')
        if not seg_path or not osp.isfile(seg_path):
            continue  # a missing label file gets mmcv's FileNotFoundError naming it
        try:
            with Image.open(info['img_path']) as im:
                img_wh = im.size
            with Image.open(seg_path) as lab:
                lab_wh = lab.size
                values = np.unique(np.asarray(lab))
        except Exception:  # noqa: BLE001 - unreadable files fail in mmcv's loader, naming them
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
    if size_bad:
        problems.append(f'{len(size_bad)} label map(s) of another size than their image (mmseg would '
                        'train on misaligned labels or fail to batch them):\n    ' +
                        '\n    '.join(size_bad[:10]))
    if range_bad:
        problems.append(
            f'{len(range_bad)} label map(s) with values outside [0, {num_classes}) other than the '
            f'ignore index {ignore} (after reduce_zero_label={reduce_zero}; values as the loss sees '
            'them):\n    ' + '\n    '.join(range_bad[:10]) +
            f'\n  Fix the files, or model.decode_head.num_classes / {key}.reduce_zero_label')
    if problems:
        raise ConfigError(f'{key}: ' + '\n  '.join(problems))


def check_data_paths(cfg: Config, which=('train_dataloader', 'val_dataloader', 'test_dataloader')):
    """Fail before any model is built if a dataset root, annotation file or image folder is missing,
    naming the path and the config key that sets it."""
    problems = []
    for key, ds in _dataset_cfgs(cfg, list(which)):
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
                from mmengine.logging import MMLogger
                filter_cfg = None if ds.get('test_mode') else ds.get('filter_cfg')
                check_coco_annotations(path, MMLogger.get_current_instance(),
                                       classes=_dataset_classes(cfg, ds), filter_cfg=filter_cfg,
                                       ds_key=key)
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
        for key, ds in _dataset_cfgs(cfg, list(which)):
            if cfg.get('default_scope') == 'mmseg' and ds.get('data_prefix'):
                check_seg_annotations(cfg, key, ds)
    if problems:
        raise ConfigError(
            'dataset paths do not exist:\n  ' + '\n  '.join(problems) +
            '\nFix them with --cfg-options (e.g. --cfg-options '
            'train_dataloader.dataset.data_root=/path/to/data/), or see README.md "Data" for the '
            'expected layout (python tools/misc/make_toy_datasets.py writes a small one).')


def check_model_channels(cfg: Config) -> None:
    """Before the first forward: the neck's ``in_channels`` (or, without a neck, the decode/auxiliary
    heads' ``in_channels`` at their ``in_index``) must equal the channels our backbone returns for its
    ``out_indices``; else :class:`ConfigError` names both keys and both values. The backbone is built
    on the ``meta`` device (no memory, no init); backbones of other packages are left to their heads."""
    import copy
    model = cfg.get('model')
    if not isinstance(model, dict) or not isinstance(model.get('backbone'), dict):
        return
    if 'module' in model and isinstance(model['module'], dict):  # a TTA wrapper
        model = model['module']
    bb_cfg = copy.deepcopy(model['backbone'])
    if isinstance(bb_cfg, dict):
        bb_cfg['init_cfg'] = None
    try:
        models = model_registry(cfg)
        with torch.device('meta'):
            backbone = models.build(bb_cfg)
    except ValueError as e:  # our range checks (arch, out_indices, ...) - already a clear message
        raise ConfigError(f'model.backbone: {e}') from None
    except Exception:  # noqa: BLE001 - the Runner's own build reports other problems
        return
    if not type(backbone).__module__.startswith('mmlinattn'):
        return
    channels = list(backbone.num_features)
    out_key = f'model.backbone.out_indices={list(backbone.out_indices)}'
    neck = model.get('neck')
    neck = neck[0] if isinstance(neck, (list, tuple)) and neck else neck
    problems = []
    if isinstance(neck, dict) and 'in_channels' in neck:
        got = neck['in_channels']
        got = list(got) if isinstance(got, (list, tuple)) else got
        want = channels if isinstance(got, list) else channels[-1]  # an int: the last map
        if got != want:
            problems.append(f'model.neck.in_channels={got} but {out_key} of '
                            f'{type(backbone).__name__} gives {want}')
    elif neck is None:
        for name in ('decode_head', 'auxiliary_head'):
            heads = model.get(name)
            for i, head in enumerate(heads if isinstance(heads, (list, tuple)) else [heads]):
                if not isinstance(head, dict) or 'in_channels' not in head:
                    continue
                idx = head.get('in_index', -1)
                try:
                    want = ([channels[j] for j in idx] if isinstance(idx, (list, tuple))
                            else channels[idx])
                except IndexError:
                    problems.append(f'model.{name}.in_index={idx} but {out_key} returns only '
                                    f'{len(channels)} feature maps')
                    continue
                got = head['in_channels']
                got = list(got) if isinstance(got, (list, tuple)) else got
                if got != want:
                    where = f'model.{name}' + (f'[{i}]' if isinstance(heads, (list, tuple)) else '')
                    problems.append(f'{where}.in_channels={got} but {out_key} of '
                                    f'{type(backbone).__name__} gives {want} at in_index={idx}')
    if problems:
        raise ConfigError('the model does not fit together:\n  ' + '\n  '.join(problems))


def set_work_dir(cfg: Config, config_path: str, work_dir: Optional[str]) -> None:
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])


def prepare_env(cfg: Config, launcher: str) -> None:
    """Launcher and, without CUDA, the CPU distributed path: a gloo process group opened here (the
    Runner's own init is CUDA-only) and the model wrapped by ``CPUDistributedDataParallel`` (SyncBN
    reverted to BN). See :mod:`mmlinattn.distributed`."""
    cfg.launcher = launcher
    if launcher != 'none' and not torch.cuda.is_available():
        from mmlinattn import distributed
        dist_cfg = cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})
        dist_cfg['backend'] = 'gloo'
        try:
            distributed.init_cpu_process_group(launcher, float(dist_cfg.get('timeout', 1800)))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        distributed.use_cpu_ddp(cfg)


def enable_amp(cfg: Config) -> None:
    """--amp: mixed precision through mmengine's AmpOptimWrapper (needs a GPU)."""
    if not torch.cuda.is_available():
        raise ConfigError(
            '--amp needs a CUDA GPU: mmengine\'s AmpOptimWrapper refuses to run on the CPU. '
            'Train in fp32 on the CPU (drop --amp).')
    ow = cfg.optim_wrapper
    if ow.get('type', 'OptimWrapper') == 'AmpOptimWrapper':
        return
    ow.type = 'AmpOptimWrapper'
    ow.setdefault('loss_scale', 'dynamic')


def add_common_args(parser) -> None:
    """--cfg-options, --launcher and --local_rank, as every OpenMMLab tool has them."""
    parser.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction,
                        help='override config settings, key=value (e.g. train_dataloader.batch_size=4)')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def parse_with_common_args(parser, argv=None):
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def model_registry(cfg: Config):
    """The ``MODELS`` registry of the config's toolbox (``default_scope``), with that scope set."""
    import importlib

    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    return importlib.import_module(cfg.default_scope + '.registry').MODELS


def close_distributed() -> None:
    """End a distributed run cleanly: wait for every rank, then destroy the process group (a gloo
    group left to the interpreter's exit can abort the process after its work is done)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def build_runner(cfg: Config):
    """mmengine's Runner, or the config's own ``runner_type``."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    return RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
