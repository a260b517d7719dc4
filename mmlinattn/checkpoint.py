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

from .fileio import last_checkpoint, write_atomic  # noqa: F401 (write_atomic re-exported)

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
    from .compat import numpy_global_names
    allowed = dict(wou._get_allowed_globals())
    allowed.update(numpy_global_names())  # numpy 1.x and 2.x names both
    allowed['copyreg._reconstructor'] = _safe_reconstructor
    return allowed


def _safe_reconstructor(cls, base, state):
    """``copyreg._reconstructor`` limited to stand-ins built on object/dict/list."""
    if not (isinstance(cls, type) and issubclass(cls, ForeignObject)):
        raise pickle.UnpicklingError(f'refusing to rebuild {cls!r}')
    return cls()


# --------------------------------------------------------------------------------------------------
# Checkpoints given as http(s) URLs: fetched once into torch's hub cache, then read like local files
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AuthorsCheckpoint:
    """One ImageNet file the authors publish: where their README links it and the name our configs
    give it under ``checkpoints/``."""
    url: str
    filename: str
    family: str
    arch: str


_TSINGHUA = 'https://cloud.tsinghua.edu.cn/f/{}/?dl=1'  # the share page's direct-download form
_MALA_HUB = 'https://huggingface.co/aldjalkdf/MAViT/resolve/main/{}'  # the file, not the tree page

#: The authors' ImageNet checkpoints, by backbone name: the InLine README (LeapLabTHU/InLine) links
#: TsinghuaCloud share pages, whose file is served with ``?dl=1`` (without it, an HTML page); the
#: MALA README (qhfan/MALA) links the Hugging Face repository ``aldjalkdf/MAViT``, whose files are
#: served under ``resolve/main/`` (``tree/main`` and ``blob/main`` are HTML pages). ``filename`` is
#: the name the configs' ``init_cfg`` use under ``checkpoints/``.
AUTHORS_CHECKPOINTS: Dict[str, AuthorsCheckpoint] = OrderedDict(
    (name, AuthorsCheckpoint(url, filename, family, arch))
    for name, url, filename, family, arch in (
        ('InLine_PVT_T', _TSINGHUA.format('90ac52b1555b401eb5e6'), 'inline_pvt_t.pth', 'inline_pvt', 'tiny'),
        ('InLine_PVT_S', _TSINGHUA.format('1ab953b2479d433080a3'), 'inline_pvt_s.pth', 'inline_pvt', 'small'),
        ('InLine_PVT_M', _TSINGHUA.format('a72aec31e6084bc0a280'), 'inline_pvt_m.pth', 'inline_pvt', 'medium'),
        ('InLine_PVT_L', _TSINGHUA.format('efd91318ba964f01b288'), 'inline_pvt_l.pth', 'inline_pvt', 'large'),
        ('InLine_Swin_T', _TSINGHUA.format('32810869fcc34410966b'), 'inline_swin_t.pth', 'inline_swin', 'tiny'),
        ('InLine_Swin_S', _TSINGHUA.format('e9657fd247c04c7cb1a1'), 'inline_swin_s.pth', 'inline_swin', 'small'),
        ('InLine_Swin_B', _TSINGHUA.format('bf23564bb64c420aafe1'), 'inline_swin_b.pth', 'inline_swin', 'base'),
        ('MAViT_T', _MALA_HUB.format('MAViT_T.pth'), 'MAViT_T.pth', 'mavit', 'tiny'),
        ('MAViT_S', _MALA_HUB.format('MAViT_S.pth'), 'MAViT_S.pth', 'mavit', 'small'),
        ('MAViT_B', _MALA_HUB.format('MAViT_B.pth'), 'MAViT_B.pth', 'mavit', 'base'),
        ('MAViT_L', _MALA_HUB.format('MAViT_L.pth'), 'MAViT_L.pth', 'mavit', 'large'),
    ))


def is_url(path) -> bool:
    """An http(s) URL (what ``init_cfg.checkpoint``, ``load_from`` and the tools' CHECKPOINT take
    besides a local path)."""
    return isinstance(path, str) and path.startswith(('http://', 'https://'))


def url_cache_path(url: str) -> str:
    """Where :func:`local_checkpoint` keeps ``url``: ``torch.hub.get_dir()/checkpoints/NAME``, NAME the
    last part of the URL's path as torch's ``load_state_dict_from_url`` and mmengine's
    ``load_from_http`` name it (so a file either of them fetched is reused). A path ending in ``/``
    (TsinghuaCloud's ``f/<id>/?dl=1``) is named after its last folder, with ``.pth`` added."""
    from urllib.parse import urlparse

    import torch.hub
    parsed = urlparse(url)
    name = osp.basename(parsed.path)
    if not name:
        parts = [p for p in parsed.path.split('/') if p]
        name = (parts[-1] if parts else parsed.netloc) + '.pth'
    return osp.join(torch.hub.get_dir(), 'checkpoints', name)


