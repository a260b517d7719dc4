"""Writing files safely, probing whether a folder can be written and reading a work dir's
``last_checkpoint``: the lowest layer of the checkpoint and work-dir code of the package
(``mmlinattn.training``, ``mmlinattn.core.weights``) and the tools, importing nothing of
mmlinattn."""
import io
import os
import os.path as osp
import shutil
import tempfile
from typing import Callable, Optional

__all__ = ['CheckpointWriteError', 'write_atomic', 'checkpoint_write_error', 'last_checkpoint',
           'nearest_existing', 'probe_writable']

#: the file mmengine's Runner names the newest checkpoint in (one path, in the work dir)
POINTER = 'last_checkpoint'


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permissions); the previous one is kept. An
    ``OSError`` (what the failed write raised), with ``exit_code`` 2 for tools/train.py."""
    exit_code = 2


def write_atomic(path: str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` to a temporary file next to ``path``, then rename it to ``path``: a reader
    never sees a half-written file, and an interrupted write leaves the old ``path`` (if any) as it
    was."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    tmp = f'{path}.tmp-{os.getpid()}'
    try:
        write(tmp)
        _fsync(tmp)  # on disk before it takes the name: a crash leaves the old or the new file
        os.replace(tmp, path)
        _fsync(osp.dirname(osp.abspath(path)), directory=True)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)


def nearest_existing(path: str) -> str:
    """``path`` if it exists, else the nearest folder above it that does (the root at worst); it
    may be a file, which the caller refuses."""
    while not osp.exists(path) and osp.dirname(path) != path:
        path = osp.dirname(path)
    return path


def probe_writable(folder: str, prefix: str, file: bool = False) -> None:
    """Create a folder (``file``: a file) named ``prefix...`` in ``folder`` and remove it at once;
    the ``OSError`` of a folder that cannot be written goes through (a read-only file system, no
    permission, a full disk: root passes permission bits, not a read-only file system)."""
    if file:
        fd, probe = tempfile.mkstemp(prefix=prefix, dir=folder)
        os.close(fd)
        os.remove(probe)
    else:
        os.rmdir(tempfile.mkdtemp(prefix=prefix, dir=folder))


def _fsync(path: str, directory: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, 'O_DIRECTORY', 0) if directory else 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot (some network mounts): the rename still holds
        pass
    finally:
        os.close(fd)


def checkpoint_write_error(checkpoint, filename: str, error: OSError) -> CheckpointWriteError:
    """The one-line error for a checkpoint that could not be written: the folder, the bytes the
    checkpoint needs and the bytes free there."""
    import torch
    folder = osp.dirname(osp.abspath(filename))
    try:
        with io.BytesIO() as buf:
            torch.save(checkpoint, buf)
            needed = f'{buf.tell():,} bytes'
    except Exception as e:  # only the size in the message of the write error being
        # reported: whatever torch.save raises (an object that does not pickle: PicklingError,
        # TypeError, AttributeError) must not replace that error, so it is named in it instead
        needed = f'unknown bytes: it does not serialise, {type(e).__name__}: {str(e)[:120]}'
    try:
        free = f'{shutil.disk_usage(folder).free:,} bytes free'
    except OSError:
        free = 'free space unknown'
    reason = error.strerror or str(error)
    return CheckpointWriteError(
        f'could not write checkpoint {osp.basename(filename)} in work dir {folder}: {reason} '
        f'(needs {needed}, {free}). The previous checkpoint is kept and last_checkpoint still '
        'names it; free space (or fix the permissions) and continue with --resume.')


def last_checkpoint(work_dir: str, must_exist: bool = True) -> Optional[str]:
    """The checkpoint a work dir's ``last_checkpoint`` names (a relative name is taken inside
    ``work_dir``), or ``None`` without one; with ``must_exist`` also ``None`` when that file is
    gone."""
    pointer = osp.join(work_dir or '', POINTER)
    if not osp.isfile(pointer):
        return None
    with open(pointer) as f:
        named = f.read().strip()
    if not named:
        return None
    if not osp.isabs(named) and not osp.isfile(named):
        named = osp.join(work_dir, osp.basename(named))
    return named if (osp.isfile(named) or not must_exist) else None
