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

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # repo root, for a plain checkout

import mmlinattn  # noqa: E402,F401  (registers our modules, applies the stack fixes)
from mmlinattn.runtime import (ConfigError, add_common_args, build_runner,  # noqa: E402
                               close_distributed,
                               check_data_paths, enable_amp, load_config,
                               parse_with_common_args, prepare_env, set_work_dir)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Train a model')
    p.add_argument('config', help='train config file path')
    p.add_argument('--work-dir', help='the dir to save logs and checkpoints')
    p.add_argument('--resume', nargs='?', type=str, const='auto',
                   help='resume from this checkpoint, or (no value) from the latest one in work-dir')
    p.add_argument('--amp', action='store_true', help='automatic mixed precision (GPU only)')
    p.add_argument('--no-validate', action='store_true', help='skip validation during training')
    add_common_args(p)
    return parse_with_common_args(p, argv)


def build_cfg(args):
    cfg = load_config(args.config, args.cfg_options)
    prepare_env(cfg, args.launcher)
    set_work_dir(cfg, args.config, args.work_dir)
    if args.amp:
        enable_amp(cfg)
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise ConfigError(f'--resume {args.resume}: checkpoint file not found')
        cfg.resume, cfg.load_from = True, args.resume
    if args.no_validate:
        cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
        check_data_paths(cfg, ('train_dataloader',))
    else:
        check_data_paths(cfg, ('train_dataloader', 'val_dataloader'))
    return cfg


def main(argv=None):
    args = parse_args(argv)
    try:
        cfg = build_cfg(args)
    except ConfigError as e:
        print(f'tools/train.py: error: {e}', file=sys.stderr)
        return 2
    runner = build_runner(cfg)
    runner.train()
    close_distributed()
    return 0


if __name__ == '__main__':
    sys.exit(main())
