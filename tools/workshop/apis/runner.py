"""The runner set-up tools/train.py and tools/test.py share: their common options, the config with
its overrides, the launcher's environment (CPU distributed runs included) and mmengine's Runner."""
import os
import os.path as osp
import sys
from typing import Optional

import torch
from mmengine.config import Config

from mmlinattn.core.weights import (
    CheckpointError,
    check_model_checkpoint,
    extract_state_dict,
    read_checkpoint,
)
from mmlinattn.core.weights.allowlist import own_loader
from mmlinattn.core.weights.reading import CheckpointContents

from .config import ConfigError, read_config_file
from .datafaults import naming_unreadable_files
from .preflight.cfg_options import CfgOptionsAction, check_cfg_options


def add_common_args(parser) -> None:
    """--cfg-options, --launcher and --local_rank, as every OpenMMLab tool has them."""
    parser.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction,
                        help='override config settings, key=value '
                        '(e.g. train_dataloader.batch_size=4)')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def parse_with_common_args(parser, argv=None):
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """The config file with its ``--cfg-options`` merged (each checked against the config first)."""
    if not osp.isfile(path):
        raise ConfigError(f'config file not found: {path}')
    try:
        cfg = read_config_file(path)  # without mmengine's pkg_resources warnings
    except FileNotFoundError as e:
        missing = _missing_base(path)
        if missing is None:
            raise
        raise ConfigError(missing) from e
    except AssertionError as e:  # mmengine's "does not support to load PACKAGE config"
        foreign = _foreign_package_base(path)
        if foreign is None:
            raise
        raise ConfigError(foreign) from e
    if cfg_options:
        check_cfg_options(cfg, cfg_options)
        cfg.merge_from_dict(cfg_options)
    if 'default_scope' not in cfg:
        raise ConfigError(f'{path}: no default_scope; inherit one of '
                          'configs/_base_/default_runtime_*.py '
                          "or set default_scope='mmdet' / 'mmseg' / 'mmpretrain'")
    return cfg


def _foreign_package_base(path: str) -> Optional[str]:
    """For a ``_base_ = 'PACKAGE::...'`` entry (under ``path``, followed through local bases) that
    mmengine refuses (it loads only the OpenMMLab packages of its ``MODULE2PACKAGE``): the line to
    write instead (the file's path); ``None`` where there is none."""
    from mmengine.config.utils import MODULE2PACKAGE
    todo, seen = [path], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            bases = Config._get_base_files(current)
        except Exception:  # the entries cannot be read (any error): mmengine's own error stands
            return None
        for base in bases:
            if '::' not in base:
                todo.append(osp.join(osp.dirname(current), base))
                continue
            package, relative = base.split('::', 1)
            if package in MODULE2PACKAGE:
                continue
            if package == 'mmlinattn':
                from mmlinattn.paths import config_path
                instead = f"_base_ = [{config_path(relative)!r}]"
            else:
                instead = f"_base_ = ['/path/to/{package}/configs/{relative}']"
            return (f'{current}: _base_ {base!r}: mmengine loads PACKAGE:: bases only from the '
                    f'OpenMMLab packages it lists ({package} is not one of them); write the '
                    f'file\'s path instead: {instead}')
    return None


def _missing_base(path: str, seen=None) -> Optional[str]:
    """The first ``_base_`` entry under ``path`` (followed recursively, local files only) whose file
    does not exist, as ``CONFIG: _base_ 'ENTRY' not found (RESOLVED PATH)``; ``None`` if all
    exist."""
    seen = seen if seen is not None else set()
    if path in seen:
        return None
    seen.add(path)
    try:
        bases = Config._get_base_files(path)
    except Exception:  # only a better message is tried while load_config handles a
        # FileNotFoundError: mmengine parses and evaluates the user's _base_ expression here (a
        # SyntaxError, a NameError, a yaml / json error...), and on any failure that
        # FileNotFoundError is raised as it is - nothing passes silently
        return None
    for base in bases:
        if '::' in base:  # mmdet:: / mmseg:: - resolved in the installed package
            continue
        resolved = osp.normpath(osp.join(osp.dirname(osp.abspath(path)), base))
        if not osp.isfile(resolved):
            return (f"{path}: _base_ entry {base!r} not found (looked for {resolved}); fix the "
                    "path in _base_ (relative to the config that names it)")
        inner = _missing_base(resolved, seen)
        if inner:
            return inner
    return None


def set_work_dir(cfg: Config, config_path: str, work_dir: Optional[str]) -> None:
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])


