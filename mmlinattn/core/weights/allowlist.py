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


def runner_reads_its_checkpoints() -> bool:
    """Whether ``torch.load`` as mmengine's checkpoint loader calls it (no ``weights_only``) reads
    what mmengine's Runner writes into a checkpoint: a message hub's ``HistoryBuffer`` holding numpy
    histories, and a numpy scalar. False on torch >= 2.6 without :mod:`mmlinattn.upstream_fixes`
    (or ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``)."""
    from mmengine.logging.history_buffer import HistoryBuffer
    hub = HistoryBuffer()
    hub.update(1.0)
    return default_load_reads({'message_hub': {'loss': hub}, 'meta': {'lr': np.float64(0.1)}})


def _building_runner():
    """The mmengine ``Runner`` whose ``__init__`` is on the call stack (building its model), or
    None. mmengine is not imported here: no Runner can exist without it."""
    import sys
    module = sys.modules.get('mmengine.runner.runner')
    if module is None:
        return None
    code = module.Runner.__init__.__code__
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return None if frame is None else frame.f_locals.get('self')


#: >0 while a Runner is built by a set-up that loads Runner checkpoints itself (our tools':
#: tools/workshop/apis/runner.py), where :func:`check_runner_can_load` has nothing to say
_OWN_LOADER = [0]


@contextlib.contextmanager
def own_loader():
    """Inside the block, a Runner being built loads its checkpoints through a loader that reads
    the Runner's checkpoints on any torch (our tools' set-up): :func:`check_runner_can_load` stays
    silent."""
    _OWN_LOADER[0] += 1
    try:
        yield
    finally:
        _OWN_LOADER[0] -= 1


def check_runner_can_load(owner: str) -> None:
    """Called where a backbone is built. Inside an mmengine Runner (mmdet's / mmseg's /
    mmpretrain's own tools) on a torch whose loader refuses the Runner's own checkpoints - a config
    that imports ``mmlinattn`` but not its fixes, on torch >= 2.6 - one warning line, before any
    data is read, names what to add to ``custom_imports``: resuming, or testing / loading a
    checkpoint a Runner wrote, would otherwise stop later in torch's unpickler with ``Unsupported
    global``. Not an error: a checkpoint without the Runner's state (a converted or published
    file, a URL) loads all the same. Outside a Runner, under our tools (which read such files
    themselves) and where the loads work, it does nothing."""
    if _OWN_LOADER[0]:
        return
    runner = _building_runner()
    if runner is None or runner_reads_its_checkpoints():
        return
    import sys
    if 'mmlinattn.upstream_fixes' in sys.modules:
        what = ('mmlinattn.upstream_fixes is imported but did not apply its fixes here '
                '(MMLINATTN_UPSTREAM_FIXES, or an mmengine outside 0.10.x): set '
                'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 to load them')
    else:
        what = ("the config imports mmlinattn without its fixes: add 'mmlinattn.upstream_fixes' to "
                "custom_imports['imports']")
    from mmengine.logging import print_log
    print_log(f'{owner}: torch {torch.__version__} loads checkpoints weights-only and mmengine '
              "calls torch.load without weights_only, so checkpoints holding a Runner's state "
              '(numpy scalars, HistoryBuffer) will not load in this run (--resume, load_from, '
              f'test.py) and this run\'s will not resume or test; {what}',
              logger='current', level=30)
