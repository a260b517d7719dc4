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
   one-request write is used unchanged. The write goes through :func:`mmlinattn.checkpoint.write_atomic`
   (the converter's too). A write that fails (disk full, permissions) raises
   :class:`mmlinattn.hooks.CheckpointWriteError`, one line naming the work dir, the bytes the
   checkpoint needs and the bytes free.
4. **``CheckpointHook`` rotates after the save**: with ``max_keep_ckpts``, mmengine deletes the oldest
   kept checkpoint *before* writing the new one, so a failed write could leave none (and
   ``last_checkpoint`` naming a deleted file). The deletions are now held back until the new file and
   ``last_checkpoint`` are written (local disks; other storage keeps mmengine's order).
5. **An unreadable image or label map is named at its first use**: mmengine's
   ``BaseDataset.prepare_data`` raises :class:`mmlinattn.datafaults.DataFileError` naming the file,
   the sample and the dataset's config key when a sample fails to load and one of its files does
   not decode (truncated, corrupt); other pipeline errors pass through unchanged.

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


def _write_failed(checkpoint, filename, error: OSError):
    """The one-line error for a checkpoint that could not be written: the folder, the bytes the
    checkpoint needs and the bytes free there."""
    import io
    import shutil

    from .hooks import CheckpointWriteError
    folder = os.path.dirname(os.path.abspath(filename))
    try:
        with io.BytesIO() as buf:
            torch.save(checkpoint, buf)
            needed = f'{buf.tell():,} bytes'
    except Exception:  # noqa: BLE001
        needed = 'unknown bytes'
    try:
        free = f'{shutil.disk_usage(folder).free:,} bytes free'
    except OSError:
        free = 'free space unknown'
    reason = error.strerror or str(error)
    return CheckpointWriteError(
        f'could not write checkpoint {os.path.basename(filename)} in work dir {folder}: {reason} '
        f'(needs {needed}, {free}). The previous checkpoint is kept and last_checkpoint still '
        'names it; free space (or fix the permissions) and continue with --resume.')


def _atomic(save_checkpoint):
    def atomic_save_checkpoint(checkpoint, filename, file_client_args=None, backend_args=None):
        from .checkpoint import write_atomic
        kwargs = dict(file_client_args=file_client_args, backend_args=backend_args)
        if not _is_local(filename, file_client_args, backend_args):  # remote: one request
            return save_checkpoint(checkpoint, filename, **kwargs)
        try:
            write_atomic(filename, lambda tmp: save_checkpoint(checkpoint, tmp, **kwargs))
        except OSError as e:
            raise _write_failed(checkpoint, filename, e) from None
    atomic_save_checkpoint.__wrapped__ = save_checkpoint
    return atomic_save_checkpoint


def _is_local_dir(hook) -> bool:
    from mmengine.fileio import LocalBackend
    return isinstance(getattr(hook, 'file_backend', None), LocalBackend)


def _rotate_after_save(save_with_step):
    """CheckpointHook's save-and-rotate with the rotation moved after the save: mmengine deletes the
    oldest kept checkpoint *before* writing the new one, so a failed write (disk full) could leave no
    checkpoint at all. Here the deletions the hook asks for are held back until the new file and
    ``last_checkpoint`` are written; if the write fails, the old files stay (local disks only)."""
    def save_checkpoint_with_step(self, runner, step, meta):
        if not _is_local_dir(self):
            return save_with_step(self, runner, step, meta)
        backend = self.file_backend
        held = []
        backend.remove = lambda path: held.append(('remove', path))
        backend.rmtree = lambda path: held.append(('rmtree', path))
        try:
            save_with_step(self, runner, step, meta)
        finally:
            del backend.remove, backend.rmtree  # the class's own methods again
        for how, path in held:
            getattr(backend, how)(path)
    save_checkpoint_with_step.__wrapped__ = save_with_step
    return save_checkpoint_with_step


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

    # part of the same fix (STATUS['atomic_checkpoint']): the rotation deletes only after the save
    from mmengine.hooks import CheckpointHook
    fn = getattr(CheckpointHook, '_save_checkpoint_with_step', None)
    if fn is None:
        _skip('atomic_checkpoint', 'CheckpointHook has no _save_checkpoint_with_step')
    elif getattr(fn, '__wrapped__', None) is None:
        CheckpointHook._save_checkpoint_with_step = _rotate_after_save(fn)

    # 5. an unreadable image or label map is named at its first use (mmlinattn.datafaults)
    from mmengine.dataset import BaseDataset

    from .datafaults import name_unreadable_files
    fn = getattr(BaseDataset, 'prepare_data', None)
    if fn is None:
        _skip('named_data_files', 'mmengine BaseDataset has no prepare_data')
    elif getattr(fn, '__wrapped__', None) is None:
        BaseDataset.prepare_data = name_unreadable_files(fn)
        STATUS['named_data_files'] = True
