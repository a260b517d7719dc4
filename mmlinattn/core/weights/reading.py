"""Reading the authors' checkpoints (and our own) safely.

The InLine release stores ``{'model', 'optimizer', 'lr_scheduler', 'max_accuracy', 'epoch',
'config'}`` where ``config`` is a yacs ``CfgNode``; the MALA release stores ``{'model', 'model_ema',
'optimizer', 'lr_scheduler', 'epoch', 'scaler', 'max_accuracy', 'args'}`` with ``args`` an
``argparse.Namespace``. Both are read with ``torch.load(weights_only=True)``: the foreign objects
are rebuilt as inert stand-ins (no yacs needed, no pickled code run). Only if that fails and the
caller explicitly allows it is a full unpickle used, and the log says so.
"""
import codecs
import logging
import os
import os.path as osp
import pickle
from collections import OrderedDict
from typing import Dict, Optional

import torch

from .allowlist import (
    numpy_allowed,
    numpy_global_names,
    runner_allowed,
    runner_allowlist_supported,
)
from .errors import CheckpointError
from .urls import _discard, is_url, local_checkpoint

Tensor = torch.Tensor


class ForeignObject(dict):
    """Inert stand-in for a non-weight object pickled in a checkpoint (a yacs CfgNode, a
    Namespace...).

    It keeps whatever the pickle hands it as plain data and runs no code of its own.
    ``foreign_name`` says which global it replaced.
    """
    foreign_name = '?'

    def __init__(self, *args, **kwargs):
        super().__init__()
        if args or kwargs:
            self['__args__'] = (args, kwargs)

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.update(state)
        else:
            self['__state__'] = state

    def __reduce__(self):  # saved again as a plain dict
        return (dict, (dict(self),))

    def __repr__(self):
        return f'<{self.foreign_name} (inert stand-in)> {dict.__repr__(self)}'