def prepare_env(cfg: Config, launcher: str) -> None:
    """Launcher and, without CUDA, the CPU distributed path: a gloo process group opened here (the
    Runner's own init is CUDA-only) and the model wrapped by ``CPUDistributedDataParallel`` (SyncBN
    reverted to BN). See :mod:`mmlinattn.training.distributed`."""
    cfg.launcher = launcher
    if launcher != 'none':
        from mmlinattn.training import distributed
        try:
            distributed.check_launcher_env(launcher)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if launcher != 'none' and not torch.cuda.is_available():
        from mmlinattn.training import distributed
        dist_cfg = cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})
        dist_cfg['backend'] = 'gloo'
        try:
            distributed.init_cpu_process_group(launcher, float(dist_cfg.get('timeout', 1800)))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        distributed.use_cpu_ddp(cfg)


def config_from_args(args) -> Config:
    """What every tool does first with its parsed ``args`` (``config``, ``cfg_options``,
    ``launcher``, ``work_dir``): the config with its overrides, the launcher's environment and the
    work dir. A bad ``MMLINATTN_*`` value (:mod:`mmlinattn.core.settings`) stops it first."""
    from mmlinattn.core import settings
    try:
        settings.check_all()
    except settings.SettingError as e:
        raise ConfigError(str(e)) from None
    cfg = load_config(args.config, args.cfg_options)
    prepare_env(cfg, args.launcher)
    set_work_dir(cfg, args.config, args.work_dir)
    return cfg


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


def add_training_hooks(cfg: Config) -> None:
    """The hooks tools/train.py adds to every training run (user configs need nothing):
    :class:`~mmlinattn.training.hooks.NonFiniteLossHook` (off with ``check_non_finite=False`` in the
    config) and :class:`~mmlinattn.training.hooks.PreemptionHook` (signals from
    ``preemption_signals``, default ``['SIGTERM', 'SIGUSR1']``; ``[]`` turns it off). A hook of the
    same type already in ``custom_hooks`` is left as the config sets it. A plain ``CheckpointHook``
    in ``default_hooks`` becomes :class:`~mmlinattn.training.hooks.SafeCheckpointHook` with the same
    arguments (atomic writes, rotation after the save)."""
    ckpt = (cfg.get('default_hooks') or {}).get('checkpoint')
    if isinstance(ckpt, dict) and ckpt.get('type') in ('CheckpointHook', 'mmengine.CheckpointHook'):
        ckpt['type'] = 'SafeCheckpointHook'
    hooks = list(cfg.get('custom_hooks') or [])
    have = {h.get('type') for h in hooks if isinstance(h, dict)}
    if cfg.get('check_non_finite', True) and 'NonFiniteLossHook' not in have:
        hooks.append(dict(type='NonFiniteLossHook'))
    signals = cfg.get('preemption_signals', ('SIGTERM', 'SIGUSR1'))
    if signals and 'PreemptionHook' not in have:
        hooks.append(dict(type='PreemptionHook', signals=list(signals)))
    cfg.custom_hooks = hooks


