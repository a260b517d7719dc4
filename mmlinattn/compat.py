"""Fixes for known breakages of the pinned stack (DESIGN.md section 7), applied on ``import mmlinattn``.

torch >= 2.6 loads checkpoints weights-only by default, and mmengine 0.10.7 calls ``torch.load``
without the argument. A Runner checkpoint then fails in ``--resume``, ``load_from`` and
``tools/test.py`` with "Unsupported global", because its ``message_hub`` holds ``HistoryBuffer``
objects (numpy arrays inside) and each ``HistoryBuffer`` pickles a dict of bound methods, which needs
``builtins.getattr`` to unpickle - allow-listing ``getattr`` would defeat weights-only loading.

So instead of switching weights-only loading off:

1. ``HistoryBuffer`` pickles only its data (``max_length`` and the two numpy histories) and rebuilds
   its statistics methods on load: checkpoints written after ``import mmlinattn`` carry no callables;
2. only *data* types are allow-listed for the weights-only unpickler: ``HistoryBuffer`` itself, numpy
   arrays, dtypes and scalars.

And so that a run killed while saving never leaves a truncated checkpoint behind, the Runner's
checkpoints are written to a temporary file and renamed into place (local paths).
"""
import os

import numpy as np
import torch

_APPLIED = False


def _history_buffer_getstate(self):
    return {'max_length': self.max_length, '_log_history': self._log_history,
            '_count_history': self._count_history}


def _history_buffer_setstate(self, state):
    state = dict(state)
    state.pop('statistics_methods', None)  # written by an unpatched mmengine: methods are class-level
    self.__dict__.update(state)
    self._set_default_statistics()


def numpy_safe_globals():
    core = getattr(np, '_core', None) or np.core
    types = [np.ndarray, np.dtype, core.multiarray._reconstruct, core.multiarray.scalar]
    types += [type(np.dtype(t)) for t in (np.float16, np.float32, np.float64, np.int8, np.int16,
                                           np.int32, np.int64, np.uint8, np.bool_)]
    return types


def _atomic(save_checkpoint):
    def atomic_save_checkpoint(checkpoint, filename, *args, **kwargs):
        if '://' in str(filename):  # remote backends write in one request
            return save_checkpoint(checkpoint, filename, *args, **kwargs)
        tmp = f'{filename}.tmp-{os.getpid()}'
        try:
            save_checkpoint(checkpoint, tmp, *args, **kwargs)
            os.replace(tmp, filename)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    atomic_save_checkpoint.__wrapped__ = save_checkpoint
    return atomic_save_checkpoint


def apply() -> None:
    """Idempotently apply the fixes."""
    global _APPLIED
    if _APPLIED:
        return
    from mmengine.logging.history_buffer import HistoryBuffer
    HistoryBuffer.__getstate__ = _history_buffer_getstate
    HistoryBuffer.__setstate__ = _history_buffer_setstate
    torch.serialization.add_safe_globals([HistoryBuffer] + numpy_safe_globals())
    import mmengine.runner.runner as runner_module
    runner_module.save_checkpoint = _atomic(runner_module.save_checkpoint)
    _APPLIED = True
