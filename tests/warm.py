"""The tests' tool runs (``python tools/train.py ...``, mmseg's own ``test.py``, ...) in a warm
interpreter: a fork server that has imported torch, mmengine, mmcv, mmdet and mmseg once forks a
fresh process for each run, which then runs the script as ``python script args`` would - its own
process, working directory, environment, ``sys.argv``, ``__main__``, exit code and atexit
handlers - without the 5-10 s of imports each new interpreter pays on the 2-core machine.

What the fork server has imported is only third-party code; mmlinattn and the tools are imported
by each run, so settings read at import time (``MMLINATTN_*``) are read from the run's environment.
A command that is not ``[sys.executable, 'path/to/script.py', ...]``, or a run that must start as
a new interpreter (``fresh=True``: imports under test, signals from outside), goes to
:func:`subprocess.run` instead. ``MMLINATTN_TEST_COLD=1`` sends every run there (to check that a
test does not depend on the warm path).
"""
import ast
import atexit
import gc
import multiprocessing
import os
import os.path as osp
import runpy
import subprocess
import sys
import tempfile
import traceback

#: imported once by the fork server: what every tool of ours and upstream's imports (no thread
#: pool is started by importing them, so a fork of it is as safe as a new interpreter)
PRELOAD = ['torch', 'torchvision', 'cv2', 'matplotlib.pyplot', 'mmengine.runner', 'mmcv.ops',
           'mmcv.transforms', 'mmdet.models', 'mmdet.datasets', 'mmdet.evaluation',
           'mmseg.models', 'mmseg.datasets', 'mmseg.evaluation',
           # the suite's memo of parsed metafiles and config text (tests/upstream_memo.py)
           'upstream_memo']

_context = None
#: sys.path of a new interpreter here without PYTHONPATH (a script's folder goes in front of it)
_base_path = None


def _fork_server():
    global _context, _base_path
    if _context is None:
        env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
        _base_path = subprocess.run(
            [sys.executable, '-c', 'import sys; print(repr(sys.path[1:]))'],
            env=env, capture_output=True, text=True, check=True).stdout
        ctx = multiprocessing.get_context('forkserver')
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
    return _context


def _open(path):
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)


def _child(script, args, cwd, env, out, err, base_path, new_session=False):
    """In the forked process: become ``python script *args`` and exit with its code."""
    # what the fork server imported is never garbage: kept out of the collector's passes (mmengine
    # collects at each dataset's construction, 0.2 s a time over that heap on 2 cores)
    gc.freeze()
    if new_session:
        os.setsid()
    try:  # ended with the fork server, which ends with the test process (Linux: PR_SET_PDEATHSIG)
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)
    except (OSError, AttributeError):
        pass
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(_open(out), 1)
    os.dup2(_open(err) if err else 1, 2)
    # new streams on the new descriptors, line-buffered like a run's PYTHONUNBUFFERED output
    sys.stdin = sys.__stdin__ = open(0, closefd=False)
    sys.stdout = sys.__stdout__ = open(1, 'w', buffering=1, closefd=False)
    sys.stderr = sys.__stderr__ = open(2, 'w', buffering=1, closefd=False)
    threads = env.get('OMP_NUM_THREADS', '')
    if threads.isdigit() and int(threads) > 0:
        import torch
        torch.set_num_threads(int(threads))
    sys.argv = [script] + list(args)
    # as a new interpreter has it: the script's folder, PYTHONPATH, then the installation's
    extra = [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]
    sys.path[:] = [osp.dirname(osp.abspath(script))] + extra + ast.literal_eval(base_path)
    code = 0
    try:
        runpy.run_path(script, run_name='__main__')
    except SystemExit as e:  # as the interpreter turns sys.exit(x) into an exit status
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: B036 - an uncaught exception: its traceback and status 1
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code & 0xFF)


def warm_command(cmd) -> bool:
    """Whether ``cmd`` runs a Python script with this interpreter (what the warm path takes)."""
    cmd = [str(c) for c in cmd]
    return (len(cmd) >= 2 and cmd[0] == sys.executable and cmd[1].endswith('.py')
            and os.environ.get('MMLINATTN_TEST_COLD', '') != '1')


def run(cmd, cwd=None, env=None, timeout=600, merge=False, fresh=False):
    """``subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    stdin=DEVNULL)`` (stderr into stdout with ``merge``), in the warm interpreter where it can."""
    p = start(cmd, cwd, env, merge=merge, fresh=fresh)
    try:
        try:
            code = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise subprocess.TimeoutExpired(p.args, timeout, output=p.output()) from None
        except BaseException:  # pytest-timeout, Ctrl-C: no run left behind (as subprocess.run)
            p.kill()
            raise
        return subprocess.CompletedProcess(p.args, code, p.output(),
                                           None if merge else p.output('err'))
    finally:
        p._tmp.cleanup()


class Started:
    """A run started by :func:`start`: ``args``, ``pid``, ``poll()``, ``wait(timeout)`` and
    ``returncode`` as :class:`subprocess.Popen` has them; ``output()`` is what it wrote so far
    (stdout, and stderr unless it was kept apart: ``output('err')``)."""

    def __init__(self, args, process, tmp):
        self.args, self._process, self._tmp, self.returncode = args, process, tmp, None
        self.pid = process.pid

    def poll(self):
        if self.returncode is None and not self._process.is_alive():
            self.returncode = self._process.exitcode  # -N where signal N ended it, as Popen says
        return self.returncode

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def kill(self):
        """SIGKILL to its process group, or to it alone where it has none of its own."""
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, 9)
                break
            except ProcessLookupError:  # no group of its own / already ended
                pass
        self.wait()

    def output(self, stream='out') -> str:
        with open(osp.join(self._tmp.name, stream), errors='replace') as f:
            return f.read()


class _Cold(Started):
    def poll(self):
        self.returncode = self._process.poll()
        return self.returncode

    def wait(self, timeout=None):
        self.returncode = self._process.wait(timeout)
        return self.returncode


def start(cmd, cwd=None, env=None, new_session=False, merge=True, fresh=False) -> Started:
    """``subprocess.Popen(cmd, cwd=cwd, env=env, stdin=DEVNULL, stdout=PIPE, stderr=STDOUT (or
    PIPE without ``merge``), start_new_session=new_session)`` in the warm interpreter where it can
    (see the module's docstring); the output is read with ``Started.output()``."""
    cmd = [str(c) for c in cmd]
    cwd = str(cwd or os.getcwd())
    env = dict(os.environ if env is None else env)
    tmp = tempfile.TemporaryDirectory(prefix='warm-run-')
    out = osp.join(tmp.name, 'out')
    err = None if merge else osp.join(tmp.name, 'err')
    if fresh or not warm_command(cmd):  # a new interpreter, its output into the same files
        with open(out, 'w') as o, open(err or os.devnull, 'w') as e:
            p = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=o,
                                 stderr=subprocess.STDOUT if merge else e,
                                 start_new_session=new_session)
        return _Cold(cmd, p, tmp)
    for path in (out, err):  # output() before the run opens them: ''
        if path:
            open(path, 'w').close()
    p = _fork_server().Process(target=_child, args=(cmd[1], cmd[2:], cwd, env, out, err,
                                                    _base_path, new_session))
    p.start()
    return Started(cmd, p, tmp)
