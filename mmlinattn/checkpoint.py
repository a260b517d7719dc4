"""Reading the authors' checkpoints (and our own) safely, and fitting them to our backbones.

The InLine release stores ``{'model', 'optimizer', 'lr_scheduler', 'max_accuracy', 'epoch', 'config'}``
where ``config`` is a yacs ``CfgNode``; the MALA release stores ``{'model', 'model_ema', 'optimizer',
'lr_scheduler', 'epoch', 'scaler', 'max_accuracy', 'args'}`` with ``args`` an ``argparse.Namespace``.
Both are read with ``torch.load(weights_only=True)``: the foreign objects are rebuilt as inert
stand-ins (no yacs needed, no pickled code run). Only if that fails and the caller explicitly allows it
is a full unpickle used, and the log says so.
"""
import logging
import os
import os.path as osp
import pickle
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable or does not fit the model."""


class ForeignObject(dict):
    """Inert stand-in for a non-weight object pickled in a checkpoint (a yacs CfgNode, a Namespace...).

    It keeps whatever the pickle hands it as plain data and runs no code of its own. ``foreign_name``
    says which global it replaced.
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
    from .compat import numpy_safe_globals
    allowed = dict(wou._get_allowed_globals())
    for obj in numpy_safe_globals():
        name = f'{obj.__module__}.{obj.__qualname__}'
        allowed[name] = obj
        allowed[name.replace('numpy._core', 'numpy.core')] = obj  # pickled under numpy 1.x
    allowed['copyreg._reconstructor'] = _safe_reconstructor
    return allowed


def _safe_reconstructor(cls, base, state):
    """``copyreg._reconstructor`` limited to stand-ins built on object/dict/list."""
    if not (isinstance(cls, type) and issubclass(cls, ForeignObject)):
        raise pickle.UnpicklingError(f'refusing to rebuild {cls!r}')
    return cls()


def read_checkpoint(path: str, map_location='cpu', allow_unsafe: bool = False,
                    logger: Optional[logging.Logger] = None) -> dict:
    """Load a checkpoint file without running code from it; :class:`CheckpointError` names the path.

    1. ``torch.load(weights_only=True)`` (with numpy data types allowed);
    2. if the file also pickles foreign objects (the InLine release's yacs ``CfgNode``, the MALA
       release's ``argparse.Namespace``), a restricted unpickler replaces them with inert
       :class:`ForeignObject` stand-ins - no yacs needed, nothing executed - and says so in the log;
    3. only with ``allow_unsafe=True`` (files you trust) a full unpickle, logged as a warning.
    """
    logger = logger or logging.getLogger('mmlinattn')
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(f'checkpoint must be a file path, got {type(path).__name__}')
    path = os.fspath(path)
    if path.startswith(('http://', 'https://')):
        raise CheckpointError(
            f'{path} is a URL: download it first (see checkpoints/README.md) and point the config at '
            'the local file; nothing is downloaded at run time')
    if not osp.isfile(path):
        raise CheckpointError(f'checkpoint file not found: {path}')
    from . import compat
    compat.apply()  # numpy data types and HistoryBuffer allowed process-wide (idempotent); no
    # `safe_globals` context here: on exit it would remove them again, also for mmengine's loads
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception:  # noqa: BLE001 - not weights-only: try the restricted reader below
        pass
    try:
        obj = torch.load(path, map_location=map_location, weights_only=False,
                         pickle_module=_RestrictedPickleModule)
        replaced = sorted(getattr(_RestrictedUnpickler, 'last_replaced', ()))
        logger.info(f'{path}: holds non-weight objects ({", ".join(replaced) or "?"}); read with a '
                    'restricted unpickler that replaces them by inert stand-ins (no code executed)')
        return obj
    except Exception as err:  # noqa: BLE001
        restricted_err = err
    if allow_unsafe:
        logger.warning(f'{path}: safe loading failed ({type(restricted_err).__name__}); falling back '
                       'to a FULL unpickle because allow_unsafe=True')
        return torch.load(path, map_location=map_location, weights_only=False)
    msg = str(restricted_err).strip().splitlines()
    raise CheckpointError(
        f'{path} is not a readable torch checkpoint ({type(restricted_err).__name__}: '
        f'{msg[0][:200] if msg else ""}). A truncated download or a non-checkpoint file gives this '
        'error: re-download it. Only for a file from a source you trust, allow_unsafe=True permits a '
        'full unpickle.') from restricted_err


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


