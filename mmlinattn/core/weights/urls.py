"""Checkpoints given as http(s) URLs: fetched once into a cache keyed by the URL, checked, then read
like local files. Mirrors, for machines that cannot reach the hosts a config names:

* ``MMLINATTN_CHECKPOINT_BASE_URL=URL``: every URL is fetched as ``URL/<name>`` (:func:`source_url`,
  :func:`mirror_name`); the cache stays keyed by the URL the config names.
* ``HF_ENDPOINT=URL``: a ``https://huggingface.co/...`` URL is fetched from ``URL/...``.
* With ``huggingface_hub`` installed (no base URL), a ``huggingface.co/.../resolve/...`` URL is
  fetched by its ``hf_hub_download``; where that fails (a static mirror), directly.
* ``HF_HUB_OFFLINE=1``: a Hugging Face URL is read from a cache only.

A failed download says why: HTTP 404, another status, no connection, a cut-off transfer.
"""
import hashlib
import http.client
import logging
import os
import os.path as osp
import re
from typing import Callable, Dict, Optional, Tuple
from urllib.parse import unquote, urlparse

from .errors import CheckpointError


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


#: files whose hash was checked in this process: path -> (size, mtime_ns)
_HASH_CHECKED: Dict[str, Tuple[int, int]] = {}


def _hash_problem(url: str, path: str) -> Optional[str]:
    """For a torch-hub style name: why the file is not the one its name promises, or None."""
    prefix = url_hash_prefix(url)
    if not prefix:
        return None
    st = os.stat(path)
    if _HASH_CHECKED.get(path) == (st.st_size, st.st_mtime_ns):
        return None
    actual = file_sha256(path)
    if not actual.startswith(prefix):
        return (f'its sha256 is {actual[:len(prefix)]}..., but the file name promises '
                f'{prefix}... (a changed or corrupted file)')
    _HASH_CHECKED[path] = (st.st_size, st.st_mtime_ns)
    return None


def _url_hint(url: str) -> str:
    """How to get the file itself from a link that gives a web page."""
    if 'cloud.tsinghua.edu.cn' in url and 'dl=1' not in url:
        return ' A TsinghuaCloud share link gives the file only with "?dl=1" at its end.'
    if 'huggingface.co' in url and ('/tree/' in url or '/blob/' in url):
        return ' A Hugging Face file is served under /resolve/<revision>/, not /tree/ or /blob/.'
    return ' The link may have expired or point at a web page instead of the file.'


def checkpoint_file_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be a torch checkpoint (HTML, truncated zip, ...), or None."""
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


def _discard(url: str, local: str, err, paths=()):
    """Remove a cached download (``paths``, default ``local``) that is no checkpoint, and raise."""
    for p in paths or (local,):
        try:
            os.remove(p)
        except FileNotFoundError:  # another rank removed it first
            pass
    raise CheckpointError(
        f'{url}: the downloaded file (cached at {local}) is not a readable checkpoint: {err}. The '
        f'cached file was removed; the next use downloads it again.{_url_hint(url)}') from None


BASE_URL_ENV = 'MMLINATTN_CHECKPOINT_BASE_URL'
_HF = 'https://huggingface.co'
#: ``https://huggingface.co/[datasets/|spaces/]<owner>/<repo>/resolve/<revision>/<file>``
_HF_FILE = re.compile(r'^https://huggingface\.co/(?:(datasets|spaces)/)?([^/?#]+/[^/?#]+)/resolve/'
                      r'([^/?#]+)/([^?#]+)')


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


HF_ENDPOINT_ENV = 'HF_ENDPOINT'
HF_OFFLINE_ENV = 'HF_HUB_OFFLINE'


def hf_offline() -> Optional[str]:
    """``HF_HUB_OFFLINE``'s value when it turns offline mode on (as huggingface_hub reads it)."""
    value = os.environ.get(HF_OFFLINE_ENV, '').strip()
    return value if value.lower() in ('1', 'on', 'yes', 'true') else None


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


def hf_file(url: str) -> Optional[Tuple[str, str, str, str]]:
    """``(repo_id, repo_type, revision, filename)`` of a Hugging Face ``resolve/`` URL, or None."""
    found = _HF_FILE.match(url)
    if not found:
        return None
    kind, repo, revision, filename = found.groups()
    return repo, (kind or 'model').rstrip('s'), unquote(revision), unquote(filename)


def _hf_hub_download() -> Optional[Callable]:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None
    return hf_hub_download


