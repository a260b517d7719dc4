"""Reading checkpoints safely: foreign objects pickled beside the weights (the InLine release's yacs
``CfgNode``, the MALA release's ``argparse.Namespace``) become inert stand-ins; a full unpickle only
when the caller allows it, logged. The readers catch ``Exception`` around ``torch.load`` only (a
damaged file's bytes decide the type) and raise :class:`CheckpointError`."""
import codecs
import logging
import os
import os.path as osp
import pickle
import re
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
from .urls import HOSTS, _discard, is_url, local_checkpoint, url_cache_path

Tensor = torch.Tensor


class ForeignObject(dict):
    """Inert stand-in (plain data, no code) for a foreign object pickled in a checkpoint."""
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
    """Resolves torch's allow-list and numpy's types; other globals: :class:`ForeignObject`."""

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
    """A Runner checkpoint read weights-only with :func:`~.allowlist.runner_allowed` (before torch
    2.4: :func:`read_checkpoint`); :class:`CheckpointError` names a file that does not read."""
    if not runner_allowlist_supported():
        return read_checkpoint(path, map_location=map_location)
    with runner_allowed():  # our allow-list outside the try: an error of ours is no file's fault
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except Exception as err:  # the file's bytes decide the type (module docstring)
            msg = str(err).strip().splitlines()
            raise CheckpointError(
                f'{path} is not a readable Runner checkpoint ({type(err).__name__}: '
                f'{msg[0][:200] if msg else ""})') from err


class CheckpointContents:
    """A checkpoint file's contents from one read and its stamp then (:meth:`matches`), for the next
    user in the run; ``runner_readable``: read as the Runner reads, else for checks only."""

    def __init__(self, path: str, obj, runner_readable: bool = True, stat=None):
        self.path, self.obj, self.runner_readable = path, obj, runner_readable
        self.stat = stat if stat is not None else _file_stamp(path)

    def matches(self, path) -> bool:
        """``path`` is the file these contents were read from, unchanged since."""
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
    """Read ``path`` once as the Runner does (``foreign=True``: else restricted, for checks
    only)."""
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
    """Load a checkpoint file without running code from it: ``torch.load(weights_only=True)`` (numpy
    types allowed), else a restricted unpickler (foreign objects as :class:`ForeignObject`, logged),
    else only with ``allow_unsafe=True`` a full unpickle. A URL is read from the cache
    (:func:`local_checkpoint`); :class:`CheckpointError` names the path."""
    logger = logger or logging.getLogger('mmlinattn')
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(f'checkpoint must be a file path, got {type(path).__name__}')
    path = os.fspath(path)
    if is_url(path):
        local = local_checkpoint(path, logger=logger)
        try:
            return read_checkpoint(local, map_location, allow_unsafe, logger)
        except CheckpointError as err:
            if local != url_cache_path(path):  # the user's checkpoints/<name>: kept
                raise
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
    """Steps 2 and 3 of :func:`read_checkpoint`."""
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
    """The tensors of ``model_ema`` (if asked) / ``model`` / ``state_dict`` / the dict itself."""
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


def load_from_mmlinattn(filename: str, map_location=None):
    """mmengine's ``CheckpointLoader`` loader for the authors' hosts (:data:`.urls.HOSTS`):
    :func:`read_checkpoint` (the file fetched by :func:`local_checkpoint`, read weights-only)."""
    from mmengine.logging import MMLogger
    return read_checkpoint(filename, map_location, logger=MMLogger.get_current_instance())


def _register() -> None:
    """:func:`load_from_mmlinattn` for :data:`.urls.HOSTS`. mmengine tries its prefixes (regular
    expressions) in reverse string order, so one that extends ``https://`` comes before it; every
    other URL stays ``load_from_http``'s."""
    from mmengine.runner.checkpoint import CheckpointLoader
    CheckpointLoader.register_scheme([re.escape(h) for h in HOSTS], load_from_mmlinattn,
                                     force=True)


_register()