def resize_pos_embed(pos: Tensor, src_hw: Tuple[int, int], dst_hw: Tuple[int, int]) -> Tensor:
    """Bilinearly resize a (1, H*W, C) position table (align_corners=False, as the authors do)."""
    if tuple(src_hw) == tuple(dst_hw):
        return pos
    c = pos.shape[-1]
    grid = pos.reshape(1, *src_hw, c).permute(0, 3, 1, 2)
    # half-precision tables are resized in float32, float32 and float64 ones in their own dtype
    grid = grid.to(torch.promote_types(grid.dtype, torch.float32))
    grid = F.interpolate(grid, size=tuple(dst_hw), mode='bilinear', align_corners=False)
    return grid.permute(0, 2, 3, 1).reshape(1, dst_hw[0] * dst_hw[1], c).to(pos.dtype)


def _fmt(keys: Sequence[str], limit: int = 12) -> str:
    keys = list(keys)
    more = f' ... (+{len(keys) - limit} more)' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def _misfit(mismatched: List[str], missing: List[str], unexpected: List[str], limit: int) -> str:
    """'N shape mismatch(es): ...; N key(s) missing from the checkpoint: ...; N key(s) not in the
    model: ...' (the non-empty parts: the first ``limit`` mismatches, ``2 * limit`` keys)."""
    parts = []
    for items, what, n in ((mismatched, 'shape mismatch(es)', limit),
                           (missing, 'key(s) missing from the checkpoint', 2 * limit),
                           (unexpected, 'key(s) not in the model', 2 * limit)):
        if items:
            parts.append(f'{len(items)} {what}: {_fmt(items, n)}')
    return '; '.join(parts)


