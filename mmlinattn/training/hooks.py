"""Hooks for training with mmengine's Runner."""
import math
import os
import signal

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from .fileio import CheckpointWriteError, last_checkpoint, write_atomic  # noqa: F401 (re-exported)
from .safe_checkpoint import SafeCheckpointHook  # noqa: F401 (registered there, re-exported)


@HOOKS.register_module()
class PlainParamGroupsHook(Hook):
    """Make the optimizer's param groups plain ``dict`` objects before the first step.

    mmengine's optimizer constructor leaves each param group as a ``ConfigDict``. With
    ``compile=True``, mmengine compiles the whole ``train_step``, optimizer step included, and
    torch 2.14's dynamo stops there with ``AttributeError: 'UserDefinedDictVariable' object has no
    attribute 'items'``, because it can only trace plain dict param groups. This hook replaces each
    group with a plain dict of the same entries. Learning rates, schedules and the optimizer state
    are unchanged. ``LinAttnRunner`` adds the hook whenever the config sets ``compile``. With
    upstream tools, add ``custom_hooks = [dict(type='PlainParamGroupsHook')]`` to the config.
    """

    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        from mmengine.optim import OptimWrapper, OptimWrapperDict
        wrapper = runner.optim_wrapper
        if isinstance(wrapper, OptimWrapperDict):
            wrappers = list(wrapper.values())
        elif isinstance(wrapper, OptimWrapper):
            wrappers = [wrapper]
        else:  # not built (test / val runs)
            return
        for w in wrappers:
            opt = w.optimizer
            opt.param_groups[:] = [g if type(g) is dict else dict(g) for g in opt.param_groups]


# --------------------------------------------------------------------------------------------------
# Training that stops: a non-finite loss, a preempted job
# --------------------------------------------------------------------------------------------------

#: exit code of a training (LinAttnRunner, under any tool) after a preemption signal was honoured
#: (checkpoint written): 75 is
#: ``EX_TEMPFAIL`` ("temporary failure; try again") - requeue the job with ``--resume``.
PREEMPTED_EXIT_CODE = 75


class TrainingStopped(RuntimeError):
    """Training stopped on purpose by one of our hooks; ``exit_code`` is the run's exit status after
    the message (``LinAttnRunner``)."""
    exit_code = 2


class NonFiniteLossError(TrainingStopped):
    """A loss term or the gradient norm became NaN/inf, or a checkpoint about to be written holds
    non-finite weights."""


class Preempted(TrainingStopped):
    """SIGTERM / SIGUSR1 arrived; the iteration was finished and a checkpoint written."""
    exit_code = PREEMPTED_EXIT_CODE


#: exit code of a training (LinAttnRunner) after Ctrl-C (SIGINT) was honoured (checkpoint
#: written): 128 + SIGINT, what a shell reports for a program stopped by Ctrl-C.
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT


class Interrupted(Preempted):
    """Ctrl-C (SIGINT) arrived; the iteration was finished and a checkpoint written."""
    exit_code = INTERRUPTED_EXIT_CODE


def stop_run(error: TrainingStopped, voted: bool = True):
    """``error`` as the run's one line: the :class:`~mmlinattn.training.runner.RunRefused` to raise
    (a ``SystemExit`` with the error's exit code that is also ``error``'s type), so any tool that
    runs the config ends with that line and code, no traceback. ``voted``: every rank stops at this
    point (the stop was voted on), so the process group is closed first."""
    from .refusal import close_distributed, refuse
    if voted:
        close_distributed()
    return refuse(error, error.exit_code)


def rank_max(values):
    """Each of the integers ``values`` maxed over all ranks of a distributed run, in one all-reduce
    (on the group's device: mmengine's ``all_reduce`` moves the tensor there and back); the values
    themselves without a process group."""
    from mmengine.dist import all_reduce, get_world_size
    if get_world_size() <= 1:
        return [int(v) for v in values]
    t = torch.tensor([int(v) for v in values], dtype=torch.int64)
    all_reduce(t, op='max')
    return [int(v) for v in t.tolist()]


