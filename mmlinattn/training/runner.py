"""``LinAttnRunner``: mmengine's Runner with what makes a run of our configs safe and clear.

Our ``_base_`` runtimes name it (``runner_type = 'LinAttnRunner'``), and every OpenMMLab tool builds
the Runner a config names (mmdet's, mmseg's and mmpretrain's ``tools/train.py`` and ``test.py``,
``mim train`` / ``mim test``, ours), so each of them gets the same run from one config:

* at construction (:meth:`LinAttnRunner.from_cfg`): bad ``MMLINATTN_*`` values, a work dir that
  cannot be written, the launcher's environment (and, without CUDA, a gloo process group with
  :class:`~mmlinattn.training.distributed.CPUDistributedDataParallel`), a safety hook that a
  config's own ``custom_hooks`` list dropped put back (:func:`add_safety_hooks`, one log line);
* before a run reads its datasets (mmengine's ``build_train_loop`` / ``build_val_loop`` /
  ``build_test_loop``, which ``train()`` / ``val()`` / ``test()`` call first): a training on a
  machine whose ``nvidia-smi`` lists a GPU that torch cannot see (:mod:`.gpu_guard`;
  ``allow_cpu=True`` to train there on the CPU), the work dir's run lock (training), the pre-flight
  over the loaders that run will read (:mod:`mmlinattn.training.preflight`: a training run's
  schedule included, a test's not), the ``--resume`` choice (the newest intact checkpoint of this
  work dir), the checkpoint checked against the model (fit, trained-as attention, finite weights
  for a test);
* during the run, the hooks the runtimes list (:mod:`.hooks`: a non-finite loss stops, SIGTERM /
  Ctrl-C save and stop; :class:`RunChecksHook` where a tool built mmengine's own Runner), and a data
  file that does not decode is named (:mod:`.datafaults`). What holds under any Runner and any hook
  list is in the model: the backbone refuses weights recorded as another attention function.

A refusal prints one line, ``PROG: error: MESSAGE``, on stderr and raises :class:`RunRefused`, a
``SystemExit`` with code 2 (a training stopped by our hooks: the hook's code, 75 after SIGTERM,
130 after Ctrl-C). A refused run leaves mmengine's log folder, its log saying why, and no
checkpoint, no ``last_checkpoint``, no config dump, nothing of the work dir's earlier contents
changed. A Runner built from keyword arguments instead of a config gets the hooks only.
"""
import copy
import os.path as osp
import sys
from typing import List, Optional

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, RUNNERS
from mmengine.runner import Runner

from mmlinattn.core.weights import CheckpointError, extract_state_dict, read_checkpoint
from mmlinattn.core.weights.reading import CheckpointContents

from .config import ConfigError, check_toolboxes
from .datafaults import DataFileError, naming_unreadable_files
from .refusal import RunRefused, _prog, close_distributed, refuse

__all__ = ['LinAttnRunner', 'RunChecksHook', 'RunRefused', 'add_safety_hooks',
           'check_finite_checkpoint', 'close_distributed', 'evaluation_checks', 'refuse']


#: the hooks our runtimes list in ``custom_hooks``, with the arguments they list them with
SAFETY_HOOKS = (dict(type='NonFiniteLossHook'),
                dict(type='PreemptionHook', signals=['SIGTERM', 'SIGUSR1']),
                dict(type='RunChecksHook'))


