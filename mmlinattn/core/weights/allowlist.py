"""What a weights-only load of a checkpoint may resolve besides torch's own allow-list: numpy's
data types under numpy 1's and numpy 2's names, and :func:`numpy_allowed`, which allows them for
one load and then restores torch's allow-list exactly as it was (torch's ``safe_globals`` context
removes its entries on exit even where they had been allowed before)."""
import contextlib

import numpy as np
import torch

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


def _allowlist_api() -> bool:
    ser = torch.serialization
    return all(hasattr(ser, f) for f in ('add_safe_globals', 'get_safe_globals',
                                         'clear_safe_globals'))


runner_allowlist_supported = _allowlist_api


@contextlib.contextmanager
def _allowed(entries):
    """``entries`` added to torch's allow-list inside the block; afterwards the list is the one
    before, entry for entry (torch's own ``safe_globals`` context would drop entries that were
    there before it)."""
    ser = torch.serialization
    if not _allowlist_api():
        yield
        return
    before = list(ser.get_safe_globals())
    ser.add_safe_globals(list(entries))
    try:
        yield
    finally:
        ser.clear_safe_globals()
        if before:
            ser.add_safe_globals(before)


def history_buffer_getattr(obj, name, *default):
    """``getattr`` as a Runner checkpoint may use it: only for a function of mmengine's
    ``HistoryBuffer`` class (what its unpatched pickling names), anything else refused."""
    import pickle

    from mmengine.logging.history_buffer import HistoryBuffer
    if obj is HistoryBuffer and callable(vars(HistoryBuffer).get(name)):
        return getattr(obj, name)
    raise pickle.UnpicklingError(f'refusing getattr({obj!r}, {name!r}) in a checkpoint')


def runner_allowed():
    """numpy's data types, mmengine's ``HistoryBuffer`` and :func:`history_buffer_getattr` (as
    ``builtins.getattr``) allowed for the weights-only loads inside the block."""
    from mmengine.logging.history_buffer import HistoryBuffer
    return _allowed(numpy_safe_globals() + [HistoryBuffer,
                                            (history_buffer_getattr, 'builtins.getattr')])


@contextlib.contextmanager
def numpy_allowed():
    """numpy's data types allowed for the weights-only loads inside the block (where torch has an
    allow-list, 2.4 and later); afterwards the allow-list is the one before, entry for entry."""
    with _allowed(numpy_safe_globals()):
        yield


def default_load_reads(obj) -> bool:
    """Whether ``torch.load`` called without ``weights_only`` (as mmengine's checkpoint loader
    calls it) reads ``obj`` back: saved to an in-memory file and loaded, so the answer is this
    torch's default and its allow-list as they are now."""
    import io
    import pickle
    import warnings
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    try:
        with warnings.catch_warnings():  # torch 2.4 / 2.5 warn that the default will change
            warnings.simplefilter('ignore', FutureWarning)
            torch.load(buf, map_location='cpu')
    except pickle.UnpicklingError:
        return False
    return True