def _any_rank_each(flags):
    """Each of ``flags`` OR-ed over all ranks."""
    return [v > 0 for v in rank_max([bool(f) for f in flags])]


#: the stop conditions of our hooks, voted on once per training iteration
_STOP_REASONS = ('non_finite', 'preempted')


def stop_vote(runner, reason: str, flag: bool, step=None) -> bool:
    """Whether any rank has ``reason`` (one of :data:`_STOP_REASONS`) to stop after this iteration.

    One all-reduce per iteration serves every stop hook of the run: the first of them to ask (in
    hook priority order: :class:`NonFiniteLossHook` before :class:`PreemptionHook`) sends its own
    flag together with the others' current flags (the preemption flag is set by a signal handler
    and can be read at any time); later hooks of the same iteration read the stored result. Every
    rank runs the same hooks in the same order, so every rank calls the collective at the same
    point.

    In one process (no process group) there is nothing to vote on: each hook's own flag is the
    answer, read when that hook runs. With several ranks a preemption signal that arrives after the
    iteration's vote (while the logging or checkpoint hooks of that iteration run) is honoured at
    the end of the next iteration. ``step``: what one vote is for (default: the training
    iteration; a validation iteration passes its own)."""
    from mmengine.dist import get_world_size
    if get_world_size() <= 1:
        return bool(flag)
    step = runner.iter if step is None else step
    cache = getattr(runner, '_mmlinattn_stop_vote', None)
    if cache is not None and cache[0] == step and reason in cache[2]:
        return cache[1][reason]
    # a reason not voted on with its real flag yet this iteration (a config that runs
    # PreemptionHook before NonFiniteLossHook): vote again - every rank runs the same hooks in the
    # same order, so every rank does
    flags = {r: False for r in _STOP_REASONS}
    flags[reason] = bool(flag)
    voted = {reason}
    for hook in runner.hooks:
        if isinstance(hook, PreemptionHook) and reason != 'preempted':
            flags['preempted'] = hook.received is not None
            voted.add('preempted')
    result = dict(zip(_STOP_REASONS, _any_rank_each([flags[r] for r in _STOP_REASONS])))
    runner._mmlinattn_stop_vote = (step, result, voted)
    return result[reason]


def _lr_text(runner) -> str:
    try:
        lrs = runner.optim_wrapper.get_lr()
    except Exception as e:  # part of the message of the error being raised
        # (NonFiniteLossError), which nothing may replace: a failure here is named in it instead
        return f'lr unknown ({type(e).__name__}: {str(e)[:120]})'
    parts = []
    for name, values in lrs.items():
        vals = sorted({float(v) for v in values})
        parts.append(f'{name}={vals[0]:.6g}' if len(vals) == 1 else
                     f'{name} in [{vals[0]:.6g}, {vals[-1]:.6g}]')
    return ', '.join(parts)


