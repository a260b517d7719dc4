"""One run per work dir at a time.

mmengine names a run's log folder by its start time and writes checkpoints, ``last_checkpoint`` and
the dumped config under fixed names, so two trainings started into one work dir (a re-submitted
job, a teammate, a scheduler retry) share a log folder and overwrite each other's checkpoints
without a word. ``tools/train.py`` takes this lock before any work (``tools/test.py`` does not: it
writes no checkpoint, and testing a checkpoint of a training under way is common):

* ``WORK_DIR/.mmlinattn-run.lock`` holds the owner's host, pid, process start time and command,
  created with ``O_EXCL`` (one winner when two start together);
* a second run finding a live owner stops in one line (:class:`WorkDirBusy`, exit code 2) naming
  the work dir and the owner;
* a lock whose owner is gone never blocks: on the same host the pid is checked (and its start
  time, so a reused pid is not taken for the owner); from another host (a shared file system, where
  a pid means nothing) the owner refreshes the file's time every :data:`HEARTBEAT_S` seconds and a
  lock older than :func:`stale_after_s` has expired;
* the lock is removed when the run ends, however it ends short of SIGKILL (then it is stale).

The ranks of one DDP run are one run: only the process of global rank 0 takes the lock.

Why not a lock library (``filelock``, ``fcntl.flock``): an advisory ``flock`` is not shared
between the nodes of many network file systems (NFS without a lock daemon, Lustre mounted without
``flock``), where two nodes' runs into one work dir are the case to catch; it cannot name the run
that holds it (host, pid, command), which the message needs; and a lock left by a node that died
must expire by age, which only a file with a refreshed time tells.
"""
import atexit
import json
import os
import os.path as osp
import socket
import sys
import threading
import time
from typing import Optional

from .config import ConfigError

LOCK_NAME = '.mmlinattn-run.lock'
#: how often the owner refreshes the lock's time (seconds)
HEARTBEAT_S = 30.0


def stale_after_s() -> float:
    """A lock from another host not refreshed for this long (seconds) has expired:
    ``MMLINATTN_LOCK_STALE_S`` (:mod:`mmlinattn.core.settings`; default 600)."""
    from mmlinattn.core import settings
    return settings.get('MMLINATTN_LOCK_STALE_S')


class WorkDirBusy(ConfigError):
    """Another run is alive in the work dir; the message names it (exit code 2 in the tools)."""


def _start_time(pid: int) -> Optional[str]:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat), None where unknown."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: Optional[str]) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    now = _start_time(pid)
    return started is None or now is None or now == started


def _read(path: str) -> Optional[dict]:
    """The lock's contents, or None unless it is a dict with a positive int pid (garbage, or a
    file being written this instant, is judged by its age instead)."""
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    pid = info.get('pid') if isinstance(info, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    return info


def owner_alive(info: Optional[dict], path: str) -> bool:
    """Whether the run that wrote lock ``path`` (``info``: its contents) is still alive."""
    if info is None:  # unreadable: being written this instant, or garbage; judge by its age
        try:
            return time.time() - os.path.getmtime(path) < 5
        except OSError:
            return False
    if info.get('host') == socket.gethostname():
        return _alive(info['pid'], info.get('started'))
    try:
        return time.time() - os.path.getmtime(path) < stale_after_s()
    except OSError:
        return False


class WorkDirLock:
    """The lock of one run; :meth:`release` (also at interpreter exit) removes it."""

    def __init__(self, path: str, made_dir: bool = False):
        self.path, self.made_dir = path, made_dir
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True,
                                      name='mmlinattn-workdir-lock')
        self._beat.start()
        atexit.register(self.release)

    def _heartbeat(self):
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                return

    def release(self):
        if self._stop.is_set():
            return
        self._stop.set()
        info = _read(self.path)
        if info and info.get('pid') == os.getpid() and info.get('host') == socket.gethostname():
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
            if self.made_dir:  # a run that stopped before any work leaves no empty work dir
                try:
                    os.rmdir(osp.dirname(self.path))
                except OSError:  # not empty: the run wrote something
                    pass