def _stand_in(qualname: str) -> type:
    return type(qualname.rsplit('.', 1)[-1], (ForeignObject,), {'foreign_name': qualname})


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals of torch's weights-only allow-list (tensor/storage rebuilding,
    containers) and numpy data types; every other global becomes an inert :class:`ForeignObject`
    subclass, so no code from the file can run."""

    def find_class(self, module, name):
        key = f'{module}.{name}'
        allowed = _allowed_globals()
        if key in allowed:
            return allowed[key]
        self.replaced.add(key)
        return _stand_in(key)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replaced = set()
        _RestrictedUnpickler.last_replaced = self.replaced


class _RestrictedPickleModule:
    __name__ = 'mmlinattn_restricted_pickle'
    Unpickler = _RestrictedUnpickler

    @staticmethod
    def load(f, **kwargs):
        return _RestrictedUnpickler(f, **kwargs).load()


def _allowed_globals() -> dict:
    from torch import _weights_only_unpickler as wou
    allowed = dict(wou._get_allowed_globals())
    allowed.update(numpy_global_names())  # numpy 1.x and 2.x names both
    # bytes in a protocol-2 pickle (numpy arrays' raw data): torch >= 2.4 allows it, 2.1 does not
    allowed.setdefault('_codecs.encode', codecs.encode)
    allowed['copyreg._reconstructor'] = _safe_reconstructor
    return allowed


def load_runner_checkpoint(path: str, map_location='cpu') -> dict:
    """A Runner checkpoint (``--resume``, ``load_from``, tools/test.py) read with torch's
    weights-only loader, never a full unpickle: besides torch's own types, numpy's data types, and
    what mmengine 0.10 pickles when ``mmlinattn.upstream_fixes`` was not applied (mmdet's / mmseg's
    own tools): the ``HistoryBuffer`` class and ``getattr`` limited to that class's own functions
    (:func:`mmlinattn.core.weights.allowlist.runner_allowed`, for this load only). Where torch has
    no allow-list (before 2.4; mmengine loads with a full unpickle there) the restricted reader of
    :func:`read_checkpoint` reads it instead. :class:`CheckpointError` names the file when it does
    not read."""
    if not runner_allowlist_supported():
        return read_checkpoint(path, map_location=map_location)
    with runner_allowed():  # our allow-list outside the try: an error of ours is no file's fault
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except Exception as err:  # the file's bytes decide the type: see below
            msg = str(err).strip().splitlines()
            raise CheckpointError(
                f'{path} is not a readable Runner checkpoint ({type(err).__name__}: '
                f'{msg[0][:200] if msg else ""})') from err


# Why the readers here catch ``Exception`` around ``torch.load`` (and only around it): the bytes of
# the file decide what the unpickler does, so a damaged or foreign file raises any type - a
# truncated zip RuntimeError, an empty file EOFError, garbage KeyError (weights-only) or
# UnpicklingError, an allowed global called with the file's own arguments TypeError or ValueError.
# Each is reported as a CheckpointError naming the file, the error's type and its message; our own
# code (the allow-lists) runs outside these ``try`` blocks.


class CheckpointContents:
    """A checkpoint file's contents from one read, with the file's size and modification time at
    that read, so that whoever needs the file next in the same run takes them instead of reading it
    again (:meth:`matches` says whether the file is still the one that was read).

    ``runner_readable``: read the way mmengine's Runner reads a checkpoint
    (:func:`load_runner_checkpoint`, on the CPU), so the contents may stand in for the Runner's own
    read; ``False`` when only :func:`read_checkpoint`'s restricted reader could read it (inert
    stand-ins for foreign objects), for checks only."""

    def __init__(self, path: str, obj, runner_readable: bool = True, stat=None):
        self.path, self.obj, self.runner_readable = path, obj, runner_readable
        self.stat = stat if stat is not None else _file_stamp(path)

    def matches(self, path) -> bool:
        """``path`` names the file these contents were read from, unchanged since (size and
        modification time)."""
        if not isinstance(path, (str, os.PathLike)) or not osp.isfile(path):
            return False
        same = osp.realpath(os.fspath(path)) == osp.realpath(self.path)
        return same and self.stat is not None and _file_stamp(path) == self.stat

    def __repr__(self):
        return (f'CheckpointContents({self.path!r}, runner_readable={self.runner_readable}, '
                f'{len(self.obj) if isinstance(self.obj, dict) else "?"} top-level keys)')


def _file_stamp(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def read_contents(path: str, *, foreign: bool = False,
                  logger: Optional[logging.Logger] = None) -> CheckpointContents:
    """Read the local file ``path`` once, on the CPU, the Runner's way
    (:func:`load_runner_checkpoint`); with ``foreign=True`` a file that way refuses is read by
    :func:`read_checkpoint`'s restricted reader instead (foreign objects as inert stand-ins;
    ``runner_readable=False``). :class:`CheckpointError` names a file that does not read. The
    file's size and modification time are taken before the read. Where torch has no allow-list
    (< 2.4: :func:`load_runner_checkpoint` is :func:`read_checkpoint`, and mmengine unpickles in
    full) the contents are for checks only (``runner_readable=False``)."""
    logger = logger or logging.getLogger('mmlinattn')
    if not osp.isfile(path):
        raise CheckpointError(f'checkpoint file not found: {path}')
    stamp = _file_stamp(path)
    if not runner_allowlist_supported():
        return CheckpointContents(path, read_checkpoint(path, logger=logger), False, stamp)
    try:
        return CheckpointContents(path, load_runner_checkpoint(path), True, stamp)
    except CheckpointError:
        if not foreign:
            raise
    # read_checkpoint's weights-only step allows less than load_runner_checkpoint: skipped
    return CheckpointContents(path, _read_restricted(path, 'cpu', False, logger), False, stamp)


def _safe_reconstructor(cls, base, state):
    """``copyreg._reconstructor`` limited to stand-ins built on object/dict/list."""
    if not (isinstance(cls, type) and issubclass(cls, ForeignObject)):
        raise pickle.UnpicklingError(f'refusing to rebuild {cls!r}')
    return cls()


def read_checkpoint(path: str, map_location='cpu', allow_unsafe: bool = False,
                    logger: Optional[logging.Logger] = None) -> dict:
    """Load a checkpoint file without running code from it; :class:`CheckpointError` names the path.

    1. ``torch.load(weights_only=True)`` (with numpy data types allowed for this load only);
    2. if the file also pickles foreign objects (the InLine release's yacs ``CfgNode``, the MALA
       release's ``argparse.Namespace``), a restricted unpickler replaces them with inert
       :class:`ForeignObject` stand-ins - no yacs needed, nothing executed - and says so in the log;
    3. only with ``allow_unsafe=True`` (files you trust) a full unpickle, logged as a warning.

    An http(s) URL is first fetched once into torch's hub cache (:func:`local_checkpoint`) and the
    cached file read the same way; a cached file that does not read is removed and the error names
    the URL, the cached path and the reason.
    """
    logger = logger or logging.getLogger('mmlinattn')
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(f'checkpoint must be a file path, got {type(path).__name__}')
    path = os.fspath(path)
    if is_url(path):
        local = local_checkpoint(path, logger=logger)
        try:
            return read_checkpoint(local, map_location, allow_unsafe, logger)
        except CheckpointError as err:
            _discard(path, local, err)
    if not osp.isfile(path):
        raise CheckpointError(f'checkpoint file not found: {path}')
    with numpy_allowed():  # for this load only: the process's allow-list is left as it was
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except Exception:  # not weights-only: the next reader's error is reported
            pass
    return _read_restricted(path, map_location, allow_unsafe, logger)


def _read_restricted(path: str, map_location, allow_unsafe: bool, logger: logging.Logger):
    """Steps 2 and 3 of :func:`read_checkpoint` (the restricted unpickler; a full unpickle only with
    ``allow_unsafe``), for a local file the weights-only loader refused."""
    try:
        obj = torch.load(path, map_location=map_location, weights_only=False,
                         pickle_module=_RestrictedPickleModule)
    except Exception as err:  # any type (see above), reported with its type
        restricted_err = err
    else:
        replaced = sorted(getattr(_RestrictedUnpickler, 'last_replaced', ()))
        logger.info(f'{path}: holds non-weight objects ({", ".join(replaced) or "?"}); read with a '
                    'restricted unpickler that replaces them by inert stand-ins (no code executed)')
        return obj
    if allow_unsafe:
        logger.warning(f'{path}: safe loading failed ({type(restricted_err).__name__}); falling '
                       'back to a FULL unpickle because allow_unsafe=True')
        return torch.load(path, map_location=map_location, weights_only=False)
    msg = str(restricted_err).strip().splitlines()
    raise CheckpointError(
        f'{path} is not a readable torch checkpoint ({type(restricted_err).__name__}: '
        f'{msg[0][:200] if msg else ""}). A truncated download or a non-checkpoint file gives this '
        'error: re-download it. Only for a file from a source you trust, allow_unsafe=True permits '
        'a full unpickle.') from restricted_err


def extract_state_dict(obj, use_ema: bool = False, path: str = '<checkpoint>') -> Dict[str, Tensor]:
    """Pick the weights out of a checkpoint dict: ``model_ema`` (if asked) / ``model`` /
    ``state_dict`` / the dict itself; strip ``module.`` prefixes."""
    if not isinstance(obj, dict):
        raise CheckpointError(f'{path} holds a {type(obj).__name__}, not a checkpoint dict')
    if use_ema:
        if 'model_ema' not in obj:
            raise CheckpointError(f'{path} has no "model_ema" (keys: {sorted(obj)[:10]}); '
                                  'set use_ema=False')
        sd = obj['model_ema']
    elif 'model' in obj and isinstance(obj['model'], dict):
        sd = obj['model']
    elif 'state_dict' in obj and isinstance(obj['state_dict'], dict):
        sd = obj['state_dict']
    else:
        sd = obj
    if isinstance(sd, dict) and 'module' in sd and isinstance(sd['module'], dict):
        sd = sd['module']
    tensors = OrderedDict()
    for k, v in sd.items():
        if isinstance(v, Tensor):
            tensors[k[7:] if k.startswith('module.') else k] = v
    if not tensors:
        raise CheckpointError(f'{path} contains no tensors (top-level keys: {sorted(obj)[:10]})')
    return tensors
