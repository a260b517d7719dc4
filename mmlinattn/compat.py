"""Fixes for known breakages of the OpenMMLab stack, applied once on ``import mmlinattn``.

Each fix is applied only where the upstream behaviour it fixes exists: a version range (the tested
ends: mmengine 0.10.4 in ``make test-compat``, 0.10.7 in ``make test``; the patched mmengine
functions are the same in both) and, where it can be seen, a check of the behaviour itself. With an
mmengine outside :data:`MMENGINE_RANGE` the mmengine patches warn and are skipped instead of
guessing; where the check finds the behaviour already fixed upstream, the patch is skipped silently.
:data:`STATUS` records each outcome (name -> ``True``, or the reason it was not applied).

What importing ``mmlinattn`` can change in the process (also listed in the README):

1. ``history_buffer`` - **mmengine's ``HistoryBuffer`` pickles only its data.** Why: torch >= 2.6
   loads checkpoints weights-only by default and mmengine 0.10 calls ``torch.load`` without the
   argument, so a Runner checkpoint fails in ``--resume``, ``load_from`` and ``tools/test.py`` with
   "Unsupported global": its ``message_hub`` holds ``HistoryBuffer`` objects whose ``__getstate__``
   adds the class's dict of statistics functions, which needs ``builtins.getattr`` to unpickle, and
   allow-listing ``getattr`` would defeat weights-only loading. So a ``HistoryBuffer`` now pickles
   ``max_length`` and its two numpy histories and rebuilds its methods on load; files written by an
   unpatched mmengine still load (the stale methods are dropped). Applied when torch loads
   weights-only by default AND mmengine's own ``__getstate__`` puts functions into the state.
2. ``numpy_globals`` - **numpy data types are allow-listed for weights-only loading**, process-wide:
   arrays, dtypes and scalars - never a callable - under numpy 1's (``numpy.core.multiarray``) and
   numpy 2's (``numpy._core.multiarray``) names both, so a checkpoint written under either numpy
   loads under the other. Why: mmengine's checkpoints carry numpy scalars in ``meta`` and the
   message hub; torch's weights-only loader refuses them. Applied wherever torch has
   ``add_safe_globals`` (torch >= 2.4), whatever the mmengine version.
3. ``atomic_checkpoint`` - **the Runner's checkpoints are written atomically** on local disks: to a
   temporary file in the same folder, then renamed, so a run killed while saving never leaves a
   truncated checkpoint. Why: mmengine 0.10's ``save_checkpoint`` writes the final name directly.
   Where the config's ``backend_args`` (or the path's prefix) select another storage backend,
   mmengine's own one-request write is used unchanged. The write goes through
   :func:`mmlinattn.fileio.write_atomic` (the converter's too). A write that fails (disk full,
   permissions) raises :class:`mmlinattn.fileio.CheckpointWriteError`, one line naming the work dir,
   the bytes the checkpoint needs and the bytes free. Applied for mmengine in :data:`MMENGINE_RANGE`
   whose ``save_checkpoint`` takes ``(checkpoint, filename, file_client_args, backend_args)``.
4. ``rotate_after_save`` - **``CheckpointHook`` rotates after the save**: with ``max_keep_ckpts``,
   mmengine 0.10's ``CheckpointHook._save_checkpoint_with_step`` deletes the oldest kept checkpoint
   *before* writing the new one, so a failed write could leave none (and ``last_checkpoint`` naming
   a deleted file). The deletions are now held back until the new file and ``last_checkpoint`` are
   written (local disks; other storage keeps mmengine's order). Applied for mmengine in
   :data:`MMENGINE_RANGE` whose method (read from its source) still deletes before it saves.
5. ``named_data_files`` - **an unreadable image or label map is named at its first use**: mmengine
   0.10's ``BaseDataset.prepare_data`` hands a sample to the pipeline and lets mmcv's / PIL's decode
   error surface without the file's name; it now raises :class:`mmlinattn.datafaults.DataFileError`
   naming the file, the sample and the dataset's config key when a sample fails to load and one of
   its files does not decode (truncated, corrupt); other pipeline errors pass through unchanged.
   Applied for mmengine in :data:`MMENGINE_RANGE`.

mmdet and mmsegmentation need no patch here: the tested ranges (mmdet 3.2.0 - 3.3.0,
mmsegmentation 1.2.1 - 1.2.2) run unchanged.
"""
import inspect
import warnings

import numpy as np
import torch

from .fileio import checkpoint_write_error, write_atomic

#: mmengine versions the mmengine patches (1, 3, 4, 5) were written for: ``low <= version < high``.
#: The tested ends are 0.10.4 (``make test-compat``) and 0.10.7 (``make test``).
MMENGINE_RANGE = ('0.10.0', '0.11')
#: the same as (major, minor) strings, kept for callers of the older name
SUPPORTED_MMENGINE = ('0.10',)

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


#: where numpy defines the functions its pickles name: numpy 1.x and numpy 2.x
_NUMPY_MULTIARRAY_MODULES = ('numpy.core.multiarray', 'numpy._core.multiarray')