def fit_state_dict(model: torch.nn.Module, state: Dict[str, Tensor], *,
                   drop_prefixes: Iterable[str] = (), tolerated: Iterable[str] = (),
                   new_prefixes: Iterable[str] = (), prefix: str = '',
                   path: str = '<checkpoint>', logger: Optional[logging.Logger] = None
                   ) -> Dict[str, List[str]]:
    """Load ``state`` into ``model`` with an exact report.

    * keys starting with one of ``drop_prefixes`` (classification parts) are dropped and listed;
    * keys whose last name is in ``tolerated`` (buffers such as ``relative_position_index``,
      ``attn_mask``) are ignored when the model has no such entry;
    * model keys starting with ``new_prefixes`` (output norms) may be missing and are listed as new;
    * anything else missing, unexpected or of a different shape raises :class:`CheckpointError` naming
      the first keys and shapes - a checkpoint of another architecture never loads half-way.
    """
    logger = logger or logging.getLogger('mmlinattn')
    if prefix:
        state = OrderedDict((k[len(prefix):], v) for k, v in state.items() if k.startswith(prefix))
        if not state:
            raise CheckpointError(f'{path}: no key starts with prefix {prefix!r}')
    own = model.state_dict()
    tolerated, drop_prefixes, new_prefixes = set(tolerated), tuple(drop_prefixes), tuple(new_prefixes)
    dropped, ignored, unexpected, mismatched = [], [], [], []
    to_load = OrderedDict()
    for k, v in state.items():
        if drop_prefixes and k.startswith(drop_prefixes):
            dropped.append(k)
        elif k not in own:
            (ignored if k.rsplit('.', 1)[-1] in tolerated else unexpected).append(k)
        elif own[k].shape != v.shape:
            mismatched.append(f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}')
        else:
            to_load[k] = v
    missing = [k for k in own if k not in to_load and k.rsplit('.', 1)[-1] not in tolerated]
    new = [k for k in missing if new_prefixes and k.startswith(new_prefixes)]
    missing = [k for k in missing if k not in new]
    if mismatched or unexpected or missing:
        raise CheckpointError(
            f'{path} does not fit {type(model).__name__}'
            f'{" (" + model.arch_name + ")" if hasattr(model, "arch_name") else ""} - is it the '
            f'checkpoint of another architecture/size? ' + _misfit(mismatched, missing, unexpected, 6))
    model.load_state_dict(to_load, strict=False)
    logger.info(f'loaded {len(to_load)} tensors from {path} into {type(model).__name__}')
    if dropped:
        logger.info(f'dropped {len(dropped)} classification keys: {_fmt(dropped, 50)}')
    if ignored:
        logger.info(f'ignored {len(ignored)} recomputed buffers: {_fmt(ignored, 8)}')
    if new:
        logger.info(f'newly initialised (not in the checkpoint): {_fmt(new, 50)}')
    return dict(loaded=list(to_load), dropped=dropped, ignored=ignored, new=new)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model a whole-model checkpoint was saved from: without DDP / TTA wrappers."""
    from mmengine.model import BaseTTAModel, is_model_wrapper
    while is_model_wrapper(model) or isinstance(model, BaseTTAModel):
        model = model.module
    return model


def check_model_checkpoint(model: torch.nn.Module, path: str, *, partial: bool = False,
                           what: str = 'checkpoint', logger: Optional[logging.Logger] = None
                           ) -> Dict[str, List[str]]:
    """Refuse a whole-model checkpoint (``tools/test.py CKPT``, ``load_from``, ``--resume``) that does
    not fit ``model`` before anything is loaded, evaluated or trained.

    mmengine itself loads such files non-strictly: a checkpoint of another architecture or size loads
    the keys that happen to fit, logs the rest and evaluates a half-random model. Here every key of the
    checkpoint must exist in the model with the same shape and every model key must be in the
    checkpoint, else :class:`CheckpointError` names the file and the first offending keys. With
    ``partial=True`` (fine-tuning a detector on other classes) the differences are logged as a warning
    instead and mmengine's non-strict load goes ahead.
    """
    logger = logger or logging.getLogger('mmlinattn')
    state = extract_state_dict(read_checkpoint(path, logger=logger), path=path)
    own = _unwrap(model).state_dict()
    mismatched = [f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}'
                  for k, v in state.items() if k in own and own[k].shape != v.shape]
    unexpected = [k for k in state if k not in own]
    missing = [k for k in own if k not in state]
    report = dict(mismatched=mismatched, unexpected=unexpected, missing=missing)
    if not (mismatched or unexpected or missing):
        return report
    name = type(_unwrap(model)).__name__
    msg = f'{what} {path} does not fit the config\'s model ({name}): ' + \
        _misfit(mismatched, missing, unexpected, 4)
    if partial:
        logger.warning(msg + ' - loading the fitting keys only (partial load requested)')
        return report
    raise CheckpointError(
        msg + '. Is it the checkpoint of another architecture, size or class count? Nothing was '
        'loaded. An ImageNet backbone file goes in model.backbone.init_cfg=dict(type="Pretrained", '
        'checkpoint=...); to fine-tune a whole detector/segmentor on other classes, pass '
        '--partial-load to tools/train.py.')


def latest_intact_checkpoint(work_dir: str, logger: Optional[logging.Logger] = None
                             ) -> Optional[str]:
    """The checkpoint ``--resume`` (auto) should use: the one ``last_checkpoint`` names if it reads,
    else the newest readable ``*.pth`` of ``work_dir`` (with a warning naming each skipped file).

    Returns ``None`` when the work dir holds no checkpoint (a fresh start); raises
    :class:`CheckpointError` listing the files when there are checkpoints but none is readable.
    """
    logger = logger or logging.getLogger('mmlinattn')
    if not osp.isdir(work_dir):
        return None
    candidates = []
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        with open(pointer) as f:
            named = f.read().strip()
        if named:
            candidates.append(named if osp.isabs(named) else osp.join(work_dir, osp.basename(named)))
    files = [osp.join(work_dir, f) for f in os.listdir(work_dir) if f.endswith('.pth')]
    for f in sorted(files, key=lambda p: (osp.getmtime(p), p), reverse=True):
        if not any(osp.realpath(f) == osp.realpath(c) for c in candidates):
            candidates.append(f)
    skipped = []
    for path in candidates:
        if not osp.isfile(path):
            skipped.append(f'{path} (not found)')
            continue
        try:
            obj = read_checkpoint(path, logger=logger)
            extract_state_dict(obj, path=path)
        except CheckpointError:
            skipped.append(f'{path} (unreadable: truncated or corrupt)')
            continue
        if skipped:
            logger.warning('--resume: skipped ' + '; '.join(skipped) +
                           f' - resuming from {path}, the newest intact checkpoint')
        return path
    if skipped:
        raise CheckpointError(
            f'--resume: no intact checkpoint in {work_dir}: ' + '; '.join(skipped) +
            '. Pass one explicitly (--resume PATH) or start without --resume.')
    return None


# --------------------------------------------------------------------------------------------------
# The authors' checkpoint layouts: one pure filter per backbone family
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AuthorsLayout:
    """How a family's released ImageNet checkpoint maps onto our backbone and our mmpretrain
    ImageClassifier. Parameter names are the authors' wherever a checkpoint needs them, so the backbone
    mapping is: drop the classification parts, drop the buffers we recompute, and let ``adapt``
    resize what depends on the input size.

    Args:
        family (str): ``inline_pvt``, ``inline_swin`` or ``mavit`` (the converter's names).
        classification (tuple[str]): key prefixes of the classification parts (head, final norm, ...).
        recomputed (tuple[str]): last key names of the authors' buffers that our model recomputes
            instead of storing (dropped from their files).
        optional (tuple[str]): last key names of our buffers that a file may lack (recomputable).
        classifier (tuple[tuple[str, str]]): authors' prefix -> ImageClassifier prefix for the
            classification parts (every other key goes under ``backbone.``).
        conv_head (bool): the authors' head is a 1x1 conv (4-D weight); mmpretrain's is a Linear.
        adapt (callable | None): ``adapt(state, model) -> state`` for tensors that depend on the
            model's settings (e.g. position tables learned at 224 px); pure, returns a new dict.
    """
    family: str
    classification: Tuple[str, ...]
    recomputed: Tuple[str, ...] = ()
    optional: Tuple[str, ...] = ()
    classifier: Tuple[Tuple[str, str], ...] = (('head.', 'head.fc.'),)
    conv_head: bool = False
    adapt: Optional[Callable] = None

    def filter(self, state: Dict[str, Tensor], model: Optional[torch.nn.Module] = None
               ) -> Tuple[Dict[str, Tensor], Dict[str, List[str]]]:
        """The authors' (or our own backbone's) state dict -> the backbone's: returns the tensors to
        load and ``dict(dropped=[classification keys], ignored=[recomputed buffers])``. Pure: the
        input dict is not changed. ``model`` (for ``adapt``) is only read."""
        out, dropped, ignored = OrderedDict(), [], []
        own = model.state_dict() if model is not None else {}
        for k, v in state.items():
            if k.startswith(self.classification):
                dropped.append(k)
            elif k.rsplit('.', 1)[-1] in self.recomputed and k not in own:
                ignored.append(k)
            else:
                out[k] = v
        if self.adapt is not None and model is not None:
            out = self.adapt(out, model)
        return out, dict(dropped=dropped, ignored=ignored)

    @property
    def tolerated(self) -> Tuple[str, ...]:
        """Buffer names that may be missing on either side of a load."""
        return self.recomputed + self.optional

    def to_classifier(self, state: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The authors' whole classifier -> our mmpretrain ImageClassifier's keys."""
        out = OrderedDict()
        for k, v in state.items():
            if k.rsplit('.', 1)[-1] in self.recomputed:
                continue
            src = next((p for p, _ in self.classifier if k.startswith(p)), None)
            if src is None:
                out['backbone.' + k] = v
                continue
            dst = dict(self.classifier)[src]
            if src == 'head.' and self.conv_head and v.dim() == 4:
                v = v.flatten(1)
            out[dst + k[len(src):]] = v
        return out

    def from_classifier(self, state: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The inverse of :meth:`to_classifier`: our ImageClassifier -> the authors' layout."""
        out = OrderedDict()
        for k, v in state.items():
            dst = next((d for _, d in self.classifier if k.startswith(d)), None)
            if dst is not None:
                src = next(p for p, d in self.classifier if d == dst)
                if src == 'head.' and self.conv_head and v.dim() == 2:
                    v = v[:, :, None, None]
                out[src + k[len(dst):]] = v
            elif k.startswith('backbone.'):
                out[k[len('backbone.'):]] = v
            else:
                raise KeyError(f'{k}: not a key of a {self.family} ImageClassifier built from '
                               'configs/classification')
        return out


def write_atomic(path: str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` to a temporary file next to ``path``, then rename it to ``path``: a reader never
    sees a half-written file, and an interrupted write leaves the old ``path`` (if any) as it was."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    tmp = f'{path}.tmp-{os.getpid()}'
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)
