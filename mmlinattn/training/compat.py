"""Fixes for upstream breakage of the OpenMMLab stack on today's torch, applied only where asked.

``import mmlinattn`` applies none of them: it registers our modules and changes nothing else in the
process. They are applied by :mod:`mmlinattn.upstream_fixes`, which our tools import and which a
config lists in ``custom_imports`` (all of ours do); ``MMLINATTN_UPSTREAM_FIXES=0`` in the
environment turns them off there. Each fix is applied only where the breakage it fixes exists:

1. ``numpy_globals`` - **numpy data types are allow-listed for weights-only loading**, process-wide:
   arrays, dtypes and scalars - never a callable - under numpy 1's (``numpy.core.multiarray``) and
   numpy 2's (``numpy._core.multiarray``) names both, so a checkpoint written under either numpy
   loads under the other. Why: mmengine's checkpoints carry numpy scalars in ``meta`` and the
   message hub, and mmengine 0.10 calls ``torch.load`` without ``weights_only``; where torch loads
   weights-only by default (2.6 and later) its loader refuses them, so ``--resume``, ``load_from``
   and mmdet's / mmseg's own ``tools/test.py`` fail on a Runner checkpoint. Applied where torch
   loads weights-only by default (probed by loading a file that needs a non-allowed global).
2. ``history_buffer`` - **mmengine's ``HistoryBuffer`` pickles only its data.** Why: the message
   hub holds ``HistoryBuffer`` objects whose ``__getstate__`` adds the class's dict of statistics
   functions, which needs ``builtins.getattr`` to unpickle, and allow-listing ``getattr`` would
   defeat weights-only loading. So a ``HistoryBuffer`` now pickles ``max_length`` and its two numpy
   histories and rebuilds its methods on load. Files an unpatched mmengine wrote still refuse
   torch's plain weights-only load (their ``builtins.getattr``); our tools read them with
   :func:`mmlinattn.core.weights.load_runner_checkpoint`. Applied where torch loads weights-only by
   default AND mmengine's own ``__getstate__`` puts functions into the state, for mmengine in
   :data:`MMENGINE_RANGE`.

3. ``local_loader`` - **a checkpoint an unpatched mmengine wrote still loads** (``load_from``,
   ``--resume``, a test's checkpoint): mmengine's loader of local files
   (``CheckpointLoader``'s scheme ``''``) is registered again as itself, then, where torch refuses
   the file weights-only, :func:`mmlinattn.core.weights.load_runner_checkpoint` (weights-only
   with the Runner's allow-list: mmengine's ``HistoryBuffer`` rebuilt without running code).
   Applied where torch loads weights-only by default.

The behaviours that are ours are registered classes that configs name, not fixes:
:class:`mmlinattn.training.hooks.SafeCheckpointHook` (atomic checkpoint writes, rotation after the
save),
:class:`~mmlinattn.training.hooks.NonFiniteLossHook`,
:class:`~mmlinattn.training.hooks.PreemptionHook`; naming an unreadable data file is an extra of our
tools (:mod:`mmlinattn.training.datafaults`).
"""
import warnings

import torch

from ..core.weights.allowlist import (  # noqa: F401
    default_load_reads,
    numpy_global_names,
    numpy_safe_globals,
)

#: mmengine versions the HistoryBuffer fix was written for: ``low <= version < high``. The tested
#: ends are 0.10.0 (``make test-compat``) and 0.10.7 (``make test``).
MMENGINE_RANGE = ('0.10.0', '0.11')

_APPLIED = False
#: which patches took effect (name -> True / reason string), for the tests and the curious
STATUS = {}


def _history_buffer_getstate(self):
    return {'max_length': self.max_length, '_log_history': self._log_history,
            '_count_history': self._count_history}


def _history_buffer_setstate(self, state):
    state = dict(state)
    # written by an unpatched mmengine: methods are class-level
    state.pop('statistics_methods', None)
    self.__dict__.update(state)
    self._set_default_statistics()


def _version(text: str):
    from packaging.version import Version
    return Version(text.split('+', 1)[0])


def _mmengine_in_range() -> bool:
    import mmengine
    low, high = MMENGINE_RANGE
    return _version(low) <= _version(mmengine.__version__) < _version(high)


