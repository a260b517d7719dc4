"""``LinAttnRunner``: mmengine's Runner with what makes a run of our configs safe and clear.

Our ``_base_`` runtimes name it (``runner_type = 'LinAttnRunner'``), and every OpenMMLab tool builds
the Runner a config names (mmdet's, mmseg's and mmpretrain's ``tools/train.py`` and ``test.py``,
``mim train`` / ``mim test``, ours), so each of them gets the same run from one config:

* at construction (:meth:`LinAttnRunner.from_cfg`): bad ``MMLINATTN_*`` values, a work dir that
  cannot be written, the launcher's environment (and, without CUDA, a gloo process group with
  :class:`~mmlinattn.training.distributed.CPUDistributedDataParallel`), the safety hooks where a
  config's own ``custom_hooks`` list replaced ours (:func:`add_safety_hooks`);
* before a run reads its datasets (:meth:`~LinAttnRunner.train`, :meth:`~LinAttnRunner.val`,
  :meth:`~LinAttnRunner.test`): a training on a machine whose ``nvidia-smi`` lists a GPU that torch
  cannot see (:mod:`.gpu_guard`; ``allow_cpu=True`` to train there on the CPU), the work dir's run
  lock (training), the pre-flight over the
  loaders that run will read (:mod:`mmlinattn.training.preflight`: a training run's schedule
  included, a test's not), the ``--resume`` choice (the newest intact checkpoint of this work dir),
  the checkpoint read once and checked against the model (fit, trained-as attention, finite
  weights for a test) and handed to the load;
* during the run: a data file that does not decode is named (:mod:`.datafaults`), segmentation
  of large images without full-size logits (:mod:`mmlinattn.apis.large_image`), checkpoints that
  mmengine wrote without ``mmlinattn.upstream_fixes`` load on any torch.

A refusal prints one line, ``PROG: error: MESSAGE``, on stderr and raises :class:`RunRefused`, a
``SystemExit`` with code 2 (a training stopped by our hooks: the hook's code, 75 after SIGTERM,
130 after Ctrl-C); nothing of a refused run is left in the work dir. A Runner built from keyword
arguments instead of a config gets the hooks and the loading only.
"""
import copy
import os
import os.path as osp
import pickle
import sys
from contextlib import contextmanager
from typing import Optional

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, RUNNERS
from mmengine.runner import Runner

from mmlinattn.core.weights import CheckpointError, extract_state_dict, read_checkpoint
from mmlinattn.core.weights.reading import CheckpointContents

from .config import ConfigError
from .datafaults import DataFileError, naming_unreadable_files
from .fileio import CheckpointWriteError
from .hooks import TrainingStopped

__all__ = ['LinAttnRunner', 'RunChecksHook', 'RunRefused', 'add_safety_hooks',
           'check_finite_checkpoint', 'close_distributed', 'evaluation_checks', 'on_device']


