"""The learning-rate / momentum schedule against the length of the run, before any work.

mmengine gives a ``param_scheduler`` entry without ``end`` the run's length in its own unit
(``train_cfg.max_epochs`` for ``by_epoch=True``, the default; ``max_iters`` otherwise; an
iteration-based loop counts as one epoch) and refuses a phase whose end is not after its begin:
``ValueError: end should be larger than begin`` - after the model is built, with nothing naming the
schedule or the shortened run (``max_epochs=1`` on a 300-epoch recipe whose cosine phase begins at
epoch 20; ``max_iters=4`` under a warm-up of 50 iterations). Such a phase is a
:class:`ConfigError` naming the key, its begin and end and where the end came from, and what to
change. A phase that begins or ends after the run (which mmengine runs without a word: the run
stops inside the warm-up, the schedule never reaches its end) is a warning line.
"""
from typing import List, Optional, Tuple

from mmengine.config import Config

from ..config import ConfigError


def run_length(cfg: Config) -> Tuple[Optional[int], Optional[int]]:
    """(epochs, iterations) of the training loop as far as the config tells: an epoch-based loop
    knows its epochs (its iterations depend on the data), an iteration-based one its iterations (and
    counts as one epoch, as mmengine's IterBasedTrainLoop does)."""
    train_cfg = cfg.get('train_cfg') or {}
    kind = str(train_cfg.get('type', ''))
    by_epoch = train_cfg.get('by_epoch')
    if 'Epoch' in kind or by_epoch is True or (not kind and 'max_epochs' in train_cfg):
        epochs = train_cfg.get('max_epochs')
        return (int(epochs) if epochs is not None else None), None
    if 'Iter' in kind or by_epoch is False or (not kind and 'max_iters' in train_cfg):
        iters = train_cfg.get('max_iters')
        return 1, (int(iters) if iters is not None else None)
    return None, None


def check_param_schedulers(cfg: Config, logger=None) -> List[str]:
    """Raise :class:`ConfigError` for a ``param_scheduler`` phase that would end before it begins
    in this run; return (and log as warnings) the phases that begin or end after the run."""
    schedulers = cfg.get('param_scheduler')
    if not schedulers:
        return []
    if isinstance(schedulers, dict):
        # one scheduler, or {optimizer name: scheduler(s)} for several optimizers
        if 'type' in schedulers:
            items = [('param_scheduler', schedulers)]
        else:
            items = []
            for name, group in schedulers.items():
                group = group if isinstance(group, (list, tuple)) else [group]
                items += [(f'param_scheduler.{name}.{i}', s) for i, s in enumerate(group)]
    else:
        items = [(f'param_scheduler.{i}', s) for i, s in enumerate(schedulers)]
    epochs, iters = run_length(cfg)
    errors, warnings = [], []
    for key, s in items:
        if not isinstance(s, dict):
            continue
        by_epoch = s.get('by_epoch', True)
        unit, length = ('epoch', epochs) if by_epoch else ('iteration', iters)
        length_key = 'train_cfg.max_epochs' if by_epoch else 'train_cfg.max_iters'
        one_epoch = by_epoch and iters is not None  # an iteration-based loop is 1 epoch
        if one_epoch:
            length_key = 'the iteration-based loop, one epoch for mmengine'
        begin = s.get('begin', 0)
        end = s.get('end')
        end_from = f'{key}.end'
        if end is None:
            if length is None:
                continue
            end, end_from = length, (
                'its end defaults to the run\'s length, 1 epoch: mmengine counts an '
                'iteration-based loop as one epoch' if one_epoch else
                f'its end defaults to {length_key}={length}')
        what = f"{key} ({s.get('type', '?')}, by_epoch={by_epoch})"
        if end <= begin:
            fix = (f'set {key}.end after its begin, or lower {key}.begin (e.g. --cfg-options '
                   f'{key}.begin=0), or drop the phase from the schedule for this run')
            if end_from != f'{key}.end' and not one_epoch:
                fix = (f'give the run more than {begin} {unit}s, or ' + fix)
            errors.append(f'{what} begins at {unit} {begin} and ends at {unit} {end} '
                          f'({end_from}); mmengine refuses that ("end should be larger than '
                          f'begin"). Fix: {fix}')
        elif length is not None and (begin >= length or end > length):
            warnings.append(f'{what} runs {unit}s {begin}-{end}, but this run has {length} '
                            f'({length_key}): ' + ('it never starts' if begin >= length else
                                                   'it will not reach its end'))
    if errors:
        raise ConfigError.listing('the learning-rate schedule does not fit this run', errors)
    if logger is not None:
        for w in warnings:
            logger.warning(f'param_scheduler: {w}')
    return warnings


def check_optimizer_lr(cfg: Config) -> None:
    """Each optimizer's ``lr`` (``optim_wrapper.optimizer.lr``, or each of an
    ``OptimWrapperDict``'s) is a number: a string such as ``'6e-4x'`` (a typo in --cfg-options)
    reached the optimizer's constructor, deep in mmengine, as a ``ValueError`` traceback."""
    wrapper = cfg.get('optim_wrapper')
    if not isinstance(wrapper, dict):
        return
    found = [('optim_wrapper.optimizer', wrapper['optimizer'])] if isinstance(
        wrapper.get('optimizer'), dict) else [
        (f'optim_wrapper.{k}.optimizer', v['optimizer']) for k, v in wrapper.items()
        if isinstance(v, dict) and isinstance(v.get('optimizer'), dict)]
    bad = [f'{key}.lr={opt["lr"]!r}' for key, opt in found if 'lr' in opt and
           (isinstance(opt['lr'], bool) or not isinstance(opt['lr'], (int, float)))]
    if bad:
        raise ConfigError(f'{", ".join(bad)}: a learning rate must be a number (e.g. '
                          f'--cfg-options {bad[0].split("=")[0]}=6e-4)')