def numpy_global_names() -> dict:
    """The numpy globals a weights-only load may resolve, ``'module.name' -> object``.

    ``ndarray`` pickles through ``multiarray._reconstruct`` and numpy scalars through
    ``multiarray.scalar``; numpy 1 names their module ``numpy.core.multiarray``, numpy 2
    ``numpy._core.multiarray`` (the old name is a deprecated alias there, and numpy 1.26 has only
    partial stubs under the new one). The two functions are taken from what this numpy's own
    pickling uses (``__reduce__``), so no module attribute that may not exist is touched, and both
    names map to them: a file written under either numpy loads under the other."""
    reconstruct = np.ndarray((0,), dtype=np.float32).__reduce__()[0]
    scalar = np.float64(0).__reduce__()[0]
    names = {}
    for obj in (reconstruct, scalar):
        names[f'{obj.__module__}.{obj.__name__}'] = obj
        for module in _NUMPY_MULTIARRAY_MODULES:
            names[f'{module}.{obj.__name__}'] = obj
    types = [np.ndarray, np.dtype]
    types += [type(np.dtype(t)) for t in (np.float16, np.float32, np.float64, np.int8, np.int16,
                                           np.int32, np.int64, np.uint8, np.bool_)]
    for obj in types:
        names[f'{obj.__module__}.{obj.__qualname__}'] = obj
    return names


def numpy_safe_globals() -> list:
    """:func:`numpy_global_names` as entries for ``torch.serialization.add_safe_globals``:
    ``(object, 'module.name')`` pairs, so one object is allowed under each of its names."""
    return [(obj, name) for name, obj in numpy_global_names().items()]


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
        try:
            write_atomic(filename, lambda tmp: save_checkpoint(checkpoint, tmp, **kwargs))
        except OSError as e:
            raise checkpoint_write_error(checkpoint, filename, e) from None
    atomic_save_checkpoint.__wrapped__ = save_checkpoint
    return atomic_save_checkpoint


def _is_local_dir(hook) -> bool:
    from mmengine.fileio import LocalBackend
    return isinstance(getattr(hook, 'file_backend', None), LocalBackend)


def _rotate_after_save(save_with_step):
    """CheckpointHook's save-and-rotate with the rotation moved after the save: mmengine deletes the
    oldest kept checkpoint *before* writing the new one, so a failed write (disk full) could leave
    no checkpoint at all. Here the deletions the hook asks for are held back until the new file and
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
    """torch >= 2.6: ``torch.load`` without ``weights_only`` is weights-only (unless the user turned
    it off with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD)."""
    return _version(torch.__version__) >= _version('2.6')


def _patch_numpy_globals():
    if not hasattr(torch.serialization, 'add_safe_globals'):
        raise _NotNeeded(f'torch {torch.__version__} has no weights-only allow-list')
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


def _patch_atomic_checkpoint():
    _require_mmengine()
    import mmengine.runner.runner as runner_module
    fn = getattr(runner_module, 'save_checkpoint', None)
    if fn is None:
        raise _Skip('mmengine.runner.runner has no save_checkpoint')
    if getattr(fn, '__wrapped__', None) is not None:
        return  # already ours
    params = list(inspect.signature(fn).parameters)
    if params[:4] != ['checkpoint', 'filename', 'file_client_args', 'backend_args']:
        raise _Skip(f'mmengine save_checkpoint takes {params}, not (checkpoint, filename, '
                    'file_client_args, backend_args)')
    runner_module.save_checkpoint = _atomic(fn)


def _deletes_before_saving(fn) -> bool:
    """Whether ``CheckpointHook._save_checkpoint_with_step`` removes old checkpoints before it calls
    ``runner.save_checkpoint`` (mmengine 0.10); True when its source cannot be read."""
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return True
    remove, save = src.find('.remove('), src.find('runner.save_checkpoint(')
    return remove == -1 or save == -1 or remove < save


def _patch_rotate_after_save():
    _require_mmengine()
    from mmengine.hooks import CheckpointHook
    fn = getattr(CheckpointHook, '_save_checkpoint_with_step', None)
    if fn is None:
        raise _Skip('CheckpointHook has no _save_checkpoint_with_step')
    if getattr(fn, '__wrapped__', None) is not None:
        return  # already ours
    if not _deletes_before_saving(fn):
        raise _NotNeeded("mmengine's CheckpointHook already deletes old checkpoints after saving")
    CheckpointHook._save_checkpoint_with_step = _rotate_after_save(fn)


def _patch_named_data_files():
    _require_mmengine()
    from mmengine.dataset import BaseDataset

    from .datafaults import name_unreadable_files
    fn = getattr(BaseDataset, 'prepare_data', None)
    if fn is None:
        raise _Skip('mmengine BaseDataset has no prepare_data')
    if getattr(fn, '__wrapped__', None) is None:
        BaseDataset.prepare_data = name_unreadable_files(fn)


#: name -> patch, in the order they are applied (see the module docstring for why each exists)
PATCHES = {
    'numpy_globals': _patch_numpy_globals,
    'history_buffer': _patch_history_buffer,
    'atomic_checkpoint': _patch_atomic_checkpoint,
    'rotate_after_save': _patch_rotate_after_save,
    'named_data_files': _patch_named_data_files,
}


def _skip(name: str, reason: str) -> None:
    STATUS[name] = reason
    warnings.warn(f'mmlinattn: not applying the {name} fix: {reason}. Checkpoints may need '
                  f'mmengine {"/".join(SUPPORTED_MMENGINE)}.x to load weights-only or save '
                  'atomically.',
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