class RunRefused(SystemExit):
    """A run that stopped with one line on stderr (``message``, also its ``str``); ``code``: the
    exit status. Raised as a subclass of the error it reports as well (:func:`refuse`), so that
    ``except ConfigError`` / ``except Preempted`` in a script or notebook catch it as before, while
    a command-line tool ends with the code and no traceback (an ``OSError``, such as a checkpoint
    that could not be written, is a plain ``RunRefused``)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(code)
        self.message = message

    def __str__(self):
        return self.message


_REFUSALS = {}


def _refusal_class(error_type: type) -> type:
    """``RunRefused`` that is also an ``error_type`` (one class per type); plain ``RunRefused``
    for a type whose instances cannot also be a ``SystemExit`` (``OSError``'s layout)."""
    if error_type not in _REFUSALS:
        try:
            _REFUSALS[error_type] = type(error_type.__name__, (RunRefused, error_type),
                                         {'__module__': error_type.__module__})
        except TypeError:
            _REFUSALS[error_type] = RunRefused
    return _REFUSALS[error_type]


#: the command's name in its messages, where a tool of ours sets it (``tools/train.py``)
PROG: Optional[str] = None


def _prog() -> str:
    """The command's name for its messages: :data:`PROG`, else the script as it was started
    (``tools/train.py`` from mmdet's root), its file name where it was started by an absolute
    path (``mim train``), else ``mmlinattn``."""
    if PROG:
        return PROG
    arg = sys.argv[0] if sys.argv and sys.argv[0] not in ('', '-c', '-m') else ''
    if not arg or not arg.endswith('.py'):
        return 'mmlinattn'
    return arg if not osp.isabs(arg) else osp.basename(arg)


def refuse(error: Exception, code: int = 2) -> RunRefused:
    """Print ``error`` as the run's one line; return the :class:`RunRefused` to raise (also an
    instance of ``type(error)``)."""
    message = str(error)
    print(f'{_prog()}: error: {message}', file=sys.stderr, flush=True)
    cls = _refusal_class(type(error)) if isinstance(error, Exception) else RunRefused
    refused = cls.__new__(cls)
    RunRefused.__init__(refused, message, code)
    return refused


def add_safety_hooks(cfg) -> None:
    """The hooks every run of a config of ours has, also where a config's own ``custom_hooks``
    list replaced the runtime's: :class:`~mmlinattn.training.hooks.NonFiniteLossHook` (off with
    ``check_non_finite=False``), :class:`~mmlinattn.training.hooks.PreemptionHook` (signals from
    ``preemption_signals``, default ``['SIGTERM', 'SIGUSR1']``; ``[]`` turns it off), and a plain
    ``CheckpointHook`` made :class:`~mmlinattn.training.safe_checkpoint.SafeCheckpointHook` with the
    same arguments. A hook of the same type the config sets is left as it sets it."""
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
    if cfg.get('compile') and 'PlainParamGroupsHook' not in have:
        # mmengine compiles train_step with the optimizer step: dynamo needs plain-dict groups
        hooks.append(dict(type='PlainParamGroupsHook'))
    cfg.custom_hooks = hooks


def _cpu_distributed(cfg) -> None:
    """A ``launcher`` other than none without CUDA: a gloo process group opened here (mmengine's
    own init is for GPUs) and the model wrapped by ``CPUDistributedDataParallel``."""
    from . import distributed
    launcher = cfg.get('launcher', 'none')
    if launcher == 'none' or torch.cuda.is_available():
        return
    dist_cfg = cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})
    dist_cfg['backend'] = 'gloo'
    distributed.init_cpu_process_group(launcher, float(dist_cfg.get('timeout', 1800)))
    distributed.use_cpu_ddp(cfg)


class FormattedOnce(Config):
    """A Runner's config that formats its text (``pretty_text``: yapf, about 1 s on 2 cores) once
    for each content: mmengine formats ``runner.cfg`` at each of the environment log, the
    visualizer's config, the config dump, the runtime info and every checkpoint's meta, five
    times or more per run. The text is that of mmengine's own Config for the same content."""

    @property
    def pretty_text(self) -> str:
        key = (repr(self._cfg_dict.to_dict()), self.__dict__.get('_format_python_code'))
        cached = self.__dict__.get('_formatted')
        if cached is None or cached[0] != key:
            cached = (key, Config.pretty_text.fget(self))
            object.__setattr__(self, '_formatted', cached)
        return cached[1]


def _free_instance_name(manager, name: str) -> str:
    """``name``, or ``name_1``, ``name_2``, ... : the first that no instance of ``manager`` (an
    mmengine ``ManagerMixin`` class: loggers, visualizers) in this process has. mmengine hands back
    an existing instance of the same name, with the earlier run's files and streams."""
    fresh, n = name, 1
    while manager.check_instance_created(fresh):
        fresh, n = f'{name}_{n}', n + 1
    return fresh


