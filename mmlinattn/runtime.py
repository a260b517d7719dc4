"""What tools/train.py and tools/test.py share: config loading, pre-flight checks, runner setup."""
import os
import os.path as osp
from typing import List, Optional

import torch
from mmengine.config import Config, DictAction  # noqa: F401  (re-exported for the tools)


class ConfigError(ValueError):
    """A config that cannot run as given; the message names the key to set."""


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    if not osp.isfile(path):
        raise ConfigError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
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


def check_coco_annotations(path: str, logger=None) -> List[str]:
    """Validate a COCO-format annotation file before training.

    Structural problems (not JSON, truncated, no ``images``/``annotations``/``categories`` list, an
    annotation without ``image_id``/``bbox``) raise :class:`ConfigError` naming the file and record.
    Records mmdet would silently drop or ignore - a box of zero area, a polygon with fewer than 3
    points - are reported as warnings (returned, and logged) naming the annotation id.
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
    warnings = []
    for i, ann in enumerate(data['annotations']):
        rid = ann.get('id', f'index {i}')
        for key in ('image_id', 'bbox', 'category_id'):
            if key not in ann:
                raise ConfigError(f'{path}: annotation {rid} has no "{key}"')
        if ann['image_id'] not in image_ids:
            warnings.append(f'annotation {rid}: image_id {ann["image_id"]} is not in "images" (dropped)')
        bbox = ann['bbox']
        if len(bbox) != 4 or bbox[2] < 1 or bbox[3] < 1 or ann.get('area', 1) <= 0:
            warnings.append(f'annotation {rid}: box {bbox} has zero area (skipped)')
        seg = ann.get('segmentation')
        if isinstance(seg, list):
            bad = [p for p in seg if len(p) < 6 or len(p) % 2]
            if bad:
                warnings.append(f'annotation {rid}: {len(bad)} polygon(s) with fewer than 3 points '
                                f'(dropped; the instance is ignored if none is left)')
    if warnings and logger is not None:
        logger.warning(f'{path}: {len(warnings)} annotation record(s) will be skipped:\n  ' +
                       '\n  '.join(warnings[:20]) + ('\n  ...' if len(warnings) > 20 else ''))
    return warnings


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
                check_coco_annotations(path, MMLogger.get_current_instance())
        prefix = ds.get('data_prefix') or {}
        if isinstance(prefix, str):  # mmpretrain: data_prefix='train'
            prefix = dict(img_path=prefix)
        for sub, folder in prefix.items():
            if not folder or not isinstance(folder, str):
                continue
            path = folder if osp.isabs(folder) or not root else osp.join(root, folder)
            if not osp.isdir(path):
                problems.append(f'{key}.data_prefix.{sub} = {folder!r}: directory not found ({path})')
    if problems:
        raise ConfigError(
            'dataset paths do not exist:\n  ' + '\n  '.join(problems) +
            '\nFix them with --cfg-options (e.g. --cfg-options '
            'train_dataloader.dataset.data_root=/path/to/data/), or see README.md "Data" for the '
            'expected layout (python tools/misc/make_toy_datasets.py writes a small one).')


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
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
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