def _url_hint(url: str) -> str:
    """How to get the file itself from a link that gives a web page."""
    if 'cloud.tsinghua.edu.cn' in url and 'dl=1' not in url:
        return ' A TsinghuaCloud share link gives the file only with "?dl=1" at its end.'
    if 'huggingface.co' in url and ('/tree/' in url or '/blob/' in url):
        return ' A Hugging Face file is served under /resolve/<revision>/, not /tree/ or /blob/.'
    return ' The link may have expired or point at a web page instead of the file.'


def checkpoint_file_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be a torch checkpoint, from its first bytes and (zip format) its central
    directory, without unpickling anything; ``None`` when it looks like one. Catches what expired
    cloud links return (an HTML page) and interrupted downloads (a truncated zip)."""
    import zipfile
    size = osp.getsize(path)
    with open(path, 'rb') as f:
        head = f.read(512)
    text = head.lstrip().lower()
    if text.startswith((b'<!doctype html', b'<html', b'<?xml', b'<head', b'<body')) or \
            b'<html' in text[:256]:
        return f'it is an HTML page ({size} bytes), not a checkpoint'
    if head.startswith(b'PK'):
        try:
            with zipfile.ZipFile(path) as z:
                z.infolist()
        except (zipfile.BadZipFile, OSError) as e:
            return f'it is truncated or corrupt ({size} bytes; zip: {e})'
        return None
    if head[:1] == b'\x80':  # torch's legacy (pre-1.6) format starts with a pickle protocol byte
        return None
    if size == 0:
        return 'it is empty (0 bytes)'
    return f'it is not a torch checkpoint ({size} bytes, starts with {head[:16]!r})'


def _discard(url: str, local: str, err: Exception):
    """Remove a cached download that is no checkpoint, and raise the error naming all three."""
    try:
        os.remove(local)
    except FileNotFoundError:  # another rank removed it first
        pass
    raise CheckpointError(
        f'{url}: the downloaded file (cached at {local}) is not a readable checkpoint: {err}. The '
        f'cached file was removed; the next use downloads it again.{_url_hint(url)}') from None


def local_checkpoint(path: str, logger: Optional[logging.Logger] = None,
                     progress: bool = True) -> str:
    """A local path for ``path``: itself, or for an http(s) URL the file in torch's hub cache
    (:func:`url_cache_path`), downloaded by ``torch.hub.download_url_to_file`` (with a progress bar)
    when not cached yet. The file is checked (:func:`checkpoint_file_problem`); an HTML page or a
    truncated file is removed and :class:`CheckpointError` names the URL, the cached path and the
    reason. Under an initialised process group, local rank 0 downloads while the other ranks wait."""
    if not is_url(path):
        return path
    logger = logger or logging.getLogger('mmlinattn')
    cached = url_cache_path(path)
    rank, world = _local_rank_and_world()
    failed = None
    if rank == 0 and not osp.isfile(cached):
        try:
            _download(path, cached, logger, progress)
        except CheckpointError as e:  # raised after the barrier: the other ranks must not hang
            failed = e
    if world > 1:
        import torch.distributed as dist
        dist.barrier()
    if failed is not None:
        raise failed
    if not osp.isfile(cached):  # another node's rank 0 fetched it; this node's failed to
        raise CheckpointError(f'{path}: not downloaded (expected at {cached})')
    problem = checkpoint_file_problem(cached)
    if problem:
        _discard(path, cached, problem)
    return cached


def _local_rank_and_world() -> Tuple[int, int]:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return int(os.environ.get('LOCAL_RANK', dist.get_rank())), dist.get_world_size()
    return 0, 1


def _download(url: str, dst: str, logger: logging.Logger, progress: bool = True) -> None:
    """``torch.hub.download_url_to_file`` into ``dst`` (it writes a temporary file and renames it, so
    an interrupted download leaves nothing under ``dst``); errors name the URL and ``dst``."""
    import torch.hub
    os.makedirs(osp.dirname(dst), exist_ok=True)
    logger.info(f'downloading {url} to {dst}')
    try:
        torch.hub.download_url_to_file(url, dst, progress=progress)
    except Exception as e:  # noqa: BLE001 - HTTP errors, refused connections, short reads
        if osp.exists(dst):
            os.remove(dst)
        raise CheckpointError(f'{url}: download to {dst} failed ({type(e).__name__}: '
                              f'{str(e).strip()[:200]}).{_url_hint(url)}') from None


def read_checkpoint(path: str, map_location='cpu', allow_unsafe: bool = False,
                    logger: Optional[logging.Logger] = None) -> dict:
    """Load a checkpoint file without running code from it; :class:`CheckpointError` names the path.

    1. ``torch.load(weights_only=True)`` (with numpy data types allowed);
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
                   path: str = '<checkpoint>', logger: Optional[logging.Logger] = None,
                   check_only: bool = False) -> Dict[str, List[str]]:
    """Load ``state`` into ``model`` with an exact report (``check_only=True``: the same checks and
    report, nothing loaded - the pre-flight of a backbone ``init_cfg``, see
    :mod:`mmlinattn.apis.preflight.checkpoints`).

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
    if check_only:
        return dict(loaded=list(to_load), dropped=dropped, ignored=ignored, new=new)
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
    named = last_checkpoint(work_dir, must_exist=False)
    if named:
        candidates.append(named)
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
