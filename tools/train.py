"""Train a detector, segmentor or classifier from a config (OpenMMLab style).

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp] [--auto-scale-lr]
                          [--no-validate] [--partial-load] [--no-pin-memory]
                          [--no-persistent-workers]
                          [--cfg-options key=value ...] [--launcher none|pytorch|slurm|mpi]

mmdet's, mmseg's and mmpretrain's flags, for their configs and ours. The run itself is the
config's Runner: ours (``runner_type = 'LinAttnRunner'`` in our runtimes, and for any config that
names none) checks the config, data and checkpoints before any work, stops on a non-finite loss,
saves on SIGTERM / Ctrl-C and locks the work dir, under this tool as under mmdet's or mmseg's own
``tools/train.py`` and ``mim train``. Not in mmdet's: ``--no-validate``, ``--no-pin-memory``,
``--no-persistent-workers`` (mmpretrain's) and ``--partial-load`` (ours). Multi-GPU / multi-node:
tools/dist_train.sh and tools/slurm_train.sh (torchrun / srun; mmengine does the distribution).
"""
import argparse
import sys

import mmlinattn  # noqa: F401  (registers our modules)
import mmlinattn.upstream_fixes  # noqa: F401  (mmengine on torch >= 2.6: see the module)
from mmlinattn.training import refusal
from mmlinattn.training.cli import (
    add_common_args,
    config_from_args,
    enable_amp,
    parse_with_common_args,
    tool_error,
)
from mmlinattn.training.config import ConfigError
from mmlinattn.training.runner import RunRefused, close_distributed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Train a model')
    p.add_argument('config', help='train config file path')
    p.add_argument('--work-dir', help='the dir to save logs and checkpoints')
    p.add_argument('--resume', nargs='?', type=str, const='auto',
                   help='resume from this checkpoint, or (no value) from the latest intact one in '
                   'work-dir')
    p.add_argument('--amp', action='store_true', help='automatic mixed precision (GPU only)')
    p.add_argument('--no-validate', action='store_true', help='skip validation during training')
    p.add_argument('--partial-load', action='store_true',
                   help='load_from: load the keys that fit and warn about the rest (fine-tuning a '
                        'whole detector/segmentor on other classes); default: refuse a misfit')
    p.add_argument('--auto-scale-lr', action='store_true',
                   help='scale the lr by (GPUs x batch size) / auto_scale_lr.base_batch_size, as '
                        "mmdet's tool (already on in our configs: auto_scale_lr.enable=True)")
    p.add_argument('--no-pin-memory', action='store_true',
                   help="the dataloaders' pin_memory off (mmpretrain's flag)")
    p.add_argument('--no-persistent-workers', action='store_true',
                   help="the dataloaders' persistent_workers off (mmpretrain's flag)")
    add_common_args(p)
    return parse_with_common_args(p, argv)


def build_cfg(args):
    """The run's config: the file, ``--cfg-options`` and the flags, as mmdet's tool sets them."""
    cfg = config_from_args(args)
    if args.amp:
        enable_amp(cfg)
    if args.resume == 'auto':  # the Runner takes the newest intact checkpoint of the work dir
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    if args.no_validate:
        cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    if args.partial_load:
        cfg.partial_load = True
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        if cfg.get(loader):
            if args.no_pin_memory:
                cfg[loader].pin_memory = False
            if args.no_persistent_workers:
                cfg[loader].persistent_workers = False
    if args.auto_scale_lr:
        if not isinstance(cfg.get('auto_scale_lr'), dict) or \
                'base_batch_size' not in cfg.auto_scale_lr:
            raise ConfigError('--auto-scale-lr: the config has no auto_scale_lr.base_batch_size; '
                              'add auto_scale_lr = dict(enable=True, base_batch_size=N), N the '
                              "total batch its optimizer's lr is for")
        cfg.auto_scale_lr.enable = True
    return cfg


def main(argv=None):
    from mmengine.registry import RUNNERS
    args = parse_args(argv)
    refusal.PROG = 'tools/train.py'  # the Runner's one-line errors name this tool
    try:
        cfg = build_cfg(args)
    except ConfigError as e:
        return tool_error('tools/train.py', e)
    try:
        RUNNERS.build(cfg).train()
    except RunRefused as e:  # said in one line by the Runner
        return e.code
    close_distributed()
    return 0


if __name__ == '__main__':
    sys.exit(main())
