"""Tools run in subprocesses, and the metrics mmengine records for them.

tools/demo.py and the tests start tools/train.py and tools/test.py as a user does, each in its own
process (mmengine's logger, visualizer and message hub are process-wide), with
:func:`run_script`. The metrics are then read
from what mmengine writes into the work dir, not from the log text (:func:`read_metrics`):

- a training run: the LoggerHook passes every training log and every validation result to the
  visualizer, whose ``LocalVisBackend`` appends them, one JSON object per line, to
  ``<work_dir>/<timestamp>/vis_data/scalars.json``. A validation's line holds its metrics (``mIoU``,
  ``coco/bbox_mAP``, ``accuracy/top1``, ...) with ``data_time``, ``time`` and ``step``; a training
  line holds ``lr`` and ``loss``.
- a test run: mmengine's LoggerHook writes no scalars for it (``after_test_epoch`` does not call the
  visualizer); it dumps the test metrics, as one JSON object, to
  ``<work_dir>/<timestamp>/<timestamp>.json``. That file is read rather than what tools/test.py
  prints: it is mmengine's own record, unrounded, and independent of any tool's output format. Under
  DDP, mmengine 0.10 writes it from every rank (same metrics, only ``time`` / ``data_time`` differ),
  so a shorter copy may land over a longer one; the first complete JSON object in it is read.

Before a tool builds its Runner, :func:`check_work_dir` makes sure the work dir can be written (one
line naming it and why, instead of mmengine's ``OSError`` traceback from the Runner).
"""
import contextlib
import errno
import json
import os
import os.path as osp
import re
import subprocess
import sys
from typing import List, Sequence

__all__ = ['ToolFailed', 'run_script', 'read_scalars', 'read_metrics', 'check_work_dir']

_RUN_FOLDER = re.compile(r'^\d{8}_\d{6}$')  # mmengine's timestamp, one folder per run
_NOT_METRICS = ('step', 'time', 'data_time', 'memory')


class ToolFailed(SystemExit):
    """A script run by :func:`run_script` failed; the message names the command and ends with the
    end of its output. A ``SystemExit``: a tool that lets it through stops with that message."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


def _short(arg: str, cwd: str) -> str:
    return osp.relpath(arg, cwd) if arg.startswith(cwd + os.sep) else arg


def run_script(script: str, args: Sequence = (), *, cwd: str = None, log: str = None,
               echo: Sequence[str] = (), show: bool = True, check: bool = True,
               tail: int = 40) -> subprocess.CompletedProcess:
    """Run ``python script *args`` (this interpreter) in ``cwd`` and return the finished process;
    its ``stdout`` holds stdout and stderr together, in the order they came.

    ``show`` prints the command first (``$ ...``, paths under ``cwd`` relative to it); output lines
    that contain one of the strings in ``echo`` are printed as they come (indented, cut at 200
    characters); ``log`` (a file path) receives the whole output. With ``check``, a non-zero exit
    raises :class:`ToolFailed` with the command, the exit code and the last ``tail`` lines.
    """
    cwd = osp.abspath(cwd or os.getcwd())
    cmd = [sys.executable, str(script)] + [str(a) for a in args]
    shown = ' '.join(_short(c, cwd) for c in cmd)
    if show:
        print('$ ' + shown, flush=True)
    if log:
        os.makedirs(osp.dirname(osp.abspath(log)), exist_ok=True)
    lines = []
    env = dict(os.environ, PYTHONUNBUFFERED='1')  # the two streams interleave in time order
    with open(log, 'w') if log else contextlib.nullcontext() as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            lines.append(line)
            if f:
                f.write(line)
            if any(k in line for k in echo):
                print('   ' + line.rstrip()[:200], flush=True)
        returncode = proc.wait()
    if check and returncode != 0:
        where = f' (full log: {log})' if log else ''
        raise ToolFailed(f'{shown}\nfailed with exit code {returncode}; the end of its '
                         f'output{where}:\n'
                         + ''.join(lines[-tail:]), returncode)
    return subprocess.CompletedProcess(cmd, returncode, ''.join(lines))


def _last_run(work_dir: str) -> str:
    """The folder of the latest mmengine run in ``work_dir`` (``<work_dir>/<timestamp>``)."""
    runs = sorted(d for d in os.listdir(work_dir) if _RUN_FOLDER.match(d)
                  and osp.isdir(osp.join(work_dir, d))) if osp.isdir(work_dir) else []
    if not runs:
        raise FileNotFoundError(f'{work_dir}: no mmengine run in it (no <timestamp>/ folder)')
    return osp.join(work_dir, runs[-1])


def read_scalars(work_dir: str) -> List[dict]:
    """Every record of the latest run's ``vis_data/scalars.json`` in ``work_dir``, in order
    (training logs and validation results; an empty list if the run logged none)."""
    path = osp.join(_last_run(work_dir), 'vis_data', 'scalars.json')
    if not osp.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_metrics(work_dir: str) -> dict:
    """The metrics of the latest run in ``work_dir``: a test run's, or a training run's last
    validation (``{}`` if it ran none), e.g. ``{'mIoU': 71.5, 'aAcc': 90.1, ...}``. Bookkeeping
    entries (``step``, ``time``, ``data_time``, ``memory``) are left out."""
    run = _last_run(work_dir)
    test = osp.join(run, osp.basename(run) + '.json')
    if osp.isfile(test):
        with open(test) as f:
            record = json.JSONDecoder().raw_decode(f.read())[0]  # (see the module's docstring)
    else:
        evals = [r for r in read_scalars(work_dir) if 'loss' not in r and 'lr' not in r]
        record = evals[-1] if evals else {}
    return {k: v for k, v in record.items() if k not in _NOT_METRICS}


def check_work_dir(work_dir: str) -> None:
    """Make sure a run can write ``work_dir`` (tools/train.py and tools/test.py call it before the
    Runner, which would create it and fail with an ``OSError`` traceback).

    The nearest part of the path that exists must be a directory (not a file: ``ENOTDIR``), and a
    folder must be creatable in it (the work dir itself when it exists); that probe folder is
    removed at once. A read-only file system (``EROFS``), missing permissions (``EACCES``,
    ``EPERM``; root passes most permission bits, not a read-only file system) or a full disk all
    give a :class:`ConfigError` (exit code 2 in the tools) naming the work dir, the folder tried and
    the reason.
    """
    from .config import ConfigError
    from .fileio import nearest_existing, probe_writable
    path = osp.abspath(work_dir)
    existing = nearest_existing(path)
    hint = '; pass --work-dir with a folder you can write'
    if not osp.isdir(existing):
        raise ConfigError(f'work dir {work_dir} cannot be created: {existing} is a file, not a '
                          f'directory ({os.strerror(errno.ENOTDIR)}){hint}')
    try:
        probe_writable(existing, '.write-test-')
    except OSError as e:
        where = 'in it' if existing == path else f'in {existing}'
        raise ConfigError(f'work dir {work_dir} is not writable: {e.strerror or e} (could not '
                          f'create a folder {where}){hint}') from None
