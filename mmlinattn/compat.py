"""Fixes for known breakages of the pinned stack, applied once on ``import mmlinattn``.

What importing ``mmlinattn`` changes in the process (also listed in the README):

1. **mmengine's ``HistoryBuffer`` pickles only its data.** torch >= 2.6 loads checkpoints
   weights-only by default and mmengine 0.10 calls ``torch.load`` without the argument, so a Runner
   checkpoint fails in ``--resume``, ``load_from`` and ``tools/test.py`` with "Unsupported global":
   its ``message_hub`` holds ``HistoryBuffer`` objects whose dict of bound statistics methods needs
   ``builtins.getattr`` to unpickle, and allow-listing ``getattr`` would defeat weights-only loading.
   So a ``HistoryBuffer`` now pickles ``max_length`` and its two numpy histories and rebuilds its
   methods on load; files written by an unpatched mmengine still load (the stale methods are dropped).
2. **Data types are allow-listed for weights-only loading**, process-wide: ``HistoryBuffer``, numpy
   arrays, dtypes and scalars - never a callable.
3. **The Runner's checkpoints are written atomically** on local disks: to a temporary file in the same
   folder, then renamed, so a run killed while saving never leaves a truncated checkpoint. Where the
   config's ``backend_args`` (or the path's prefix) select another storage backend, mmengine's own
   one-request write is used unchanged.

Each patch touches mmengine internals, so each checks the mmengine version it was written for
(:data:`SUPPORTED_MMENGINE`) and the attributes it relies on; with another version it warns and is
skipped instead of guessing.
"""
import os
import warnings

import numpy as np
import torch

#: mmengine versions the patches below were written and tested for (major.minor).
SUPPORTED_MMENGINE = ('0.10',)

_APPLIED = False
#: which patches took effect (name -> True / reason string), for the tests and the curious
STATUS = {}


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


def _is_local(filename, file_client_args=None, backend_args=None) -> bool:
    """Whether mmengine would write ``filename`` to the local disk with these arguments."""
    from mmengine.fileio import FileClient, LocalBackend, get_file_backend
    if str(filename).startswith('pavi://'):
        return False
    if file_client_args is not None:
        client = FileClient.infer_client(file_client_args, filename)
        return type(client.client).__name__ in ('HardDiskBackend', 'LocalBackend')
    return isinstance(get_file_backend(filename, backend_args=backend_args), LocalBackend)


def _atomic(save_checkpoint):
    def atomic_save_checkpoint(checkpoint, filename, file_client_args=None, backend_args=None):
        kwargs = dict(file_client_args=file_client_args, backend_args=backend_args)
        if not _is_local(filename, file_client_args, backend_args):  # remote: one request
            return save_checkpoint(checkpoint, filename, **kwargs)
        tmp = f'{filename}.tmp-{os.getpid()}'
        try:
            save_checkpoint(checkpoint, tmp, **kwargs)
            os.replace(tmp, filename)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    atomic_save_checkpoint.__wrapped__ = save_checkpoint
    return atomic_save_checkpoint


def _skip(name: str, reason: str) -> None:
    STATUS[name] = reason
    warnings.warn(f'mmlinattn: not applying the {name} fix: {reason}. Checkpoints may need '
                  f'mmengine {"/".join(SUPPORTED_MMENGINE)}.x to load weights-only or save atomically.',
                  RuntimeWarning, stacklevel=3)


def apply() -> None:
    """Idempotently apply the fixes that fit the installed mmengine."""
    global _APPLIED
    if _APPLIED:
        return
    _APPLIED = True
    import mmengine
    version = '.'.join(mmengine.__version__.split('.')[:2])
    if version not in SUPPORTED_MMENGINE:
        for name in ('history_buffer', 'atomic_checkpoint'):
            _skip(name, f'written for mmengine {"/".join(SUPPORTED_MMENGINE)}.x, found '
                        f'{mmengine.__version__}')
        torch.serialization.add_safe_globals(numpy_safe_globals())
        return

    from mmengine.logging.history_buffer import HistoryBuffer
    buf = HistoryBuffer()
    if all(hasattr(buf, a) for a in ('max_length', '_log_history', '_count_history',
                                      '_set_default_statistics')):
        HistoryBuffer.__getstate__ = _history_buffer_getstate
        HistoryBuffer.__setstate__ = _history_buffer_setstate
        torch.serialization.add_safe_globals([HistoryBuffer] + numpy_safe_globals())
        STATUS['history_buffer'] = True
    else:
        _skip('history_buffer', 'HistoryBuffer lacks the attributes it pickles')
        torch.serialization.add_safe_globals(numpy_safe_globals())

    import mmengine.runner.runner as runner_module
    fn = getattr(runner_module, 'save_checkpoint', None)
    if fn is None:
        _skip('atomic_checkpoint', 'mmengine.runner.runner has no save_checkpoint')
    elif getattr(fn, '__wrapped__', None) is None:
        runner_module.save_checkpoint = _atomic(fn)
        STATUS['atomic_checkpoint'] = True