class _Skip(Exception):
    """A patch does not fit this installation (an unknown version, a missing attribute): it
    warns."""


class _NotNeeded(Exception):
    """The behaviour a patch fixes is absent here (fixed upstream, or not triggered): no warning."""


def _require_mmengine() -> None:
    import mmengine
    if not _mmengine_in_range():
        low, high = MMENGINE_RANGE
        raise _Skip(f'written for mmengine 0.10.x, found {mmengine.__version__} (the fix applies '
                    f'to >={low},<{high})')


def _torch_loads_weights_only_by_default() -> bool:
    """Whether ``torch.load`` without ``weights_only`` loads weights-only here (torch >= 2.6 unless
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set): found by loading, without the argument, an in-memory
    file that names a global no weights-only loader allows."""
    return not default_load_reads({'probe': _WeightsOnlyProbe()})


class _WeightsOnlyProbe:
    """A class no weights-only allow-list has (see :func:`_torch_loads_weights_only_by_default`)."""


def _patch_numpy_globals():
    if not hasattr(torch.serialization, 'add_safe_globals'):
        raise _NotNeeded(f'torch {torch.__version__} has no weights-only allow-list')
    if not _torch_loads_weights_only_by_default():
        raise _NotNeeded(f'torch {torch.__version__} does not load weights-only by default')
    torch.serialization.add_safe_globals(numpy_safe_globals())


def _patch_history_buffer():
    _require_mmengine()
    from mmengine.logging.history_buffer import HistoryBuffer
    if not _torch_loads_weights_only_by_default():
        raise _NotNeeded(f'torch {torch.__version__} does not load weights-only by default')
    buf = HistoryBuffer()
    if not all(hasattr(buf, a) for a in ('max_length', '_log_history', '_count_history',
                                          '_set_default_statistics')):
        raise _Skip('HistoryBuffer lacks the attributes it pickles')
    if HistoryBuffer.__getstate__ is not _history_buffer_getstate:
        # mmengine 0.10's __getstate__ adds the class's {name: function} statistics dict
        state = buf.__getstate__()
        if not any(callable(v) or (isinstance(v, dict) and any(map(callable, v.values())))
                   for v in state.values()):
            raise _NotNeeded("mmengine's HistoryBuffer already pickles only data")
    HistoryBuffer.__getstate__ = _history_buffer_getstate
    HistoryBuffer.__setstate__ = _history_buffer_setstate
    torch.serialization.add_safe_globals([HistoryBuffer])


def _patch_local_loader():
    from mmengine.runner.checkpoint import CheckpointLoader, load_from_local
    if not _torch_loads_weights_only_by_default():
        raise _NotNeeded(f'torch {torch.__version__} does not load weights-only by default')

    def load_local(filename, map_location=None):
        import os.path as osp
        import pickle
        try:
            return load_from_local(filename, map_location)
        except pickle.UnpicklingError:
            if not osp.isfile(osp.expanduser(filename)):
                raise
            from ..core.weights import load_runner_checkpoint
            return load_runner_checkpoint(osp.expanduser(filename), map_location=map_location)

    # the scheme of every local path (mmengine's own prefix ''), through mmengine's public registry
    CheckpointLoader.register_scheme(prefixes='', loader=load_local, force=True)


#: name -> patch, in the order they are applied (see the module docstring for why each exists)
PATCHES = {
    'numpy_globals': _patch_numpy_globals,
    'history_buffer': _patch_history_buffer,
    'local_loader': _patch_local_loader,
}


def _skip(name: str, reason: str) -> None:
    STATUS[name] = reason
    low, high = MMENGINE_RANGE
    warnings.warn(f'mmlinattn: not applying the {name} fix: {reason}. Runner checkpoints may need '
                  f'mmengine >={low},<{high} to load weights-only.',
                  RuntimeWarning, stacklevel=3)


def apply() -> None:
    """Idempotently apply the fixes that fit the installed torch, numpy and mmengine."""
    global _APPLIED
    if _APPLIED:
        return
    _APPLIED = True
    for name, patch in PATCHES.items():
        try:
            patch()
        except _Skip as reason:
            _skip(name, str(reason))
        except _NotNeeded as reason:
            STATUS[name] = f'not needed: {reason}'
        else:
            STATUS[name] = True