def non_finite_tensors(state: dict, limit: int = 8):
    """``(names of non-finite floating tensors of a state dict (first ``limit``), their count, total
    tensors)``."""
    bad, total = [], 0
    for k, v in state.items():
        if not isinstance(v, torch.Tensor):
            continue
        total += 1
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            bad.append(k)
    return bad[:limit], len(bad), total


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Stop training at the first iteration whose loss (any term) or gradient norm is NaN/inf.

    mmdet's ``CheckInvalidLossHook`` (which this hook replaces, for every toolbox) asserts
    ``torch.isfinite(outputs['loss'])`` every ``interval`` (50) iterations; its assertion message is
    ``None`` (it is the return value of ``logger.info``), it looks at the summed loss only, is off
    under ``python -O`` and only mmdet configs see it. This hook checks every iteration
    (``interval=1``) each loss term of the model's outputs and the gradient norm mmengine records
    when ``clip_grad`` is set, OR-ed over all ranks (a non-finite value on any rank stops every rank
    at the same iteration), and raises :class:`NonFiniteLossError` naming the iteration, the
    non-finite terms and the learning rate. It runs before ``CheckpointHook`` (priority
    ``ABOVE_NORMAL`` vs ``VERY_LOW``), so the broken weights are never saved and the last good
    checkpoint stays the resume point.

    What it costs: nothing of its own on the healthy path. The values it reads are the ones
    mmengine's ``RuntimeInfoHook`` has just copied to the host for the log (one ``.item()`` per
    loss term, every iteration, with or without this hook); the vote over the ranks is one
    all-reduce of two numbers shared with :class:`PreemptionHook` (:func:`stop_vote`). The model's
    parameters are not read on the healthy path: an update that makes a weight non-finite while
    the loss was finite shows as a non-finite loss in the next iteration (then the parameters are
    read once, to name the ones that broke), and a checkpoint is never written with non-finite
    weights (``before_save_checkpoint`` reads the state dict being saved, once per checkpoint). So
    such an update stops training at most one iteration later, or at the checkpoint, whichever
    comes first, and never leaves a broken checkpoint.

    Our runtimes list it in ``custom_hooks`` (``LinAttnRunner`` puts it back where a config's own
    list dropped it); ``interval=0`` turns the per-iteration check off.
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self, interval: int = 1) -> None:
        self.interval = interval
        self._seen = {}
        self._from_hub = False

    def before_train(self, runner) -> None:
        # mmengine's RuntimeInfoHook copies every output to the message hub (train/<key>, a host
        # float) before this hook runs: read those instead of synchronising on the tensors again
        from mmengine.hooks import RuntimeInfoHook
        hooks = list(runner.hooks)
        mine = next((i for i, h in enumerate(hooks) if h is self), None)
        info = next((i for i, h in enumerate(hooks) if type(h) is RuntimeInfoHook), None)
        self._from_hub = mine is not None and info is not None and info < mine

    def _term_values(self, runner, outputs):
        """(name, value) of each loss term of this iteration, as host numbers where mmengine has
        already made them host numbers."""
        hub = runner.message_hub.log_scalars
        for name, value in (outputs or {}).items():
            if isinstance(value, torch.Tensor) and value.numel() == 1 and self._from_hub and \
                    f'train/{name}' in hub:
                yield name, float(hub[f'train/{name}'].current())
            elif isinstance(value, torch.Tensor):
                finite = bool(torch.isfinite(value.detach()).all())
                yield name, (value.detach().float().mean().item() if not finite else 0.0)
            elif isinstance(value, (int, float)):
                yield name, value

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if not self.every_n_train_iters(runner, self.interval):
            return
        bad = [f'{name}={value}' for name, value in self._term_values(runner, outputs)
               if not math.isfinite(value)]
        hub = runner.message_hub
        for key in ('train/grad_norm', 'train/grad_value'):
            buf = hub.log_scalars.get(key)
            # only this iteration's value (mmengine records it when clip_grad is set)
            if buf is not None and self._seen.get(key) != len(buf.data[1]):
                self._seen[key] = len(buf.data[1])
                value = float(buf.current())
                if not math.isfinite(value):
                    bad.append(f'{key.split("/")[1]}={value}')
        weights = self._weights_before_a_save(runner) if not bad else []
        if not stop_vote(runner, 'non_finite', bool(bad or weights)):
            return
        from mmengine.dist import get_rank
        from mmengine.runner import EpochBasedTrainLoop
        epoch = isinstance(runner.train_loop, EpochBasedTrainLoop)
        where = f'iteration {runner.iter + 1}' + (f' (epoch {runner.epoch + 1})' if epoch else '')
        if weights:
            what = (f'non-finite weights after the update of {where}: {weights[1]} of '
                    f'{weights[2]} parameter tensors, e.g. {", ".join(weights[0])}; the loss was '
                    'finite (the update overflowed)')
        elif bad:
            what = f'non-finite loss at {where}: {", ".join(bad)}'
            # the unhealthy path only: the weights as this iteration's update left them (read
            # after the step; whether they were finite before it is not known without reading
            # them at every healthy iteration)
            weights = self._non_finite_params(runner)
            if weights:
                what += (f'; after the update of {where}, {weights[1]} of {weights[2]} '
                         f'parameter tensors are non-finite, e.g. {", ".join(weights[0])}')
        else:
            what = (f'non-finite loss or weights at {where} on another rank '
                    f'(this is rank {get_rank()})')
        last = last_checkpoint(runner.work_dir)
        raise stop_run(NonFiniteLossError(
            f'{what}; {_lr_text(runner)}. Training stopped; no '
            f'checkpoint of these weights was written' +
            (f'; the last good checkpoint is {last}' if last else '') +
            '. Lower the learning rate (optim_wrapper.optimizer.lr), add gradient clipping '
            '(optim_wrapper.clip_grad=dict(max_norm=...)) or check the data.')) from None

    @staticmethod
    def _weights_before_a_save(runner):
        """With several ranks, at an iteration whose end an iteration-based ``CheckpointHook``
        saves: the non-finite parameters (see :meth:`_non_finite_params`), checked on every rank
        before the save. Rank 0 alone writes checkpoints, so its guard
        (:meth:`before_save_checkpoint`) would stop rank 0 alone and leave the others waiting in
        their next collective; DDP keeps the weights equal on every rank, and the result goes into
        the iteration's vote. Else ``[]`` (nothing read). Epoch-based saves and ``save_best``
        after validation keep only the guard."""
        from mmengine.dist import get_world_size
        from mmengine.hooks import CheckpointHook
        if get_world_size() <= 1:
            return []
        for hook in runner.hooks:
            if isinstance(hook, CheckpointHook) and not hook.by_epoch and hook.interval > 0 and (
                    hook.every_n_train_iters(runner, hook.interval) or
                    (hook.save_last and hook.is_last_train_iter(runner))):
                return NonFiniteLossHook._non_finite_params(runner)
        return []

    @staticmethod
    def _non_finite_params(runner):
        """``(first names, count, total)`` of the model's non-finite parameters, or ``[]``: one
        fused norm per tensor (``torch._foreach_norm``), a single host sync."""
        named = [(k, p) for k, p in runner.model.named_parameters() if p.is_floating_point()]
        if not named:
            return []
        params = [p.detach() for _, p in named]
        try:
            norms = torch.stack([n.float() for n in torch._foreach_norm(params)])
        except (RuntimeError, NotImplementedError):  # a device / dtype mix the fused kernel
            # refuses: the same norms one tensor at a time
            norms = torch.stack([p.float().norm().cpu() for p in params])
        finite = torch.isfinite(norms)
        if bool(finite.all()):
            return []
        names = [named[i][0] for i in (~finite).nonzero().flatten().tolist()]
        return names[:8], len(names), len(named)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        names, n, total = non_finite_tensors(checkpoint.get('state_dict') or {})
        if n:
            it = checkpoint.get('meta', {}).get('iter', runner.iter + 1)
            last = last_checkpoint(runner.work_dir)
            # rank 0 alone saves: no vote here (with several ranks, _weights_before_a_save voted)
            raise stop_run(NonFiniteLossError(
                f'non-finite weights after the update of iteration {it}: {n} of {total} '
                f'state-dict tensors, e.g. {", ".join(names)}{", ..." if n > len(names) else ""}; '
                f'the loss was finite (the update overflowed); {_lr_text(runner)}. '
                'Refused to write this checkpoint; training stopped' +
                (f'; the last good checkpoint is {last}' if last else '') +
                '. Lower the learning rate (optim_wrapper.optimizer.lr), add gradient clipping '
                '(optim_wrapper.clip_grad=dict(max_norm=...)) or check the data.'),
                voted=False) from None


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Preemption-safe training: on SIGTERM or SIGUSR1 (``signals``; slurm sends SIGUSR1 ahead of a
    time limit when asked, see tools/slurm_train.sh, and SIGTERM when it preempts or cancels a job)
    the current iteration is finished, a checkpoint is written and training stops with
    :class:`Preempted` (the run exits with :data:`PREEMPTED_EXIT_CODE`, 75).
    ``--resume`` continues from that checkpoint with the same iteration, learning rate, optimizer
    and scheduler state.

    Ctrl-C (SIGINT; ``ctrl_c=True``) does the same, with :class:`Interrupted` (exit code
    :data:`INTERRUPTED_EXIT_CODE`, 130) instead of a ``KeyboardInterrupt`` traceback that loses the
    iterations since the last checkpoint. The first Ctrl-C prints one line saying so; a second one
    while the stop is pending raises ``KeyboardInterrupt`` at once (nothing more is saved).

    The signal handler only sets a flag. After every training iteration the flag is OR-ed over all
    ranks (a collective, so it also waits for every rank to finish the iteration; one all-reduce
    shared with :class:`NonFiniteLossHook`'s vote, :func:`stop_vote`); then the
    checkpoint is written once, by rank 0 (mmengine's ``Runner.save_checkpoint`` is
    ``master_only``), as ``iter_{n}.pth`` (``n``: iterations done) and named in ``last_checkpoint``.
    With an iteration-based ``CheckpointHook`` the file is written by that hook's own save
    (its ``out_dir``, file name and arguments), so it counts in ``max_keep_ckpts``: the oldest kept
    checkpoint is rotated out as for any other save, and a resumed run goes on rotating. With an
    epoch-based ``CheckpointHook`` (``epoch_{n}.pth`` names) the mid-epoch ``iter_{n}.pth`` is
    written beside them, and removed by the resumed run once the hook has written its next
    checkpoint. With an epoch-based loop, a resumed run starts the interrupted epoch again from its
    first batch (mmengine's resume), keeping the iteration count.

    Our runtimes list it in ``custom_hooks``; ``signals=[], ctrl_c=False`` turns it off (Ctrl-C is
    then Python's ``KeyboardInterrupt`` again).

    Data loader workers started before ``before_train`` (an iteration-based loop starts them when
    it is built) keep Python's own Ctrl-C handling: a Ctrl-C typed in the terminal also reaches them
    and they stop. The iteration under way and the checkpoint do not need them; an iteration still
    waiting for its batch from such a worker fails with the data loader's error instead.
    """

    priority = 'LOWEST'  # after CheckpointHook: an iteration it has just saved is not saved twice

    #: the message hub key naming a mid-epoch checkpoint that the resumed run removes later
    STALE_KEY = 'preemption_ckpt'

    def __init__(self, signals=('SIGTERM', 'SIGUSR1'), ctrl_c: bool = True) -> None:
        self.signals = [getattr(signal, s) if isinstance(s, str) else signal.Signals(s)
                        for s in signals]
        if ctrl_c and signal.SIGINT not in self.signals:
            self.signals.append(signal.SIGINT)
        self.received = None
        self._previous = {}
        self._stale = None
        self._validating = False
        self._trained = False

    def _handler(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            if self.received is not None:  # a second Ctrl-C: stop now, without saving
                self.after_train(None)
                raise KeyboardInterrupt
            # os.write: safe inside a signal handler (print could re-enter a half-written stream)
            now = (b'stopping the validation after this batch' if self._validating else
                   b'finishing this iteration')
            os.write(2, b'\nCtrl-C: ' + now + b', then saving a checkpoint and stopping '
                     b'(press Ctrl-C again to stop at once, without saving)\n')
        if self.received is None:
            self.received = signal.Signals(signum).name

    def before_train(self, runner) -> None:
        import threading
        self._stale = runner.message_hub.get_info(self.STALE_KEY)
        if threading.current_thread() is not threading.main_thread():
            runner.logger.warning('PreemptionHook: not on the main thread, signals not handled')
            return
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handler)

    def after_train(self, runner) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev)
        self._previous = {}
        if runner is not None and self.received is not None and not self._trained:
            # the signal came after the last iteration's vote (the last validation's end, the
            # hooks after it): the training is complete, nothing to stop
            self._trained = True
            runner.logger.warning(f'{self.received} received after the last training iteration: '
                                  'the training was complete, nothing was stopped')

    # a validation during the training: the signal stops it after the batch under way
    def before_val(self, runner) -> None:
        self._validating = bool(self._previous)  # only a validation inside our training

    def after_val(self, runner) -> None:
        self._validating = False

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        # with several ranks, one vote per validation batch: every rank runs the same number of
        # batches (mmengine's DefaultSampler pads the split, round_up=True by default)
        if not self._validating or \
                not stop_vote(runner, 'preempted', self.received is not None, ('val', batch_idx)):
            return
        self._validating = False
        # the training loop has counted its iterations before validating: runner.iter is done
        self._stop(runner, runner.iter, 'stopped the validation after iteration', in_val=True)

    @staticmethod
    def _checkpoint_hook(runner):
        from mmengine.hooks import CheckpointHook
        return next((h for h in runner.hooks if isinstance(h, CheckpointHook)), None)

    def _drop_stale(self, runner) -> None:
        """After a resume from a mid-epoch preemption checkpoint: remove it once the epoch-based
        CheckpointHook has written a newer checkpoint (so that ``max_keep_ckpts`` holds again)."""
        hook = self._checkpoint_hook(runner)
        last = getattr(hook, 'last_ckpt', None)
        if not self._stale or last is None or last == self._stale:
            return
        from mmengine.dist import is_main_process
        if is_main_process() and os.path.isfile(last) and os.path.isfile(self._stale):
            os.remove(self._stale)
        runner.message_hub.pop_info(self.STALE_KEY)
        self._stale = None

    def after_train_epoch(self, runner) -> None:
        self._drop_stale(runner)

    def after_train_iter(self, runner, batch_idx=None, data_batch=None, outputs=None) -> None:
        self._drop_stale(runner)
        if not stop_vote(runner, 'preempted', self.received is not None):
            return
        # mmengine counts the iteration after the hooks
        self._stop(runner, runner.iter + 1, 'finished iteration')

    def _stop(self, runner, done: int, what: str, in_val: bool = False) -> None:
        """Save the weights after ``done`` iterations (unless the checkpoint hook has just saved
        them), then stop with :class:`Preempted` / :class:`Interrupted`."""
        from mmengine.dist import barrier, is_main_process
        self._trained = True
        meta = dict(epoch=runner.epoch, iter=done)
        hook = self._checkpoint_hook(runner)
        saved = getattr(hook, 'last_ckpt', None)
        if in_val and hook is not None and hook.by_epoch and saved and \
                getattr(hook, 'file_backend', None) and saved == hook.file_backend.join_path(
                    hook.out_dir, hook.filename_tmpl.format(runner.epoch)):
            path = saved  # the epoch's checkpoint, written before this validation
        elif hook is not None and not hook.by_epoch and getattr(hook, 'file_backend', None):
            # the hook's own save: its out_dir and file name, and its max_keep_ckpts rotation
            path = hook.file_backend.join_path(hook.out_dir, hook.filename_tmpl.format(done))
            if hook.last_ckpt != path:  # not saved by the hook at this very iteration
                hook._save_checkpoint_with_step(runner, done, meta=meta)
        else:
            name = f'iter_{done}.pth'
            path = os.path.join(runner.work_dir, name)
            if hook is not None and hook.max_keep_ckpts > 0:  # removed after the next epoch's save
                runner.message_hub.update_info(self.STALE_KEY, path)
            if isinstance(hook, SafeCheckpointHook):
                hook.save_atomically(runner, runner.work_dir, name, meta=meta, by_epoch=False)
            else:
                runner.save_checkpoint(runner.work_dir, name, meta=meta, by_epoch=False)
            if is_main_process():

                def write(tmp):
                    with open(tmp, 'w') as f:
                        f.write(path)
                write_atomic(os.path.join(runner.work_dir, 'last_checkpoint'), write)
                if self._stale and self._stale != path and os.path.isfile(self._stale):
                    # preempted twice in one epoch: the newer file replaces it
                    os.remove(self._stale)
        barrier()
        self.after_train(runner)
        why = self.received or 'a signal on another rank'
        error = Interrupted if self.received == 'SIGINT' else Preempted
        shown = 'SIGINT (Ctrl-C)' if self.received == 'SIGINT' else why
        raise stop_run(error(f'{shown} received: {what} {done}, saved {path}; continue with '
                             f'--resume (exit code {error.exit_code})')) from None