def _fresh_visualizer_name(cfg) -> None:
    """A second run in one process (a notebook, a script that trains then tests, a test suite)
    gets a visualizer of its own: mmengine hands back an existing visualizer of the same name, with
    the earlier run's save_dir. A fresh process keeps the config's name."""
    from mmengine.visualization import Visualizer
    vis = cfg.get('visualizer')
    if isinstance(vis, dict):
        vis['name'] = _free_instance_name(Visualizer, vis.get('name', 'visualizer'))


@RUNNERS.register_module()
class LinAttnRunner(Runner):
    """mmengine's ``Runner`` with our checks, stops, saves and locks (the module's docstring)."""

    @classmethod
    def check_config(cls, cfg):
        """The checks of ``cfg`` that hold for any run, before the Runner is built: our
        ``MMLINATTN_*`` settings, a writable work dir, the launcher's environment, the backbone's
        arguments and the neck's / heads' channels (the model built on the ``meta`` device).
        Raises what it finds (:class:`ConfigError`, ``ValueError``); returns the backbone built on
        ``meta`` (:class:`~mmlinattn.training.preflight.MetaBackbone`, None without a model), for
        the run's pre-flight."""
        from mmlinattn.core import settings

        from . import distributed
        from .runs import check_work_dir
        try:
            settings.check_all()
        except settings.SettingError as e:
            raise ConfigError(str(e)) from None
        check_work_dir(cfg['work_dir'])
        if cfg.get('launcher', 'none') != 'none':
            distributed.check_launcher_env(cfg.launcher)
        if cfg.get('model') is None:
            return None
        from .preflight import MetaBackbone, check_model_channels
        backbone = MetaBackbone(cfg)
        check_model_channels(cfg, backbone)
        return backbone

    @classmethod
    def from_cfg(cls, cfg) -> 'LinAttnRunner':
        cfg = copy.deepcopy(cfg)
        if type(cfg) is Config:
            object.__setattr__(cfg, '__class__', FormattedOnce)  # Config routes setattr to its dict
        try:
            backbone = cls.check_config(cfg)
            _cpu_distributed(cfg)
        except ValueError as e:  # ConfigError included
            raise refuse(e) from None
        add_safety_hooks(cfg)
        _fresh_visualizer_name(cfg)
        existed = osp.isdir(cfg['work_dir'])
        runner = super().from_cfg(cfg)
        runner._made_work_dir, runner._meta_backbone = not existed, backbone
        return runner

    def __init__(self, *args, **kwargs):
        self._dump_pending = False  # the config to dump once a run passed its checks
        self._made_work_dir = False
        self._contents: Optional[CheckpointContents] = None
        self._lock = None
        self._meta_backbone = None  # the config's backbone on meta, from from_cfg's checks
        super().__init__(*args, **kwargs)
        from mmengine.model import is_model_wrapper
        model = self.model.module if is_model_wrapper(self.model) else self.model
        if self.cfg.get('default_scope') == 'mmseg' and hasattr(model, 'decode_head'):
            from mmlinattn.apis.large_image import lean_postprocess
            lean_postprocess(model)  # a segmentor (a TTA wrapper needs the logits)

    # ---- what mmengine calls, changed --------------------------------------------------------

    def setup_env(self, env_cfg) -> None:
        super().setup_env(env_cfg)
        # a run started in the same second into the same work dir shares the log folder: a
        # refusal of this run must not remove it
        self._log_dir_existed = osp.isdir(osp.join(self.work_dir, self.timestamp))

    def build_logger(self, log_level='INFO', log_file=None, **kwargs):
        """mmengine's, under a name no logger of this process has: mmengine names it after the
        config and the second the run started, and hands back an existing logger of that name, so
        a second run of the same config started in the same second (a notebook, a script that
        trains then tests) logged into the first run's log file and streams."""
        from mmengine.logging import MMLogger
        name = _free_instance_name(MMLogger, kwargs.pop('name', None) or self._experiment_name)
        return super().build_logger(log_level=log_level, log_file=log_file, name=name, **kwargs)

    def dump_config(self) -> None:
        """Deferred until a run has passed its checks (a refused run leaves no config dump); what
        is dumped is the config as given, before the checks chose ``load_from``."""
        self._dump_pending = copy.deepcopy(self.cfg)

    @staticmethod
    def build_dataloader(dataloader, seed=None, diff_rank_seed=False):
        """mmengine's, with datasets that name a file they cannot decode (:mod:`.datafaults`)."""
        return naming_unreadable_files(Runner.build_dataloader)(
            dataloader, seed=seed, diff_rank_seed=diff_rank_seed)

    def load_checkpoint(self, filename, map_location='cpu', strict=False,
                        revise_keys=[(r'^module.', '')]):  # noqa: B006 - mmengine's signature
        """mmengine's load (``load_from``, ``--resume``, a test's checkpoint), which takes the file
        as the checks before the run read it (not read twice: the tensors moved to
        ``map_location`` where that is a device), and also reads a checkpoint mmengine wrote
        without ``mmlinattn.upstream_fixes`` (torch >= 2.6 refuses its ``HistoryBuffer``s
        weights-only)."""
        from mmengine.model import is_model_wrapper
        from mmengine.runner.checkpoint import _load_checkpoint_to_model
        handed, self._contents = self._contents, None
        checkpoint = None
        if handed is not None and handed.obj is not None and handed.matches(filename):
            obj, handed.obj = handed.obj, None
            checkpoint = on_device(obj, map_location)
            self.logger.info(f'{filename}: ' + (
                'the contents read before the run, not read again' if checkpoint is not None else
                f'read again for map_location={map_location!r}'))
        if checkpoint is None:
            try:
                return super().load_checkpoint(filename, map_location=map_location, strict=strict,
                                               revise_keys=revise_keys)
            except pickle.UnpicklingError as err:
                if not osp.isfile(filename):  # open-mmlab://, s3://...: mmengine's own error
                    raise
                from mmlinattn.core.weights import load_runner_checkpoint
                checkpoint = load_runner_checkpoint(filename, map_location=map_location)
                self.logger.info(f'{filename}: torch refused to load it weights-only '
                                 f'({str(err).strip().splitlines()[-1][:120]}); read with '
                                 "mmlinattn's Runner-checkpoint reader")
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = self.model.module if is_model_wrapper(self.model) else self.model
        checkpoint = _load_checkpoint_to_model(model, checkpoint, strict, revise_keys=revise_keys)
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        return checkpoint

    # ---- the runs ------------------------------------------------------------------------------

    def train(self):
        with self._checks():
            self.check('train')
        try:
            return self._running(super().train)
        finally:
            self.release()

    def val(self):
        with self._checks():
            self.check('val')
        return self._running(super().val)

    def test(self):
        with self._checks():
            self.check('test')
        return self._running(super().test)

    def check(self, run: str) -> None:
        """The checks before ``run`` ('train', 'val' or 'test') reads any data, raising what they
        find (:class:`ConfigError`, :class:`CheckpointError`); :meth:`train` and the others turn
        that into one line. A training's checks take the work dir's lock (:meth:`release`)."""
        if self.cfg.get('model') is None:  # a Runner built from objects: nothing to check
            return
        if run == 'train':
            self._before_train()
        else:
            evaluation_checks(self, f'{run}_dataloader')

    def release(self) -> None:
        """Give the work dir's run lock back (a training's; at its end, or after its checks)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @contextmanager
    def _checks(self):
        """The checks before a run: a refusal is one line and leaves nothing in the work dir. In a
        distributed run every rank checks, and a refusal on one rank (the work dir's lock, which
        rank 0 alone takes) stops them all (the others exit with the same code, no second line)."""
        refused = None
        try:
            yield
        except (RunRefused, ConfigError, CheckpointError, DataFileError) as e:
            refused = e
        except BaseException:  # anything else (Ctrl-C, a bug): no lock or log folder left either
            self._clean_up()
            raise
        code = _any_rank_code(None if refused is None else
                              refused.code if isinstance(refused, RunRefused) else 2)
        if code is not None:
            self._clean_up()
            if isinstance(refused, RunRefused):
                raise refused
            if refused is not None:
                raise refuse(refused) from None
            raise RunRefused(f'rank {self.rank}: another rank refused the run', code)
        if self._dump_pending is not False:
            given, self._dump_pending = self._dump_pending, False
            name = osp.basename(given.filename) if given.filename else f'{self.timestamp}.py'
            given.dump(osp.join(self.work_dir, name))

    def _running(self, run):
        """``run()``, its data-file and checkpoint errors and our hooks' stops as one line."""
        try:
            return run()
        except (DataFileError, CheckpointError) as e:
            # this rank's alone (the others wait in a collective): no barrier; the launcher
            # (torchrun, srun) ends the others when this process exits
            raise refuse(e) from None
        except (TrainingStopped, CheckpointWriteError) as e:
            if isinstance(e, TrainingStopped):  # raised on every rank at the same iteration
                close_distributed()
            raise refuse(e, e.exit_code) from None

    def _clean_up(self) -> None:
        """Remove what this runner's construction wrote: its timestamped log folder, and the work
        dir if the construction made it and nothing else is in it."""
        self.release()
        _remove_log_dir(self)
        if self._made_work_dir:
            try:
                os.rmdir(self.work_dir)
            except OSError:
                pass

    def _before_train(self) -> None:
        from .gpu_guard import check_gpu_visible_to_torch
        from .preflight import preflight
        from .preflight.checkpoints import prepare_checkpoints
        from .preflight.compile import check_compile
        from .workdir_lock import lock_work_dir
        cfg = self.cfg
        try:  # nvidia-smi lists a GPU torch cannot see: no silent CPU training
            check_gpu_visible_to_torch(cfg)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self._lock = lock_work_dir(self.work_dir, self.logger)
        compile_warning = check_compile(cfg)
        if compile_warning:
            self.logger.warning(compile_warning)
        checked = preflight(cfg, ('train_dataloader',) + (
            ('val_dataloader',) if cfg.get('val_dataloader') and cfg.get('val_cfg') else ()),
            backbone=self._meta_backbone)
        contents = None
        cfg.load_from = self._load_from
        if self._resume and self._load_from is None:
            from .resume import latest_intact_contents
            contents = latest_intact_contents(self.work_dir, self.logger)
            if contents is None:
                self._resume = False  # nothing to resume from: a fresh start
            cfg.load_from = contents.path if contents is not None else None
        if self._resume and cfg.load_from:
            if contents is None:
                from mmlinattn.core.weights import local_checkpoint
                from mmlinattn.core.weights.reading import read_contents
                cfg.load_from = local_checkpoint(cfg.load_from, logger=self.logger)  # a URL
                contents = read_contents(cfg.load_from)
            self._something_left(contents)
        contents = prepare_checkpoints(cfg, resume=self._resume, contents=contents,
                                       backbone=checked.backbone, logger=self.logger)
        self._load_from = cfg.load_from
        check_fit(self, contents, 'resume checkpoint' if self._resume else 'load_from',
                  partial=bool(cfg.get('partial_load')) and not self._resume)
        self._log_auto_scale_lr()

    def _something_left(self, contents: CheckpointContents) -> None:
        """A resumed checkpoint at the end of ``train_cfg``'s schedule: one line, exit 0 (mmengine
        would build everything and train nothing)."""
        meta = contents.obj.get('meta') if isinstance(contents.obj, dict) else None
        train_cfg = self.cfg.get('train_cfg') or {}
        if not isinstance(meta, dict):
            return
        for unit, key in (('epoch', 'max_epochs'), ('iter', 'max_iters')):
            done, total = meta.get(unit), train_cfg.get(key)
            if isinstance(done, int) and isinstance(total, int) and done >= total:
                message = (f'{contents.path} is at {unit} {done} of train_cfg.{key}={total}: '
                           f'nothing left to train (raise it with --cfg-options '
                           f'train_cfg.{key}=N to train on)')
                print(f'{_prog()}: {message}', flush=True)
                raise RunRefused(message, 0)

    def _log_auto_scale_lr(self) -> None:
        """The base batch, the actual batch and the lr(s) the run will train with."""
        cfg = self.cfg
        asl = cfg.get('auto_scale_lr') or {}
        if not asl.get('enable') or 'base_batch_size' not in asl or \
                not cfg.get('train_dataloader'):
            return
        batch = cfg.train_dataloader.get('batch_size', 1)
        real, base = self.world_size * batch, asl['base_batch_size']
        ow = cfg.get('optim_wrapper') or {}
        opts = {'': ow['optimizer']} if 'optimizer' in ow else \
            {f'{k}.': v['optimizer'] for k, v in ow.items()
             if isinstance(v, dict) and 'optimizer' in v}
        lrs = ', '.join(f'{k}lr {o["lr"]:g} -> {o["lr"] * real / base:g}'
                        for k, o in opts.items() if 'lr' in o)
        self.logger.info(f'auto_scale_lr: base batch {base}, actual batch {real} '
                         f'({self.world_size} process(es) x {batch}): {lrs}')


