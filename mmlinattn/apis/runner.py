"""The runner set-up tools/train.py and tools/test.py share: their common options, the config with
its overrides, the launcher's environment (CPU distributed runs included) and mmengine's Runner."""
import os
import os.path as osp
import sys
from typing import Optional

import torch
from mmengine.config import Config

from ..checkpoint import check_model_checkpoint
from .config import ConfigError
from .preflight import check_data_paths, check_model_channels
from .preflight.cfg_options import CfgOptionsAction, check_cfg_options


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


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """The config file with its ``--cfg-options`` merged (each checked against the config first)."""
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


def config_from_args(args) -> Config:
    """What every tool does first with its parsed ``args`` (``config``, ``cfg_options``, ``launcher``,
    ``work_dir``): the config with its overrides, the launcher's environment and the work dir."""
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


def preflight(cfg: Config, loaders) -> None:
    """The checks before the Runner is built: the datasets of ``loaders`` (paths, COCO files, label
    maps) and the model's channels."""
    check_data_paths(cfg, tuple(loaders))
    check_model_channels(cfg)


def build_runner(cfg: Config, checkpoint: Optional[str] = None, **check_kwargs):
    """mmengine's Runner, or the config's own ``runner_type``; with a whole-model ``checkpoint``
    (tested, ``load_from`` or resumed), the file is first checked against the Runner's model, so that
    a misfit never trains, resumes or is scored (``check_kwargs``: ``what``, ``partial``, see
    :func:`mmlinattn.checkpoint.check_model_checkpoint`)."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    if checkpoint:
        check_model_checkpoint(runner.model, checkpoint, logger=runner.logger, **check_kwargs)
    return runner


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
