"""What our command-line tools share before a Runner exists: their OpenMMLab options
(``--cfg-options``, ``--launcher``, ``--local_rank``), the config read with a line naming a missing
or foreign ``_base_`` or a toolbox that is not installed (:func:`.config.check_toolboxes`) and each
``--cfg-options`` key checked, the work dir, ``--amp``, and the tools' one-line errors. The run
itself is :class:`~mmlinattn.training.runner.LinAttnRunner`'s."""
import os
import os.path as osp
import sys
from typing import Optional

import torch
from mmengine.config import Config

from .config import ConfigError, check_toolboxes, package_bases, read_config_file
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
    check_toolboxes(cfg, path)  # its toolbox installed, else the extra that installs it
    return cfg


def _foreign_package_base(path: str) -> Optional[str]:
    """For a ``_base_ = 'PACKAGE::...'`` entry (under ``path``, followed through local bases) that
    mmengine refuses (it loads only the OpenMMLab packages of its ``MODULE2PACKAGE``): the line to
    write instead (the file's path); ``None`` where there is none."""
    from mmengine.config.utils import MODULE2PACKAGE
    for current, base in package_bases(path):
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


def config_from_args(args) -> Config:
    """What every tool does first with its parsed ``args`` (``config``, ``cfg_options``,
    ``launcher``, ``work_dir``): the config with its overrides, its launcher and work dir, and
    :class:`~mmlinattn.training.runner.LinAttnRunner` as its Runner unless it names another (an
    upstream config run by our tools gets our run too). A bad ``MMLINATTN_*`` value
    (:mod:`mmlinattn.core.settings`) stops it first."""
    from mmlinattn.core import settings
    try:
        settings.check_all()
    except settings.SettingError as e:
        raise ConfigError(str(e)) from None
    cfg = load_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher
    set_work_dir(cfg, args.config, args.work_dir)
    cfg.setdefault('runner_type', 'LinAttnRunner')
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


def tool_error(tool: str, error: Exception) -> int:
    """Report a config or checkpoint problem as ``TOOL: error: ...`` on stderr; the exit code, 2."""
    print(f'{tool}: error: {error}', file=sys.stderr, flush=True)
    return 2
