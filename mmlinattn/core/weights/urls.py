"""Checkpoints given as http(s) URLs: fetched once into a cache keyed by the URL, checked, then read
like local files. ``import mmlinattn`` registers its reader (:mod:`.reading`) in mmengine's
``CheckpointLoader`` for the hosts of the authors' files (:data:`HOSTS`), so mmengine's own
``Pretrained`` init and ``load_from`` read their URLs this way too; other URLs stay mmengine's.

* an authors' URL whose file ``checkpoints/<local name>`` is in the working directory (what
  ``python -m mmlinattn.core.weights.download`` saves) reads that file: nothing is fetched;
* ``MMLINATTN_CHECKPOINT_BASE_URL=URL``: every URL is fetched as ``URL/<name>`` (:func:`source_url`,
  :func:`mirror_name`); the cache stays keyed by the URL the config names;
* ``HF_ENDPOINT=URL``: a ``https://huggingface.co/...`` URL is fetched from ``URL/...``;
* ``HF_HUB_OFFLINE=1``: a Hugging Face URL is read from the cache only.

The download is torch's (``torch.hub.download_url_to_file``, as mmengine's ``load_from_http``), by
local rank 0 first; a failed one says why in one line: HTTP 404, another status, no connection, a
cut-off transfer, an HTML page, a hash that differs from the file name's.
"""
import hashlib
import http.client
import logging
import os
import os.path as osp
import re
from typing import Callable, Dict, Optional, Tuple
from urllib.parse import urlparse

from .errors import CheckpointError

#: the hosts of the authors' files (:mod:`mmlinattn.core.families`): mmengine's loader for them
HOSTS = ('https://huggingface.co/', 'https://cloud.tsinghua.edu.cn/')
#: the command that saves the authors' files into ``checkpoints/`` (from any folder)
DOWNLOAD_COMMAND = 'python -m mmlinattn.core.weights.download'


def is_url(path) -> bool:
    """An http(s) URL (besides a local path, what checkpoint settings take)."""
    return isinstance(path, str) and path.startswith(('http://', 'https://'))


#: torch hub's ``name-<sha256 prefix>.ext`` (8+ hex digits, a letter among them: not a date)
_HASH_NAME = re.compile(r'-((?=[0-9]*[a-f])[a-f0-9]{8,})\.')


def url_file_name(url: str) -> str:
    """The last part of ``url``'s path (TsinghuaCloud's ``f/<id>/``: ``<id>.pth``)."""
    parsed = urlparse(url)
    name = osp.basename(parsed.path)
    if not name:
        parts = [p for p in parsed.path.split('/') if p]
        name = (parts[-1] if parts else parsed.netloc) + '.pth'
    return name


def url_hash_prefix(url: str) -> Optional[str]:
    """The sha256 prefix a torch-hub style name carries (``resnet18-f37072fd.pth``), else None."""
    found = _HASH_NAME.search(url_file_name(url))
    return found.group(1) if found else None


def url_cache_path(url: str) -> str:
    """Where :func:`local_checkpoint` keeps ``url``'s file: a torch-hub style ``name-<sha256
    prefix>`` as torch keeps it, any other in ``checkpoints/mmlinattn-urls/<URL's hash>/NAME``."""
    import torch.hub
    name = url_file_name(url)
    root = osp.join(torch.hub.get_dir(), 'checkpoints')
    if url_hash_prefix(url):
        return osp.join(root, name)
    key = hashlib.sha256(url.encode('utf-8')).hexdigest()[:16]
    return osp.join(root, 'mmlinattn-urls', key, name)