def evaluation_checks(runner, loader: str) -> None:
    """The checks before a test or validation of ``runner`` (a Runner: ours, or mmengine's where a
    tool built it, through :class:`RunChecksHook`) reads ``loader``: the checkpoint given exists,
    the pre-flight (no training schedule), the checkpoint's weights finite and fitting."""
    from mmlinattn.core.weights import local_checkpoint
    from mmlinattn.core.weights.reading import read_contents

    from .preflight import preflight
    cfg = runner.cfg
    loaders = (loader,)
    # mmseg's SegVisualizationHook draws with step=runner.iter, which builds the training loop
    # and with it train_dataloader: a drawing test reads the training set's folders too
    vis = (cfg.get('default_hooks') or {}).get('visualization') or {}
    if cfg.get('default_scope') == 'mmseg' and vis.get('draw') and \
            cfg.get('train_dataloader'):
        loaders += ('train_dataloader',)
    if runner._has_loaded:  # train() then test() on one runner: the trained weights are tested
        runner._load_from = None
    if runner._load_from:  # a missing checkpoint first: the one thing a test must be given
        runner._load_from = local_checkpoint(runner._load_from, logger=runner.logger)
        if '://' not in runner._load_from and not osp.isfile(runner._load_from):
            raise ConfigError(f'checkpoint file not found: {runner._load_from}')
    try:
        preflight(cfg, loaders, backbone=getattr(runner, '_meta_backbone', None), training=False)
    except ConfigError as e:
        if 'train_dataloader' in loaders and 'train_dataloader' in str(e):
            raise ConfigError(f"{e} (drawing: mmseg's SegVisualizationHook builds the "
                              'training loop, which builds train_dataloader; point it at '
                              'existing folders with --cfg-options)') from None
        raise
    if not runner._load_from or '://' in runner._load_from:  # s3://, open-mmlab://: mmengine's
        return
    contents = read_contents(runner._load_from)
    check_finite_checkpoint(runner._load_from, contents.obj)  # a diverged run's weights
    check_fit(runner, contents, 'checkpoint')