def _took_over(work_dir: str, info: Optional[dict], refreshed: float, logger=None) -> None:
    """Once this run holds the lock it took over from a run that is gone: remove the temporary
    checkpoint files that run was writing (``NAME.tmp-<its pid>``,
    :func:`mmlinattn.training.fileio.write_atomic`) and say both in one line. From another host
    (whose pid may be a live process here too) only files not written since its lock's last
    refresh (``refreshed``) are taken for its."""
    info = info if isinstance(info, dict) else {}
    removed, size = [], 0
    pid = info.get('pid')
    same_host = info.get('host') == socket.gethostname()
    if isinstance(pid, int):
        for name in os.listdir(work_dir):
            full = osp.join(work_dir, name)
            try:
                if not name.endswith(f'.tmp-{pid}') or \
                        (not same_host and osp.getmtime(full) > refreshed):
                    continue
                size += osp.getsize(full)
                os.remove(full)
                removed.append(name)
            except OSError:
                pass
    who = (f"pid {pid} on host {info.get('host')}, started {info.get('since')}"
           if info else 'a run that left an unreadable lock')
    what = (f'; removed the {len(removed)} unfinished checkpoint file(s) it was writing '
            f'({", ".join(removed)}: {size / 2**20:.1f} MiB)' if removed else '')
    message = f'{work_dir}: took over the run lock of a run that is gone ({who}){what}'
    if logger is not None:
        logger.warning(message)
    else:
        print(message, file=sys.stderr, flush=True)


def _global_rank() -> int:
    for var in ('RANK', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK'):
        if os.environ.get(var, '').isdigit():
            return int(os.environ[var])
    return 0


def lock_work_dir(work_dir: str, logger=None) -> Optional[WorkDirLock]:
    """Take ``work_dir``'s run lock for this process (rank 0 only; other ranks get None), or raise
    :class:`WorkDirBusy` naming the live owner. A stale lock (its owner gone) is taken over."""
    if _global_rank() != 0:
        return None
    made_dir = not osp.isdir(work_dir)
    taken = None  # (info, last refresh) of a dead run's lock taken over
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, LOCK_NAME)
    me = dict(host=socket.gethostname(), pid=os.getpid(), started=_start_time(os.getpid()),
              since=time.strftime('%Y-%m-%d %H:%M:%S'), command=' '.join(sys.argv)[:300])
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            info = _read(path)
            mine = bool(info) and info.get('pid') == os.getpid() and \
                info.get('host') == me['host']  # an earlier run of this process (a notebook)
            if not mine and owner_alive(info, path):
                who = (f"pid {info.get('pid')} on host {info.get('host')}, running since "
                       f"{info.get('since')}: {info.get('command')}") if info else 'a run starting'
                raise WorkDirBusy(
                    f'work dir {work_dir} is in use by another run ({who}). Two runs in one work '
                    'dir share its log folder and overwrite each other\'s checkpoints: wait for '
                    'that run to end, or give this one another --work-dir') from None
            # take the stale lock away atomically: of two runs doing this at once, one renames
            # it and the other finds it gone (or finds the winner's fresh lock on its next try)
            try:
                stale_mtime = os.path.getmtime(path)
            except OSError:
                continue
            stale = f'{path}.stale-{os.getpid()}'
            try:
                os.rename(path, stale)
            except FileNotFoundError:
                continue
            if _read(stale) != info:  # renamed a lock taken meanwhile by another run: put it back
                try:
                    os.link(stale, path)
                except FileExistsError:
                    pass
                os.remove(stale)
                continue
            os.remove(stale)
            if not mine:
                taken = (info, stale_mtime)
            continue
        with os.fdopen(fd, 'w') as f:
            json.dump(me, f)
        lock = WorkDirLock(path, made_dir)
        if taken is not None:  # the lock is ours now: no other run writes in this work dir
            _took_over(work_dir, *taken, logger=logger)
        return lock
    raise WorkDirBusy(f'work dir {work_dir}: could not take its run lock {path} (another run keeps '
                      'taking it); try again')
