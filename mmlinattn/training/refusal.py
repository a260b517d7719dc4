"""How a run stops in one line: :func:`refuse` prints ``PROG: error: MESSAGE`` on stderr and gives
the :class:`RunRefused` to raise, a ``SystemExit`` (the tool ends with its code, no traceback) that
is also an instance of the error it reports. The Runner's checks, the hooks and the data loaders
raise it where the stop happens, so it holds under any tool and any Runner."""
import os.path as osp
import sys
from typing import Optional

__all__ = ['PROG', 'RunRefused', 'close_distributed', 'refuse']


class RunRefused(SystemExit):
    """A run that stopped with one line on stderr (``message``, also its ``str``); ``code``: the
    exit status. Raised as a subclass of the error it reports as well (:func:`refuse`), so that
    ``except ConfigError`` / ``except Preempted`` in a script or notebook catch it as before, while
    a command-line tool ends with the code and no traceback (an ``OSError``, such as a checkpoint
    that could not be written, is a plain ``RunRefused``)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(code)
        self.message = message

    def __str__(self):
        return self.message


_REFUSALS = {}


def _refusal_class(error_type: type) -> type:
    """``RunRefused`` that is also an ``error_type`` (one class per type); plain ``RunRefused``
    for a type whose instances cannot also be a ``SystemExit`` (``OSError``'s layout)."""
    if error_type not in _REFUSALS:
        try:
            _REFUSALS[error_type] = type(error_type.__name__, (RunRefused, error_type),
                                         {'__module__': error_type.__module__})
        except TypeError:
            _REFUSALS[error_type] = RunRefused
    return _REFUSALS[error_type]


#: the command's name in its messages, where a tool of ours sets it (``tools/train.py``)
PROG: Optional[str] = None


def _prog() -> str:
    """The command's name for its messages: :data:`PROG`, else the script as it was started
    (``tools/train.py`` from mmdet's root), its file name where it was started by an absolute
    path (``mim train``), else ``mmlinattn``."""
    if PROG:
        return PROG
    arg = sys.argv[0] if sys.argv and sys.argv[0] not in ('', '-c', '-m') else ''
    if not arg or not arg.endswith('.py'):
        return 'mmlinattn'
    return arg if not osp.isabs(arg) else osp.basename(arg)


def refuse(error: Exception, code: int = 2) -> RunRefused:
    """Print ``error`` as the run's one line; return the :class:`RunRefused` to raise (also an
    instance of ``type(error)``)."""
    message = str(error)
    print(f'{_prog()}: error: {message}', file=sys.stderr, flush=True)
    cls = _refusal_class(type(error)) if isinstance(error, Exception) else RunRefused
    refused = cls.__new__(cls)
    RunRefused.__init__(refused, message, code)
    return refused


def close_distributed() -> None:
    """End a distributed run cleanly: wait for every rank, then destroy the process group (a gloo
    group left to the interpreter's exit can abort the process after its work is done)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