def check_fit(runner, contents: Optional[CheckpointContents], what: str,
              partial: bool = False) -> None:
    """The whole-model checkpoint the run loads checked against the model (keys, shapes, the
    attention it was trained as); its contents handed to :meth:`load_checkpoint`."""
    from mmlinattn.core.weights import check_model_checkpoint

    from .preflight.backbone import model_cfg
    if not runner._load_from or contents is None:
        return
    check_model_checkpoint(runner.model, runner._load_from, logger=runner.logger, obj=contents.obj,
                           backbone_cfg=(model_cfg(runner.cfg) or {}).get('backbone'),
                           allow_attention_change=bool(runner.cfg.get('allow_attention_change')),
                           what=what, partial=partial)
    if contents.runner_readable and isinstance(runner, LinAttnRunner) and \
            type(runner).load_checkpoint is LinAttnRunner.load_checkpoint:
        runner._contents = contents
    else:
        contents.obj = None


@HOOKS.register_module()
class RunChecksHook(Hook):
    """:class:`LinAttnRunner`'s checks before a test or a validation, where a tool built
    mmengine's plain ``Runner`` although the config names ours (mmseg 1.2.2's ``tools/test.py``
    builds ``Runner.from_cfg`` whatever ``runner_type`` says). At ``before_run``, so after the
    datasets were built (a missing data folder is the dataset's own error there) and before the
    weights are loaded: the checkpoint's checks and the rest of the pre-flight
    (:func:`evaluation_checks`), a refusal as one line and no log folder left. Our runtimes list
    it; under :class:`LinAttnRunner`, which checked before any data was read, it does nothing."""

    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        from mmengine.runner import BaseLoop
        if isinstance(runner, LinAttnRunner) or runner.cfg.get('model') is None:
            return
        built = [run for run in ('train', 'val', 'test')
                 if isinstance(getattr(runner, f'_{run}_loop', None), BaseLoop)]
        if not built or built[0] == 'train':  # a training: our Runner's (runner_type)
            return
        try:
            evaluation_checks(runner, f'{built[0]}_dataloader')
        except (ConfigError, CheckpointError) as e:
            _remove_log_dir(runner)
            raise refuse(e) from None


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
    if getattr(runner, '_log_dir_existed', False):  # another run's, started in the same second
        return
    # this run's visualizer writes into the folder: mmengine hands an existing instance of that name
    # to the next Runner of the process (a notebook, a test), which would write into a folder that
    # is gone; forget it, as if this run had not been built
    vis = getattr(runner, 'visualizer', None)
    instances = getattr(type(vis), '_instance_dict', None)
    if vis is not None and isinstance(instances, dict):
        instances.pop(getattr(vis, 'instance_name', None), None)
    shutil.rmtree(log_dir, ignore_errors=True)


