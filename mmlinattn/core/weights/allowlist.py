"""What a weights-only load may resolve besides torch's own allow-list: numpy's data types under
numpy 1's and 2's names, allowed for one load by :func:`numpy_allowed`, which then restores torch's
allow-list as it was (torch's ``safe_globals`` context would drop entries allowed before)."""
import contextlib

import numpy as np
import torch

#: where numpy defines the functions its pickles name: numpy 1.x and numpy 2.x
_NUMPY_MULTIARRAY_MODULES = ('numpy.core.multiarray', 'numpy._core.multiarray')


def numpy_global_names() -> dict:
    """The numpy globals a weights-only load may resolve, ``'module.name' -> object``, under numpy
    1's and 2's module names (a file written under either loads under the other)."""
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
    """:func:`numpy_global_names` as ``(object, 'module.name')`` pairs for ``add_safe_globals``."""
    return [(obj, name) for name, obj in numpy_global_names().items()]


def runner_allowlist_supported() -> bool:
    ser = torch.serialization
    return all(hasattr(ser, f) for f in ('add_safe_globals', 'get_safe_globals',
                                         'clear_safe_globals'))


@contextlib.contextmanager
def _allowed(entries):
    """``entries`` added to torch's allow-list inside the block, the list as before afterwards."""
    ser = torch.serialization
    if not runner_allowlist_supported():
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
    """``getattr`` for a function of mmengine's ``HistoryBuffer`` only (what its pickling names)."""
    import pickle

    from mmengine.logging.history_buffer import HistoryBuffer
    if obj is HistoryBuffer and callable(vars(HistoryBuffer).get(name)):
        return getattr(obj, name)
    raise pickle.UnpicklingError(f'refusing getattr({obj!r}, {name!r}) in a checkpoint')


def runner_allowed():
    """numpy's data types, ``HistoryBuffer`` and its ``getattr`` allowed inside the block."""
    from mmengine.logging.history_buffer import HistoryBuffer
    return _allowed(numpy_safe_globals() + [HistoryBuffer,
                                            (history_buffer_getattr, 'builtins.getattr')])


def numpy_allowed():
    """numpy's data types allowed for the weights-only loads inside the block (torch >= 2.4)."""
    return _allowed(numpy_safe_globals())


def default_load_reads(obj) -> bool:
    """Whether ``torch.load`` without ``weights_only`` (as mmengine calls it) reads ``obj`` back."""
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


_HINTED = []


def hint_upstream_fixes() -> None:
    """Once per process, where a model of ours is built without :mod:`mmlinattn.upstream_fixes`
    imported (a user's config whose ``custom_imports`` names ``mmlinattn`` only) on a torch that
    loads weights-only by default: one warning, before the run writes its first checkpoint, that
    ``--resume`` and a test of those checkpoints will fail (mmengine 0.10's ``HistoryBuffer`` in
    them) and what to add. ``MMLINATTN_UPSTREAM_FIXES=0`` (the fixes off on purpose): silent."""
    import os
    import sys
    if _HINTED or 'mmlinattn.upstream_fixes' in sys.modules or \
            os.environ.get('MMLINATTN_UPSTREAM_FIXES', '').strip().lower() in (
                '0', 'off', 'false', 'no'):
        return
    _HINTED.append(True)
    if not default_load_reads({'probe': _Probe()}):  # torch loads weights-only by default
        from mmengine.logging import MMLogger
        MMLogger.get_current_instance().warning(
            f'torch {torch.__version__} loads checkpoints weights-only by default, and '
            "mmengine's checkpoints of this run will not load back (--resume, test.py: "
            "UnpicklingError on mmengine's HistoryBuffer): add 'mmlinattn.upstream_fixes' to the "
            "config's custom_imports, e.g. custom_imports = dict(imports=['mmlinattn', "
            "'mmlinattn.upstream_fixes'], allow_failed_imports=False)")


class _Probe:
    """A class no weights-only allow-list has."""