def file_sha256(path: str) -> str:
    """The sha256 hex digest of the file at ``path`` (read 1 MiB at a time)."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def _url_hint(url: str) -> str:
    """How to get the file itself from a link that gives a web page."""
    if 'cloud.tsinghua.edu.cn' in url and 'dl=1' not in url:
        return ' A TsinghuaCloud share link gives the file only with "?dl=1" at its end.'
    if 'huggingface.co' in url and ('/tree/' in url or '/blob/' in url):
        return ' A Hugging Face file is served under /resolve/<revision>/, not /tree/ or /blob/.'
    return ' The link may have expired or point at a web page instead of the file.'


def checkpoint_file_problem(path: str, url: str = '') -> Optional[str]:
    """Why ``path`` cannot be a torch checkpoint (HTML, truncated zip, ...; with ``url``: a sha256
    that differs from the one its torch-hub style name promises), or None."""
    import zipfile
    size = osp.getsize(path)
    with open(path, 'rb') as f:
        head = f.read(512)
    text = head.lstrip().lower()
    if text.startswith((b'<!doctype html', b'<html', b'<?xml', b'<head', b'<body')) or \
            b'<html' in text[:256]:
        return f'it is an HTML page ({size} bytes), not a checkpoint'
    prefix = url_hash_prefix(url) if url else None
    actual = file_sha256(path)[:len(prefix)] if prefix else None
    if actual != prefix:
        return (f'its sha256 is {actual}..., but the file name promises {prefix}... (a changed or '
                'corrupted file)')
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


def _discard(url: str, local: str, err):
    """Remove a cached download that is no checkpoint, and raise."""
    try:
        os.remove(local)
    except FileNotFoundError:  # another rank removed it first
        pass
    raise CheckpointError(
        f'{url}: the downloaded file (cached at {local}) is not a readable checkpoint: {err}. The '
        f'cached file was removed; the next use downloads it again.{_url_hint(url)}') from None


BASE_URL_ENV = 'MMLINATTN_CHECKPOINT_BASE_URL'
HF_ENDPOINT_ENV = 'HF_ENDPOINT'
HF_OFFLINE_ENV = 'HF_HUB_OFFLINE'
_HF = 'https://huggingface.co'


def _setting(name: str) -> Optional[str]:
    """The URL variable ``name`` or None; a bad value: :class:`CheckpointError`."""
    from .. import settings
    try:
        return settings.get(name)
    except settings.SettingError as e:
        raise CheckpointError(str(e)) from None


#: URL -> local name and download key (``InLine_PVT_T``) of the authors' files (filled by
#: :func:`mmlinattn.core.families.authors_checkpoints`)
AUTHORS_NAMES: Dict[str, str] = {}
AUTHORS_KEYS: Dict[str, str] = {}


def mirror_name(url: str) -> str:
    """The path a mirror serves ``url`` under: an authors' file's name, else ``host/path``."""
    if url in AUTHORS_NAMES:
        return AUTHORS_NAMES[url]
    parsed = urlparse(url)
    parts = [parsed.netloc] + [p for p in parsed.path.split('/') if p]
    if parsed.path.endswith('/') or len(parts) == 1:  # TsinghuaCloud's f/<id>/: <id>.pth
        parts = (parts[:-1] if len(parts) > 1 else parts) + [url_file_name(url)]
    return '/'.join(parts)


def source_url(url: str, base_url: Optional[str] = None) -> str:
    """Where ``url``'s file is fetched from: ``base_url`` (or the base-URL setting) + ``/`` +
    :func:`mirror_name`; a huggingface.co URL under ``HF_ENDPOINT``; else ``url``."""
    base = base_url.rstrip('/') if base_url else _setting(BASE_URL_ENV)
    if base:
        return f'{base}/{mirror_name(url)}'
    endpoint = _setting(HF_ENDPOINT_ENV) if url.startswith(_HF + '/') else None
    if endpoint:
        return endpoint + url[len(_HF):]
    return url


#: the folder the zoo configs' ``init_cfg`` name the authors' files in, relative to the working
#: directory (``checkpoints/MAViT_T.pth``: where :data:`DOWNLOAD_COMMAND` saves them)
CHECKPOINTS_DIR = 'checkpoints'


def local_checkpoint(path: str, logger: Optional[logging.Logger] = None,
                     progress: bool = True) -> str:
    """``path``, or an http(s) URL's file: an authors' file saved in ``checkpoints/``, else the
    cache's (:func:`url_cache_path`), fetched from :func:`source_url` by local rank 0 if needed; a
    bad download is removed (:class:`CheckpointError`)."""
    if not is_url(path):
        return path
    logger = logger or logging.getLogger('mmlinattn')
    saved = path in AUTHORS_NAMES and osp.join(CHECKPOINTS_DIR, AUTHORS_NAMES[path])
    if saved and osp.isfile(saved):
        logger.info(f'{path}: reading {saved} from the working directory {os.getcwd()}')
        return saved
    source, cached = source_url(path), url_cache_path(path)
    offline = os.environ.get(HF_OFFLINE_ENV, '').strip()
    if path.startswith(_HF + '/') and offline.lower() in ('1', 'on', 'yes', 'true') and \
            not _setting(BASE_URL_ENV) and not osp.isfile(cached):
        reason = (f'{HF_OFFLINE_ENV}={offline} is set (Hugging Face offline mode), so nothing is '
                  f"downloaded, and the file is not in torch's ({cached}) cache")
        raise DownloadError(f'{path}: {reason}. Unset {HF_OFFLINE_ENV} to download it once, or '
                            'point the config at a local copy of the file', url=path, reason=reason)

    def fetch():
        _download(source, cached, logger, progress, path)
        problem = checkpoint_file_problem(cached, path)
        if problem:
            _discard(path, cached, problem)

    _rank0_first(lambda: osp.isfile(cached) or fetch())
    if not osp.isfile(cached):  # another node's rank 0 fetched it; this node's failed to
        raise CheckpointError(f'{path}: not downloaded (expected at {cached})')
    problem = checkpoint_file_problem(cached)
    if problem:
        _discard(path, cached, problem)
    return cached


def _rank0_first(fetch: Callable) -> None:
    """``fetch()`` on local rank 0, the others waiting; its error is raised after the barrier."""
    import torch.distributed as dist
    group = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    failed = None
    if not group or int(os.environ.get('LOCAL_RANK', dist.get_rank())) == 0:
        try:
            fetch()
        except CheckpointError as e:  # the other ranks must not hang
            failed = e
    if group:
        dist.barrier()
    if failed is not None:
        raise failed


def _download(url: str, dst: str, logger: logging.Logger, progress: bool = True,
              named: Optional[str] = None) -> None:
    """``torch.hub.download_url_to_file`` into ``dst``; ``named``: the URL ``url`` mirrors."""
    import torch.hub
    os.makedirs(osp.dirname(dst) or '.', exist_ok=True)
    mirror = f' (mirror of {named})' if named and named != url else ''
    logger.info(f'downloading {url}{mirror} to {dst}')
    try:
        torch.hub.download_url_to_file(url, dst, progress=progress)
    except (OSError, http.client.HTTPException, ValueError) as e:
        # HTTP errors and refused connections (OSError), short reads (IncompleteRead), bad URLs
        if osp.exists(dst):
            os.remove(dst)
        folder = osp.dirname(dst)
        if osp.basename(osp.dirname(folder)) == 'mmlinattn-urls':
            try:  # the URL's own folder, made above: no empty folder stays behind
                os.rmdir(folder)
            except OSError:  # not empty, or another process removed it
                pass
        reason, hint = download_failure(e, url, named)
        raise DownloadError(f'{url}{mirror}: {reason}; nothing was saved to {dst}.{hint}',
                            url=url, reason=reason) from None


class DownloadError(CheckpointError):
    """A download that failed: ``url`` (what was requested) and ``reason`` (why, in words)."""

    def __init__(self, message: str, url: str = '', reason: str = ''):
        super().__init__(message)
        self.url, self.reason = url, reason


def download_failure(err: Exception, url: str, named: Optional[str] = None) -> Tuple[str, str]:
    """Why fetching ``url`` raised ``err`` and what to do (a sentence with a leading space)."""
    import socket
    import urllib.error
    mirrored = bool(named) and named != url
    if isinstance(err, urllib.error.HTTPError):
        status = f'HTTP {err.code} {err.reason}'.strip()
        if err.code == 404:
            hint = (' The mirror does not serve this file under that path: put the file there.'
                    if mirrored else _url_hint(named or url))
            return f'not found at that URL ({status})', hint
        return f'the server answered {status}', _url_hint(named or url)
    reason = getattr(err, 'reason', None) if isinstance(err, urllib.error.URLError) else err
    if isinstance(reason, (ConnectionError, TimeoutError, socket.timeout, socket.gaierror)) or \
            isinstance(err, urllib.error.URLError):
        host = urlparse(url).netloc or url
        return (f'cannot connect to {host} ({" ".join(str(reason).split())[:150]})',
                ' Check the network (or the proxy); on a machine without one, copy the file here '
                'and point the config at it, or serve it from a mirror '
                f'({BASE_URL_ENV} or {HF_ENDPOINT_ENV}).')
    if isinstance(err, http.client.HTTPException):
        return (f'the transfer broke off ({type(err).__name__}: {str(err).strip()[:150]})',
                ' Try again.')
    # an OSError here is this machine's (the cache's disk full or not writable): no link hint
    return (f'{type(err).__name__}: {str(err).strip()[:200]}',
            '' if isinstance(err, OSError) else _url_hint(named or url))


#: (missing path, working directory) pairs whose replacement URL was logged in this process
_FALLBACK_LOGGED = set()


def authors_url(path: str) -> Optional[str]:
    """The URL of the authors' file a relative ``checkpoints/<name>`` names, else None."""
    if not isinstance(path, str) or osp.isabs(path) or \
            osp.normpath(osp.dirname(path)) != CHECKPOINTS_DIR:
        return None
    return next((url for url, local in AUTHORS_NAMES.items() if local == osp.basename(path)), None)