def build_runner(cfg: Config, checkpoint: Optional[str] = None,
                 contents: Optional[CheckpointContents] = None, **check_kwargs):
    """mmengine's Runner, or the config's own ``runner_type``, whose datasets name an unreadable
    data file (:mod:`tools.workshop.apis.datafaults`); with a whole-model ``checkpoint``
    (tested, ``load_from`` or resumed), the file is first checked against the Runner's model, so
    that a misfit never trains, resumes or is scored (``check_kwargs``: ``what``, ``partial``, see
    :func:`mmlinattn.core.weights.check_model_checkpoint`).

    ``contents``: the checkpoint as the tool has read it already
    (:func:`mmlinattn.core.weights.reading.read_contents`): the check takes them, and so does the
    Runner's own load of that file (:func:`_loading_any_runner_checkpoint`), so the file is read
    once in the run."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    _fresh_visualizer_name(cfg)
    # the config dump the Runner writes at construction: removed again if this run stops before any
    # work and no earlier run had left one under that name
    dumped = osp.join(cfg.work_dir, osp.basename(cfg.filename)) if cfg.get('work_dir') and \
        cfg.filename else None
    dumped_before = dumped is not None and osp.exists(dumped)
    # our load below reads any Runner checkpoint: the backbones' note about torch's loader is moot
    with own_loader():
        runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    # the datasets this runner builds name an unreadable image / label map
    # (tools.workshop.apis.datafaults)
    runner.build_dataloader = naming_unreadable_files(runner.build_dataloader)
    # its load takes the contents the tool has read; Runner checkpoints that mmengine wrote without
    # mmlinattn.upstream_fixes load too
    given = contents
    if contents is not None and not (checkpoint and contents.matches(checkpoint)):
        contents = None  # another file, or the file changed since: read here
    runner.load_checkpoint = _loading_any_runner_checkpoint(runner, contents)
    if cfg.get('default_scope') == 'mmseg':  # large images: no full-resolution logits
        from mmengine.model import is_model_wrapper

        from .seg_postprocess import lean_postprocess
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        if hasattr(model, 'decode_head'):  # a segmentor (not a TTA wrapper, which needs logits)
            lean_postprocess(model)
    if checkpoint:
        try:
            check_model_checkpoint(runner.model, checkpoint, logger=runner.logger,
                                   obj=contents.obj if contents is not None else None,
                                   backbone_cfg=(cfg.get('model') or {}).get('backbone'),
                                   allow_attention_change=bool(cfg.get('allow_attention_change')),
                                   **check_kwargs)
        except Exception:  # cleanup, then the same error raised on as it is
            _remove_log_dir(runner)  # nothing was done: leave no empty timestamped log folder
            if dumped and not dumped_before and osp.isfile(dumped):
                os.remove(dumped)
            raise
    if given is not None and not (contents is not None and contents.runner_readable and
                                  type(runner).load_checkpoint is Runner.load_checkpoint):
        # checked, and not to be handed to the Runner's load: not kept for the rest of the run
        given.obj = None
    return runner


def _loading_any_runner_checkpoint(runner, contents: Optional[CheckpointContents] = None):
    """``runner.load_checkpoint`` (``--resume``, ``load_from``, tools/test.py's checkpoint) that

    * takes ``contents`` - the file as the tool has read it already, the Runner's way (weights-only,
      on the CPU) - instead of reading the file again, the first time it is asked for that file
      (unchanged since the read) with a ``map_location`` that can be applied to tensors already read
      (``'cpu'``, or a device such as mmengine's resume passes: the tensors are moved there, storage
      shared as ``torch.load`` shares it); the contents are not kept after that load. Only for
      mmengine's own ``Runner.load_checkpoint`` (another runner class loads its own way);
    * also reads a checkpoint mmengine wrote without ``mmlinattn.upstream_fixes`` - mmdet's or
      mmseg's own train.py on a config of theirs - which torch >= 2.6 refuses to load weights-only
      (``Unsupported global: GLOBAL builtins.getattr``, the HistoryBuffers' methods): then read with
      :func:`mmlinattn.core.weights.load_runner_checkpoint` (torch's weights-only loader with
      HistoryBuffer and its own methods allowed, for that load only).

    Either way the checkpoint is applied as mmengine's own ``load_checkpoint`` applies it: the
    ``after_load_checkpoint`` hooks, ``revise_keys``, ``strict``; ``resume`` goes on from the
    returned dict (optimizer, schedulers, message hub)."""
    import pickle

    from mmengine.runner import Runner
    original = runner.load_checkpoint
    own_load = type(runner).load_checkpoint is Runner.load_checkpoint
    pending = [contents] if own_load and contents is not None and contents.runner_readable else []

    def load_checkpoint(filename, map_location='cpu', strict=False,
                        revise_keys=[(r'^module.', '')]):  # noqa: B006 - mmengine's signature
        checkpoint = None
        handed = pending.pop() if pending else None
        obj = None
        if handed is not None:
            # taken at the first load, used or not: not kept for the rest of the run
            obj, handed.obj = handed.obj, None
        if handed is not None and obj is not None and handed.matches(filename):
            checkpoint = on_device(obj, map_location)
            runner.logger.info(
                f'{filename}: ' + ('the contents read before the run, not read again' if checkpoint
                                   is not None else f'read again for map_location={map_location!r}'
                                   ' (not applicable to contents already read)'))
        if checkpoint is None:
            try:
                return original(filename, map_location=map_location, strict=strict,
                                revise_keys=revise_keys)
            except pickle.UnpicklingError as err:
                if not osp.isfile(filename):  # open-mmlab://, s3://...: mmengine's own error
                    raise
                from mmlinattn.core.weights import load_runner_checkpoint
                checkpoint = load_runner_checkpoint(filename, map_location=map_location)
                runner.logger.info(f'{filename}: torch refused to load it weights-only '
                                   f'({str(err).strip().splitlines()[-1][:120]}); read with '
                                   "mmlinattn's Runner-checkpoint reader")
        from mmengine.model import is_model_wrapper
        from mmengine.runner.checkpoint import _load_checkpoint_to_model
        runner.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        checkpoint = _load_checkpoint_to_model(model, checkpoint, strict, revise_keys=revise_keys)
        runner._has_loaded = True
        runner.logger.info(f'Load checkpoint from {filename}')
        return checkpoint

    return load_checkpoint


def on_device(obj, map_location):
    """``obj`` - a checkpoint read on the CPU - as ``torch.load(..., map_location=map_location)``
    would have returned it: as it is for the CPU; for another device (a ``str`` or
    ``torch.device``) every tensor moved there, in place in its dict / list, tensors that shared a
    storage sharing the moved one. ``None`` for a ``map_location`` that depends on where each
    tensor was saved (a function, a dict, ``None``): the file must be read with it."""
    if not isinstance(map_location, (str, torch.device)):
        return None
    device = torch.device(map_location)
    if device.type == 'cpu':
        return obj
    return _moved(obj, device, {})


def _moved(obj, device, storages):
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            return obj.to(device)
        storage = obj.untyped_storage()
        key = storage.data_ptr() if storage.nbytes() else None
        new = storages.get(key) if key is not None else None
        if new is None:  # as torch.load's restore: a storage of the size on the device, copied
            new = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device).untyped_storage()
            new.copy_(storage)
            if key is not None:
                storages[key] = new
        moved = torch.empty(0, dtype=obj.dtype, device=device).set_(
            new, obj.storage_offset(), obj.size(), obj.stride())
        if isinstance(obj, torch.nn.Parameter):
            return torch.nn.Parameter(moved, requires_grad=obj.requires_grad)
        return moved.requires_grad_(obj.requires_grad)
    if isinstance(obj, dict):
        for k in list(obj):
            obj[k] = _moved(obj[k], device, storages)
    elif isinstance(obj, list):
        obj[:] = [_moved(v, device, storages) for v in obj]
    elif type(obj) is tuple:
        return tuple(_moved(v, device, storages) for v in obj)
    return obj


def _remove_log_dir(runner) -> None:
    """Remove the timestamped log folder the Runner made at construction (its log file and an
    empty vis_data), for a run that stops before any work."""
    import shutil

    from mmengine.logging import MMLogger
    log_dir = getattr(runner, 'log_dir', None)
    if not log_dir or not osp.isdir(log_dir) or \
            osp.dirname(osp.abspath(log_dir)) != osp.abspath(runner.work_dir):
        return
    logger = MMLogger.get_current_instance()
    for h in list(logger.handlers):
        if getattr(h, 'baseFilename', '').startswith(osp.abspath(log_dir)):
            h.close()
            logger.removeHandler(h)
    # this run's visualizer writes into the folder: mmengine hands an existing instance of that name
    # to the next Runner of the process (a notebook, a test), which would write into a folder that
    # is gone; forget it, as if this run had not been built
    vis = getattr(runner, 'visualizer', None)
    instances = getattr(type(vis), '_instance_dict', None)
    if vis is not None and isinstance(instances, dict):
        instances.pop(getattr(vis, 'instance_name', None), None)
    shutil.rmtree(log_dir, ignore_errors=True)


def _fresh_visualizer_name(cfg: Config) -> None:
    """A second run in one process (a notebook, a script that trains then tests, a test suite)
    gets a visualizer of its own. mmengine keeps visualizers by name (``visualizer`` in every
    OpenMMLab runtime config) and hands back an existing one, with its old save_dir and drawing
    class, when the name is taken: that run's scalars, drawings and vis_data went into the earlier
    run's folder. A fresh tool process never meets this and keeps the config's name."""
    from mmengine.visualization import Visualizer
    vis = cfg.get('visualizer')
    if not isinstance(vis, dict):
        return
    name = vis.get('name', 'visualizer')
    if Visualizer.check_instance_created(name):
        n = 1
        while Visualizer.check_instance_created(f'{name}_{n}'):
            n += 1
        vis['name'] = f'{name}_{n}'


def check_finite_checkpoint(path: str, obj: Optional[dict] = None) -> None:
    """Refuse a checkpoint whose weights hold NaN/inf (a run that diverged): a
    :class:`CheckpointError` naming the file, how many tensors and the first of them. ``obj``: the
    file's contents where the caller has read them already (else it is read here)."""
    from mmlinattn.training.hooks import non_finite_tensors
    state = extract_state_dict(read_checkpoint(path) if obj is None else obj, path=path)
    names, n, total = non_finite_tensors(state)
    if n:
        raise CheckpointError(
            f'checkpoint {path}: {n} of {total} tensors hold NaN/inf ({", ".join(names)}'
            f'{", ..." if n > len(names) else ""}) - the run diverged before it was saved; '
            'evaluate an earlier checkpoint')


def close_distributed() -> None:
    """End a distributed run cleanly: wait for every rank, then destroy the process group (a gloo
    group left to the interpreter's exit can abort the process after its work is done)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def tool_error(tool: str, error: Exception) -> int:
    """Report a config or checkpoint problem as ``TOOL: error: ...`` on stderr; the exit code, 2."""
    print(f'{tool}: error: {error}', file=sys.stderr)
    return 2
