"""Evaluate a checkpoint on a config's test set (OpenMMLab style).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl]
                         [--json-prefix PREFIX] [--tta] [--show-dir DIR]
                         [--cfg-options key=value ...] [--launcher none|pytorch|slurm|mpi]

``--out`` dumps the raw predictions (pickle); ``--json-prefix`` writes COCO-format result files
(``PREFIX.bbox.json`` / ``PREFIX.segm.json``) for detection configs; ``--tta`` runs the config's
test-time augmentation (ADE20K: multi-scale 0.5-1.75 + flip). Checkpoints are loaded weights-only.
"""
import argparse
import numbers
import os.path as osp
import sys

import mmlinattn  # noqa: F401  (registers our modules, applies the stack fixes)
from mmlinattn.apis import (ConfigError, add_common_args, build_runner, close_distributed,
                            config_from_args, parse_with_common_args, preflight, tool_error)
from mmlinattn.apis.runner import check_finite_checkpoint
from mmlinattn.apis.runs import check_work_dir
from mmlinattn.checkpoint import CheckpointError, local_checkpoint
from mmlinattn.datafaults import DataFileError


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Test (and evaluate) a model')
    p.add_argument('config', help='test config file path')
    p.add_argument('checkpoint', help='checkpoint file')
    p.add_argument('--work-dir', help='the dir to save the evaluation metrics')
    p.add_argument('--out', help='dump predictions to a pickle file (.pkl)')
    p.add_argument('--json-prefix', help='detection: also write COCO-format json results')
    p.add_argument('--show-dir', help='save visualised predictions here (under work-dir)')
    p.add_argument('--tta', action='store_true', help='test-time augmentation of the config')
    add_common_args(p)
    return parse_with_common_args(p, argv)


def build_cfg(args):
    cfg = config_from_args(args)
    check_work_dir(cfg.work_dir)  # unwritable: one line naming it, exit 2
    args.checkpoint = local_checkpoint(args.checkpoint)  # a URL: fetched once into torch's hub cache
    if not osp.isfile(args.checkpoint):
        raise ConfigError(f'checkpoint file not found: {args.checkpoint}')
    cfg.load_from = args.checkpoint
    # the backbone's own ImageNet init is pointless (and may be absent) when a full checkpoint loads
    backbone = cfg.get('model', {}).get('backbone')
    if isinstance(backbone, dict) and isinstance(backbone.get('init_cfg'), dict):
        backbone['init_cfg'] = None
    if args.tta:
        if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
            raise ConfigError(f'{args.config} defines no tta_model / tta_pipeline for --tta')
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        cfg.tta_model.module = cfg.model
        cfg.model = cfg.tta_model
    if args.json_prefix:
        ev = cfg.test_evaluator
        for e in (ev if isinstance(ev, list) else [ev]):
            if e.get('type', '').endswith('CocoMetric'):
                e['outfile_prefix'] = args.json_prefix
                break
        else:
            raise ConfigError('--json-prefix needs a CocoMetric test_evaluator (detection configs)')
    if args.out:
        if not args.out.endswith(('.pkl', '.pickle')):
            raise ConfigError('--out must end with .pkl or .pickle')
        dump = dict(type='DumpResults', out_file_path=args.out)
        ev = cfg.test_evaluator
        cfg.test_evaluator = (list(ev) if isinstance(ev, list) else [ev]) + [dump]
    if args.show_dir:
        hooks = cfg.default_hooks
        vis = hooks.get('visualization')
        if vis is None:
            raise ConfigError('the config has no visualization hook for --show-dir')
        vis['draw'] = True
        vis['test_out_dir'] = args.show_dir
        if vis.get('type') == 'SegVisualizationHook':
            vis['interval'] = 1
    preflight(cfg, ('test_dataloader',))
    check_finite_checkpoint(args.checkpoint)  # a diverged run's weights score a believable number
    return cfg


def main(argv=None):
    args = parse_args(argv)
    try:
        runner = build_runner(build_cfg(args), args.checkpoint)
    except (ConfigError, CheckpointError) as e:
        return tool_error('tools/test.py', e)
    try:
        metrics = runner.test()
    except DataFileError as e:  # an unreadable image / label map, named
        close_distributed()
        return tool_error('tools/test.py', e)

    def plain(v):  # numpy scalars printed as plain numbers
        real = isinstance(v, numbers.Real) and not isinstance(v, numbers.Integral)
        return round(float(v), 4) if real else v
    from mmengine.dist import get_rank
    if get_rank() == 0:  # every rank gets the metrics; print them once
        print({k: plain(v) for k, v in (metrics or {}).items()})
    close_distributed()
    return 0


if __name__ == '__main__':
    sys.exit(main())
