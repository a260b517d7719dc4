"""Train a detector, segmentor or classifier from a config (OpenMMLab style).

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp]
                          [--cfg-options key=value ...] [--launcher none|pytorch|slurm|mpi]

Works for mmdet, mmseg and mmpretrain configs alike (ours carry custom_imports=['mmlinattn'];
upstream configs work too). Multi-GPU / multi-node: tools/dist_train.sh and tools/slurm_train.sh,
which start this script through torchrun / srun (mmengine does the distribution).
"""
import argparse
import os.path as osp
import sys

import mmlinattn  # noqa: F401  (registers our modules)
import mmlinattn.upstream_fixes  # noqa: F401  (mmengine on torch >= 2.6: see the module)
from mmlinattn.core.weights import CheckpointError
from mmlinattn.core.weights.reading import read_contents
from mmlinattn.training.hooks import CheckpointWriteError, TrainingStopped

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..')))  # for tools.workshop
from tools.workshop.apis import (
    ConfigError,
    add_common_args,
    build_runner,
    close_distributed,
    config_from_args,
    enable_amp,
    parse_with_common_args,
    preflight,
    tool_error,
)
from tools.workshop.apis.datafaults import DataFileError
from tools.workshop.apis.preflight.checkpoints import prepare_checkpoints
from tools.workshop.apis.preflight.compile import check_compile
from tools.workshop.apis.resume import latest_intact_contents
from tools.workshop.apis.runner import add_training_hooks
from tools.workshop.apis.runs import check_work_dir
from tools.workshop.apis.workdir_lock import lock_work_dir


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Train a model')
    p.add_argument('config', help='train config file path')
    p.add_argument('--work-dir', help='the dir to save logs and checkpoints')
    p.add_argument('--resume', nargs='?', type=str, const='auto',
                   help='resume from this checkpoint, or (no value) from the latest one in '
                   'work-dir')
    p.add_argument('--amp', action='store_true', help='automatic mixed precision (GPU only)')
    p.add_argument('--no-validate', action='store_true', help='skip validation during training')
    p.add_argument('--partial-load', action='store_true',
                   help='load_from: load the keys that fit and warn about the rest (fine-tuning a '
                        'whole detector/segmentor on other classes); default: refuse a misfit')
    p.add_argument('--auto-scale-lr', action='store_true',
                   help='scale the lr by (GPUs x batch size) / auto_scale_lr.base_batch_size, as '
                        "mmdet's tool (already on in our configs: auto_scale_lr.enable=True)")
    add_common_args(p)
    return parse_with_common_args(p, argv)


def _build_cfg(args):
    """``(cfg, contents)``: see :func:`prepare`."""
    cfg = config_from_args(args)
    contents = None
    check_work_dir(cfg.work_dir)  # unwritable: one line naming it, exit 2
    global _LOCK
    _LOCK = lock_work_dir(cfg.work_dir)  # another live run in this work dir: one line, exit 2
    if args.amp:
        enable_amp(cfg)
    if args.resume == 'auto':
        # mmengine trusts `last_checkpoint` blindly; a truncated latest file would block every
        # resume, so take the newest checkpoint that actually reads (None: a fresh start)
        from mmengine.logging import MMLogger
        cfg.resume = True
        contents = latest_intact_contents(cfg.work_dir, MMLogger.get_current_instance())
        cfg.load_from = contents.path if contents is not None else None
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise ConfigError(f'--resume {args.resume}: checkpoint file not found')
        cfg.resume, cfg.load_from = True, args.resume
    if args.no_validate:
        cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    if args.auto_scale_lr:
        if not isinstance(cfg.get('auto_scale_lr'), dict) or \
                'base_batch_size' not in cfg.auto_scale_lr:
            raise ConfigError('--auto-scale-lr: the config has no auto_scale_lr.base_batch_size; '
                              'add auto_scale_lr = dict(enable=True, base_batch_size=N), N the '
                              "total batch its optimizer's lr is for")
        cfg.auto_scale_lr.enable = True
    check_compile(cfg)  # one line where the inputs change size (inductor fails at the second)
    # the config, every loader's paths, the files' contents, the model
    # (tools.workshop.apis.preflight)
    checked = preflight(cfg, ('train_dataloader',) if args.no_validate else
                        ('train_dataloader', 'val_dataloader'))
    if args.resume not in (None, 'auto'):  # --resume auto read the file it chose
        contents = read_contents(args.resume)  # read as the runner will: else one line, exit 2
    if cfg.get('resume') and contents is not None:
        check_something_left(cfg, contents)
    # URLs fetched once; a backbone init_cfg file that does not fit: one line, before the Runner;
    # load_from read once (unless read above), its contents handed to the Runner
    contents = prepare_checkpoints(cfg, resume=bool(cfg.get('resume')), contents=contents,
                                   backbone=checked.backbone)
    add_training_hooks(cfg)  # non-finite loss stops the run; SIGTERM/SIGUSR1 save and stop
    if cfg.get('compile'):
        # mmengine compiles train_step, optimizer step included: dynamo needs plain-dict param
        # groups
        hooks = list(cfg.get('custom_hooks') or [])
        if not any(h.get('type') == 'PlainParamGroupsHook' for h in hooks):
            cfg.custom_hooks = hooks + [dict(type='PlainParamGroupsHook')]
    return cfg, contents