def add_safety_hooks(cfg) -> List[str]:
    """Put back into ``cfg.custom_hooks`` each of :data:`SAFETY_HOOKS` that a config's own list
    dropped (a child config that writes ``custom_hooks = [...]`` replaces the runtime's list); a
    hook the list names is left as it is set (``NonFiniteLossHook(interval=0)``,
    ``PreemptionHook(signals=[], ctrl_c=False)``: off). With ``compile``, also
    :class:`~mmlinattn.training.hooks.PlainParamGroupsHook`. Returns the types added."""
    hooks = list(cfg.get('custom_hooks') or [])
    # a type is a registry name ('NonFiniteLossHook', 'mmlinattn.NonFiniteLossHook') or the
    # class itself (a pure-Python config)
    have = {getattr(t, '__name__', None) or str(t).split('.')[-1]
            for t in (h.get('type') for h in hooks if isinstance(h, dict))}
    have |= {type(h).__name__ for h in hooks if not isinstance(h, dict)}  # hook objects
    wanted = list(SAFETY_HOOKS)
    if cfg.get('compile'):
        # mmengine compiles train_step with the optimizer step: dynamo needs plain-dict groups
        wanted.append(dict(type='PlainParamGroupsHook'))
    added = [copy.deepcopy(h) for h in wanted if h['type'] not in have]
    cfg.custom_hooks = hooks + added
    return [h['type'] for h in added]


def check_training_parts(cfg) -> None:
    """``train_dataloader``, ``train_cfg`` and ``optim_wrapper``: all three set, or all three None
    (a test-only config); mmengine's constructor refuses anything else with a ``ValueError``
    traceback (``--cfg-options train_dataloader=None`` on a training config)."""
    keys = ('train_dataloader', 'train_cfg', 'optim_wrapper')
    unset = [k for k in keys if cfg.get(k) is None]
    if unset and len(unset) < len(keys):
        raise ConfigError(
            f'{", ".join(f"{k}=None" for k in unset)} but '
            f'{", ".join(k for k in keys if k not in unset)} set: a training needs all three, a '
            'config that only tests sets all three to None')


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


class _CurrentStream:
    """``sys.stdout`` / ``sys.stderr`` as they are at each write, for a log handler: a run that
    ended leaves no handler on the stream object it started with (a notebook cell's, a test's
    capture), which may be closed when a later line of the same logger comes."""

    def __init__(self, name: str):
        self.name = name

    def write(self, text):
        return getattr(sys, self.name).write(text)

    def flush(self):
        getattr(sys, self.name).flush()

    def isatty(self):
        return bool(getattr(getattr(sys, self.name), 'isatty', lambda: False)())


def follow_current_streams(logger) -> None:
    """Point ``logger``'s console handlers (those on the process's stdout / stderr) at
    :class:`_CurrentStream` instead of the stream object they were made with."""
    import logging
    for h in logger.handlers:
        if type(h) is logging.StreamHandler:
            for name in ('stdout', 'stderr'):
                if h.stream is getattr(sys, name) or h.stream is getattr(sys, f'__{name}__'):
                    h.setStream(_CurrentStream(name))


def _built(loop) -> bool:
    from mmengine.runner import BaseLoop
    return isinstance(loop, BaseLoop)