def local_checkpoint(path: str, logger: Optional[logging.Logger] = None,
                     progress: bool = True) -> str:
    """``path``, or an http(s) URL's file in the cache (:func:`url_cache_path`), fetched from
    :func:`source_url` by local rank 0 if needed; a bad file is removed
    (:class:`CheckpointError`)."""
    if not is_url(path):
        return path
    logger = logger or logging.getLogger('mmlinattn')
    source = source_url(path)
    cached = url_cache_path(path)
    # a Hugging Face file not cached by torch's route, and no base-URL mirror
    from_hf = bool(hf_file(path)) and not _setting(BASE_URL_ENV) and not osp.isfile(cached)
    hub = _hf_hub_download() if from_hf else None
    offline = from_hf and hf_offline()
    if offline:  # returns where huggingface_hub has the file: no connection asked for
        _offline_error(path, hub, cached)
    if hub is not None and not offline and not _accepts_connections(source, logger):
        hub = None  # huggingface_hub would retry for half a minute
    if hub is not None:
        try:
            return _hub_checkpoint(path, hub, logger)
        except _HubFailed as e:  # e.g. a static mirror: none of the Hub's headers
            logger.info(f'{e}; fetching {source} directly instead')
    _rank0_first(lambda: osp.isfile(cached) or _download(source, cached, logger, progress, path))
    if not osp.isfile(cached):  # another node's rank 0 fetched it; this node's failed to
        raise CheckpointError(f'{path}: not downloaded (expected at {cached})')
    problem = checkpoint_file_problem(cached) or _hash_problem(path, cached)
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


def _accepts_connections(url: str, logger: logging.Logger, timeout: float = 5.0) -> bool:
    """Whether ``url``'s host takes a TCP connection (True behind a proxy)."""
    import socket
    import urllib.request
    parsed = urlparse(url)
    host = parsed.hostname
    if not host or (urllib.request.getproxies().get(parsed.scheme)
                    and not urllib.request.proxy_bypass(host)):
        return True
    port = parsed.port or (443 if parsed.scheme == 'https' else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        logger.info(f'{host}:{port} takes no connection ({e}): fetching {url} without '
                    'huggingface_hub')
        return False
    return True


class _HubFailed(CheckpointError):
    """``hf_hub_download`` raised: :func:`local_checkpoint` fetches the file directly instead."""


def _offline_error(url: str, hub: Optional[Callable], cached: str) -> None:
    """Under ``HF_HUB_OFFLINE``: return if huggingface_hub has ``url``'s file cached, else raise."""
    if hub is not None:
        repo, kind, revision, filename = hf_file(url)
        try:
            hub(repo_id=repo, filename=filename, revision=revision, repo_type=kind,
                local_files_only=True)
            return
        except Exception:  # not in its cache (its errors have no common base beyond Exception)
            pass
    where = f"torch's ({cached})" + (" nor huggingface_hub's" if hub is not None else '')
    reason = (f'{HF_OFFLINE_ENV}={os.environ.get(HF_OFFLINE_ENV, "").strip()} is set (Hugging Face '
              f'offline mode), so nothing is downloaded, and the file is not in {where} cache')
    raise DownloadError(f'{url}: {reason}. Unset {HF_OFFLINE_ENV} to download it once, or point '
                        'the config at a local copy of the file', url=url, reason=reason)


def _hub_checkpoint(url: str, hf_hub_download: Callable, logger: logging.Logger) -> str:
    """``url``'s file by ``hf_hub_download`` (rank 0 first); :class:`_HubFailed` if it fails."""
    repo, kind, revision, filename = hf_file(url)
    endpoint = _setting(HF_ENDPOINT_ENV) or _HF

    def fetch(local_only=False):
        try:  # the endpoint read now: huggingface_hub reads HF_ENDPOINT once, when imported
            return hf_hub_download(repo_id=repo, filename=filename, revision=revision,
                                   repo_type=kind, endpoint=endpoint,
                                   local_files_only=local_only or bool(hf_offline()))
        except Exception as e:  # huggingface_hub's errors have no common base beyond Exception
            raise _HubFailed(
                f'{url}: huggingface_hub could not fetch it from {endpoint} '
                f'({type(e).__name__}: {" ".join(str(e).split())[:200]})') from None

    logger.info(f'fetching {url} through huggingface_hub ({endpoint})')
    got = []
    _rank0_first(lambda: got.append(fetch()))
    # local rank 0 has it (or raised); the other ranks read the cache it filled, without a request
    local = got[0] if got else fetch(local_only=True)
    problem = checkpoint_file_problem(local)
    if problem:
        blob = osp.realpath(local)
        _discard(url, blob, problem, {local, blob})
    return local


def _download(url: str, dst: str, logger: logging.Logger, progress: bool = True,
              named: Optional[str] = None) -> None:
    """``torch.hub.download_url_to_file`` into ``dst``; ``named``: the URL ``url`` mirrors."""
    import torch.hub
    os.makedirs(osp.dirname(dst), exist_ok=True)
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


#: the folder the zoo configs' ``init_cfg`` name the authors' files in, relative to the working
#: directory (``checkpoints/MAViT_T.pth``: where ``tools/misc/download_checkpoints.py`` saves them)
CHECKPOINTS_DIR = 'checkpoints'
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
        f'there is a network with `python tools/misc/download_checkpoints.py --only '
        f'{AUTHORS_KEYS.get(url, osp.splitext(name)[0])}` (it writes {CHECKPOINTS_DIR}/{name}; run '
        f'it in this directory or copy the file here), or point the config at a copy: '
        f'{_use_line(name)}')