def check_finite_checkpoint(path: str, obj: Optional[dict] = None) -> None:
    """Refuse a checkpoint whose weights hold NaN/inf (a run that diverged): a
    :class:`CheckpointError` naming the file, how many tensors and the first of them. ``obj``: the
    file's contents where the caller has read them already (else it is read here)."""
    from .hooks import non_finite_tensors
    state = extract_state_dict(read_checkpoint(path) if obj is None else obj, path=path)
    names, n, total = non_finite_tensors(state)
    if n:
        raise CheckpointError(
            f'checkpoint {path}: {n} of {total} tensors hold NaN/inf ({", ".join(names)}'
            f'{", ..." if n > len(names) else ""}) - the run diverged before it was saved; '
            'evaluate an earlier checkpoint')


def _any_rank_code(code: Optional[int]) -> Optional[int]:
    """A refusal's exit code on any rank of a distributed run: this rank's ``code`` (None where
    it passed) against the others' (the highest); None where no rank refused."""
    from .hooks import rank_max
    (flag,) = rank_max([0 if code is None else code + 1])  # code 0 counts
    return flag - 1 if flag > 0 else None


def close_distributed() -> None:
    """End a distributed run cleanly: wait for every rank, then destroy the process group (a gloo
    group left to the interpreter's exit can abort the process after its work is done)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