def _use_line(name: str) -> str:
    return f'--cfg-options model.backbone.init_cfg.checkpoint=/path/to/{name}'


def backbone_checkpoint(path, logger: Optional[logging.Logger] = None) -> str:
    """Where a backbone's ``init_cfg`` file is read from: ``path`` if a URL or a file; for a missing
    ``checkpoints/<name>`` of the authors', its URL (logged once); else :class:`CheckpointError`."""
    if not isinstance(path, (str, os.PathLike)):
        return path  # the reader names the type
    path = os.fspath(path)
    if is_url(path) or osp.isfile(path):
        return path
    url = authors_url(path)
    if url is None:
        raise CheckpointError(
            f'checkpoint file not found: {path} (looked in the working directory {os.getcwd()}); '
            f'give its path: {_use_line(osp.basename(path) or "FILE")}')
    key = (path, os.getcwd())
    if key not in _FALLBACK_LOGGED:
        _FALLBACK_LOGGED.add(key)
        (logger or logging.getLogger('mmlinattn')).info(
            f'{path} does not exist in the working directory {os.getcwd()}: loading the authors\' '
            f'file {url} instead (downloaded once, then read from the cache)')
    return url


def authors_download_error(path: str, url: str, err: 'DownloadError') -> CheckpointError:
    """The error for a missing ``checkpoints/<name>`` whose authors' URL could not be fetched."""
    name = osp.basename(path)
    return CheckpointError(
        f'{path} does not exist in the working directory {os.getcwd()}, and the authors\' file it '
        f'names could not be fetched from {err.url or url}: {err.reason or err}. Download it where '
        f'there is a network with `{DOWNLOAD_COMMAND} --only '
        f'{AUTHORS_KEYS.get(url, osp.splitext(name)[0])}` (it writes {CHECKPOINTS_DIR}/{name}; run '
        f'it in this directory or copy the file here), or point the config at a copy: '
        f'{_use_line(name)}')