@RUNNERS.register_module()
class LinAttnRunner(Runner):
    """mmengine's ``Runner`` with the checks a run of ours makes before it reads any data, at
    mmengine's own seams: the training's checks and the work dir's lock in
    :meth:`build_train_loop`, an evaluation's in :meth:`build_val_loop` / :meth:`build_test_loop`
    (mmengine's ``train()`` / ``val()`` / ``test()`` build their loop, and the loop its dataloader,
    before anything else). The stops and saves are hooks the runtimes list (:func:`add_safety_hooks`
    puts back one a child config's ``custom_hooks`` dropped); mmengine loads the checkpoints.

    Members of mmengine's ``Runner`` overridden, each because no seam exists for it:

    * :meth:`from_cfg` - the config is checked and its hook list completed before mmengine's
      constructor reads it (a refusal there builds nothing);
    * :meth:`build_logger` - mmengine hands back an existing logger of the same name (a second run
      of one config started in the same second of one process logged into the first run's files);
    * :meth:`dump_config` - mmengine dumps at construction; a refused run must not replace the work
      dir's earlier dump, so it is written once the checks passed;
    * :meth:`build_dataloader` - the loops build their dataloaders through it: the datasets name a
      file they cannot decode (:mod:`.datafaults`);
    * :meth:`load_or_resume` - ``--resume`` continues from the checkpoint the checks chose (the
      newest intact one), and a checkpoint the model refuses is one line;
    * :meth:`build_train_loop`, :meth:`build_val_loop`, :meth:`build_test_loop` - the seams above.
    """

    _dump_pending = False  # the config to dump once a run passed its checks
    _lock = None  # the work dir's run lock, held by a training
    _meta_backbone = None  # the config's backbone on meta, from from_cfg's checks
    _chosen = None  # (path, resume) the training's checks chose to load, or None
    _fit_checked = None  # the checkpoint the checks compared with the model
    _training = _evaluating = False  # which run built its loop first

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
        check_toolboxes(cfg, getattr(cfg, 'filename', None) or 'the config')  # before MODELS
        check_work_dir(cfg['work_dir'])
        check_training_parts(cfg)
        for key, hook in (('check_non_finite', "dict(type='NonFiniteLossHook', interval=0)"),
                          ('preemption_signals', "dict(type='PreemptionHook', signals=[...], "
                                                 'ctrl_c=True)')):
            if key in cfg:  # read by 0.3.0's Runner; nothing reads it now
                raise ConfigError(f'{key}={cfg[key]!r}: removed in 0.4.0, the runtimes list the '
                                  f'hooks in custom_hooks; write {hook} there instead')
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
        try:
            backbone = cls.check_config(cfg)
            _cpu_distributed(cfg)
        except ValueError as e:  # ConfigError included
            raise refuse(e) from None
        added = add_safety_hooks(cfg)
        _fresh_visualizer_name(cfg)
        runner = super().from_cfg(cfg)
        runner._meta_backbone = backbone
        if added:
            runner.logger.info(f'custom_hooks lacks {", ".join(added)} (a config\'s own list '
                               'replaced the runtime\'s): added with its defaults')
        return runner

    def build_logger(self, log_level='INFO', log_file=None, **kwargs):
        """mmengine's, under a name no logger of this process has (see the class docstring), whose
        console lines go to the process's ``sys.stdout`` as it is when they are written."""
        from mmengine.logging import MMLogger
        name = _free_instance_name(MMLogger, kwargs.pop('name', None) or self.experiment_name)
        logger = super().build_logger(log_level=log_level, log_file=log_file, name=name, **kwargs)
        follow_current_streams(logger)
        return logger

    def dump_config(self) -> None:
        """Deferred until a run has passed its checks (a refused run leaves no config dump)."""
        self._dump_pending = copy.deepcopy(self.cfg)

    @staticmethod
    def build_dataloader(dataloader, seed=None, diff_rank_seed=False):
        """mmengine's, with datasets that name a file they cannot decode (:mod:`.datafaults`)."""
        return naming_unreadable_files(Runner.build_dataloader)(
            dataloader, seed=seed, diff_rank_seed=diff_rank_seed)

    # ---- the seams before a run reads data ---------------------------------------------------

    def build_train_loop(self, loop):
        # an evaluation that builds the training loop (mmseg's SegVisualizationHook reads
        # runner.iter) is no training: its own checks ran (so test() then train() on one Runner
        # object trains without the training's checks: build a new Runner for a training)
        if not _built(loop) and not self._evaluating:
            self._training = True
            self.check('train')
        return super().build_train_loop(loop)

    def build_val_loop(self, loop):
        if loop is not None and not _built(loop) and not self._training:
            self._evaluating = True  # a validation of its own, not the training's
            self.check('val')
        return super().build_val_loop(loop)

    def build_test_loop(self, loop):
        if loop is not None and not _built(loop):
            self._evaluating = True
            self.check('test')
        return super().build_test_loop(loop)

    def load_or_resume(self) -> None:
        """The checkpoint the checks chose (``--resume``: the newest intact one of the work dir),
        loaded by mmengine's ``resume`` / ``load_checkpoint``; a checkpoint the model refuses (the
        attention function it was trained as) is one line."""
        # mmengine's own flag: a load the caller made (runner.load_checkpoint) stands
        if self._has_loaded or self.cfg.get('model') is None:
            return super().load_or_resume()
        path, resume = self._chosen if self._chosen is not None else \
            (self.cfg.get('load_from'), False)
        self._chosen = None
        if not path:
            return None
        checked = self._fit_checked == path
        backbones = [m for m in self.model.modules() if hasattr(m, 'trained_as_checked')]
        for m in backbones:  # compared by the checks with the config's keys: not said twice
            m.trained_as_checked = checked
        try:
            if resume:
                self.resume(path)
            else:
                self.load_checkpoint(path)
        except CheckpointError as e:
            raise refuse(e) from None
        finally:
            for m in backbones:
                m.trained_as_checked = False
        return None

    def check(self, run: str) -> None:
        """The checks before ``run`` ('train', 'val' or 'test') reads any data; a refusal is one
        line (:func:`refuse`). In a distributed run every rank checks, and a refusal on one rank
        (the work dir's lock, which rank 0 alone takes) stops them all (the others exit with the
        same code, no second line). A training's checks take the work dir's lock
        (:meth:`release`). Once they pass, the config is dumped."""
        refused = None
        try:
            if self.cfg.get('model') is not None:  # a Runner built from objects: nothing
                if run == 'train':
                    self._check_training()
                else:
                    evaluation_checks(self, f'{run}_dataloader')
        except (RunRefused, ConfigError, CheckpointError, DataFileError) as e:
            refused = e
        except BaseException:  # anything else (Ctrl-C, a bug): the lock goes back too
            self.release()
            raise
        code = _any_rank_code(None if refused is None else
                              refused.code if isinstance(refused, RunRefused) else 2)
        if code is not None:
            self.release()
            if isinstance(refused, RunRefused):
                raise refused
            if refused is not None:
                raise refuse(refused) from None
            raise RunRefused(f'rank {self.rank}: another rank refused the run', code)
        if self._dump_pending is not False:
            given, self._dump_pending = self._dump_pending, False
            name = osp.basename(given.filename) if given.filename else f'{self.timestamp}.py'
            given.dump(osp.join(self.work_dir, name))

    def release(self) -> None:
        """Give the work dir's run lock back (a training's; at its end, or after its checks)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _check_training(self) -> None:
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
        resume = bool(cfg.get('resume'))
        if resume and not cfg.get('load_from'):
            from .resume import latest_intact_contents
            contents = latest_intact_contents(self.work_dir, self.logger)
            resume = contents is not None  # nothing to resume from: a fresh start
            cfg.load_from = contents.path if contents is not None else None
        if resume and cfg.load_from:
            if contents is None:
                from mmlinattn.core.weights import local_checkpoint
                from mmlinattn.core.weights.reading import read_contents
                cfg.load_from = local_checkpoint(cfg.load_from, logger=self.logger)  # a URL
                contents = read_contents(cfg.load_from)
            self._something_left(contents)
        contents = prepare_checkpoints(cfg, resume=resume, contents=contents,
                                       backbone=checked.backbone, logger=self.logger)
        self._chosen = (cfg.load_from, resume)
        check_fit(self, contents, 'resume checkpoint' if resume else 'load_from',
                  partial=bool(cfg.get('partial_load')) and not resume)

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
    # train() then test() on one runner: the trained weights are tested (mmengine's flag)
    path = None if runner._has_loaded else cfg.get('load_from')
    if path:  # a missing checkpoint first: the one thing a test must be given
        path = local_checkpoint(path, logger=runner.logger)  # a URL: the cached file, which
        if isinstance(runner, LinAttnRunner):  # our load_or_resume loads then (not again)
            cfg.load_from = path
        if '://' not in path and not osp.isfile(path):
            raise ConfigError(f'checkpoint file not found: {path}')
    try:
        preflight(cfg, loaders, backbone=getattr(runner, '_meta_backbone', None), training=False)
    except ConfigError as e:
        if 'train_dataloader' in loaders and 'train_dataloader' in str(e):
            raise ConfigError(f"{e} (drawing: mmseg's SegVisualizationHook builds the "
                              'training loop, which builds train_dataloader; point it at '
                              'existing folders with --cfg-options)') from None
        raise
    if not path or '://' in path:  # s3://, open-mmlab://: mmengine's
        return
    contents = read_contents(path)
    check_finite_checkpoint(path, contents.obj)  # a diverged run's weights
    check_fit(runner, contents, 'checkpoint', path=path)


def check_fit(runner, contents: Optional[CheckpointContents], what: str, partial: bool = False,
              path: Optional[str] = None) -> None:
    """The whole-model checkpoint the run loads (``path``, default the config's ``load_from``)
    checked against the model (keys, shapes, the attention it was trained as)."""
    from mmengine.model import is_model_wrapper

    from mmlinattn.core.weights import check_model_checkpoint

    from .preflight.backbone import model_cfg
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    if runner.cfg.get('allow_attention_change'):  # the backbone's own check at the load, too
        for m in model.modules():
            if hasattr(m, 'allow_attention_change'):
                m.allow_attention_change = True
    path = path or runner.cfg.get('load_from')
    if not path or contents is None:
        return
    check_model_checkpoint(model, path, logger=runner.logger, obj=contents.obj,
                           backbone_cfg=(model_cfg(runner.cfg) or {}).get('backbone'),
                           allow_attention_change=bool(runner.cfg.get('allow_attention_change')),
                           what=what, partial=partial)
    if isinstance(runner, LinAttnRunner):  # its load_or_resume: the backbones' check not again
        runner._fit_checked = path


@HOOKS.register_module()
class RunChecksHook(Hook):
    """What a checkpoint records of the model it was saved from (:meth:`before_save_checkpoint`),
    and :class:`LinAttnRunner`'s checks before a test or a validation, where a tool built
    mmengine's plain ``Runner`` although the config names ours (mmseg 1.2.2's ``tools/test.py``
    builds ``Runner.from_cfg`` whatever ``runner_type`` says). At ``before_run``, so after the
    datasets were built (a missing data folder is the dataset's own error there) and before the
    weights are loaded: the checkpoint's checks and the rest of the pre-flight
    (:func:`evaluation_checks`), a refusal as one line; and one log line naming what a plain
    Runner leaves off. Our runtimes list it; under :class:`LinAttnRunner`, which checked before
    any data was read, it does nothing."""

    priority = 'VERY_HIGH'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Under any Runner: the checkpoint's state dict records what each attention module of
        our backbones computes, which the backbone checks when the file is loaded into it (any
        Runner, any hook list: the trained-as check that no config can drop)."""
        from mmengine.model import is_model_wrapper

        from mmlinattn.core.models.backbones.base import record_trained_as
        state = checkpoint.get('state_dict')
        if isinstance(state, dict):
            model = runner.model.module if is_model_wrapper(runner.model) else runner.model
            record_trained_as(model, state)

    def after_train(self, runner) -> None:
        if isinstance(runner, LinAttnRunner):  # the training's work-dir lock goes back
            runner.release()

    def before_run(self, runner) -> None:
        from mmengine.model import BaseTTAModel
        if isinstance(runner.model, BaseTTAModel) and hasattr(runner.model.module, 'lean'):
            runner.model.module.lean = False  # the TTA merge reads each view's full-size logits
        if isinstance(runner, LinAttnRunner) or runner.cfg.get('model') is None:
            return
        follow_current_streams(runner.logger)
        # which run this is: the loop mmengine built before before_run (no public accessor)
        built = [run for run in ('train', 'val', 'test')
                 if _built(getattr(runner, f'_{run}_loop', None))]
        training = not built or built[0] == 'train'
        off = ('the pre-flight before any data is read, the work dir\'s lock and --resume\'s '
               'choice of the newest intact checkpoint' if training else
               'the pre-flight before any data is read (the checkpoint\'s checks run here, '
               'after the datasets were built)')
        runner.logger.warning(f'{type(runner).__name__} is not LinAttnRunner (runner_type='
                              f'{runner.cfg.get("runner_type")!r}, or a tool that builds '
                              f"mmengine's own Runner): off in this run: {off}")
        if training:
            return
        try:
            evaluation_checks(runner, f'{built[0]}_dataloader')
        except (ConfigError, CheckpointError) as e:
            raise refuse(e) from None


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