class NothingToTrain(Exception):
    """The resumed checkpoint is at the end of the schedule (exit 0, one line)."""


def check_something_left(cfg, contents) -> None:
    """:class:`NothingToTrain` when the resumed checkpoint has reached ``train_cfg``'s
    ``max_epochs`` / ``max_iters`` (mmengine would build everything and train nothing)."""
    meta = contents.obj.get('meta') if isinstance(contents.obj, dict) else None
    train_cfg = cfg.get('train_cfg') or {}
    if not isinstance(meta, dict):
        return
    for unit, key in (('epoch', 'max_epochs'), ('iter', 'max_iters')):
        done, total = meta.get(unit), train_cfg.get(key)
        if isinstance(done, int) and isinstance(total, int) and done >= total:
            raise NothingToTrain(
                f'{contents.path} is at {unit} {done} of train_cfg.{key}={total}: nothing left to '
                f'train (raise it with --cfg-options train_cfg.{key}=N to train on)')


def log_auto_scale_lr(runner, cfg) -> None:
    """At start-up, the base batch, the actual batch and the lr(s) the Runner will train with."""
    asl = cfg.get('auto_scale_lr') or {}
    if not asl.get('enable') or 'base_batch_size' not in asl or not cfg.get('train_dataloader'):
        return
    batch = cfg.train_dataloader.get('batch_size', 1)
    real, base = runner.world_size * batch, asl['base_batch_size']
    ow = cfg.get('optim_wrapper') or {}
    opts = {'': ow['optimizer']} if 'optimizer' in ow else \
        {f'{k}.': v['optimizer'] for k, v in ow.items() if isinstance(v, dict) and 'optimizer' in v}
    lrs = ', '.join(f'{k}lr {o["lr"]:g} -> {o["lr"] * real / base:g}' for k, o in opts.items()
                    if 'lr' in o)
    runner.logger.info(f'auto_scale_lr: base batch {base}, actual batch {real} '
                       f'({runner.world_size} process(es) x {batch}): {lrs}')


def _main(argv=None):
    args = parse_args(argv)
    try:
        cfg, contents = prepare(args)
        resume = bool(cfg.get('resume'))
        runner = build_runner(cfg, cfg.get('load_from'), contents=contents,
                              partial=args.partial_load and not resume,
                              what='resume checkpoint' if resume else 'load_from')
    except (ConfigError, CheckpointError) as e:
        return tool_error('tools/train.py', e)
    except NothingToTrain as e:
        print(f'tools/train.py: {e}', flush=True)
        return 0
    log_auto_scale_lr(runner, cfg)
    try:
        runner.train()
    except (DataFileError, CheckpointError) as e:  # a data file / the resumed file, named
        close_distributed()
        return tool_error('tools/train.py', e)
    except (TrainingStopped, CheckpointWriteError) as e:  # one line; exit 75 after a preemption
        tool_error('tools/train.py', e)
        if isinstance(e, TrainingStopped):  # raised on every rank at the same iteration
            close_distributed()
        return e.exit_code
    close_distributed()
    return 0


#: this process's work-dir run lock (tools.workshop.apis.workdir_lock), released when main
#: returns
_LOCK = None


def _release_lock():
    global _LOCK
    if _LOCK is not None:
        _LOCK.release()
        _LOCK = None


def prepare(args):
    """``(cfg, contents)``: the run's config, checked, and the checkpoint the Runner will load
    (``load_from`` or the ``--resume`` file) read once
    (:class:`~mmlinattn.core.weights.reading.CheckpointContents`, None without one), for the fit
    check and the Runner's own load (:func:`~tools.workshop.apis.build_runner`). The work dir's
    run lock is taken on the way, and given back if the config fails its checks (nothing of this
    run is left in the work dir)."""
    try:
        return _build_cfg(args)
    except BaseException:  # the lock given back on any way out, then raised on
        _release_lock()
        raise


def build_cfg(args):
    """The run's config (see :func:`prepare`)."""
    return prepare(args)[0]


def main(argv=None):
    try:
        return _main(argv)
    finally:
        _release_lock()


if __name__ == '__main__':
    sys.exit(main())
