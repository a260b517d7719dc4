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

import mmlinattn  # noqa: F401  (registers our modules, applies the stack fixes)
from mmlinattn.apis import (ConfigError, add_common_args, build_runner, close_distributed,
                            config_from_args, enable_amp, parse_with_common_args, preflight,
                            tool_error)
from mmlinattn.checkpoint import CheckpointError, latest_intact_checkpoint


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Train a model')
    p.add_argument('config', help='train config file path')
    p.add_argument('--work-dir', help='the dir to save logs and checkpoints')
    p.add_argument('--resume', nargs='?', type=str, const='auto',
                   help='resume from this checkpoint, or (no value) from the latest one in work-dir')
    p.add_argument('--amp', action='store_true', help='automatic mixed precision (GPU only)')
    p.add_argument('--no-validate', action='store_true', help='skip validation during training')
    p.add_argument('--partial-load', action='store_true',
                   help='load_from: load the keys that fit and warn about the rest (fine-tuning a '
                        'whole detector/segmentor on other classes); default: refuse a misfit')
    add_common_args(p)
    return parse_with_common_args(p, argv)


def build_cfg(args):
    cfg = config_from_args(args)
    if args.amp:
        enable_amp(cfg)
    if args.resume == 'auto':
        # mmengine trusts `last_checkpoint` blindly; a truncated latest file would block every
        # resume, so take the newest checkpoint that actually reads (None: a fresh start)
        from mmengine.logging import MMLogger
        cfg.resume = True
        cfg.load_from = latest_intact_checkpoint(cfg.work_dir, MMLogger.get_current_instance())
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise ConfigError(f'--resume {args.resume}: checkpoint file not found')
        cfg.resume, cfg.load_from = True, args.resume
    if args.no_validate:
        cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    preflight(cfg, ('train_dataloader',) if args.no_validate else ('train_dataloader', 'val_dataloader'))
    if cfg.get('compile'):
        # mmengine compiles train_step, optimizer step included: dynamo needs plain-dict param groups
        hooks = list(cfg.get('custom_hooks') or [])
        if not any(h.get('type') == 'PlainParamGroupsHook' for h in hooks):
            cfg.custom_hooks = hooks + [dict(type='PlainParamGroupsHook')]
    return cfg


def main(argv=None):
    args = parse_args(argv)
    try:
        cfg = build_cfg(args)
        resume = bool(cfg.get('resume'))
        runner = build_runner(cfg, cfg.get('load_from'), partial=args.partial_load and not resume,
                              what='resume checkpoint' if resume else 'load_from')
    except (ConfigError, CheckpointError) as e:
        return tool_error('tools/train.py', e)
    runner.train()
    close_distributed()
    return 0


if __name__ == '__main__':
    sys.exit(main())
