"""What the installed torch (2.1 to today's) offers, found by looking for it, never by version:
"is ``torch.compile`` tracing?" (``torch.compiler.is_compiling``, >= 2.3; before,
``torch._utils.is_compiling``) and "is ``torch.export`` tracing?" (``torch.compiler.is_exporting``,
>= 2.5; older torch has no such tracer: False). :func:`has_export` is probed by the tools only.
"""
from typing import Callable, Optional

import torch


def _lookup(dotted: str) -> Optional[Callable]:
    """``torch.a.b`` when it exists, without importing a submodule torch has not loaded."""
    obj = torch
    for part in dotted.split('.')[1:]:
        obj = obj.__dict__.get(part) if hasattr(obj, '__dict__') else None
        if obj is None:
            return None
    return obj if callable(obj) else None


def _never() -> bool:
    return False


is_compiling: Callable[[], bool] = (_lookup('torch.compiler.is_compiling')
                                    or _lookup('torch._utils.is_compiling') or _never)
is_exporting: Callable[[], bool] = _lookup('torch.compiler.is_exporting') or _never


def has_export() -> bool:
    """``torch.export`` with ``dynamic_shapes`` and ``torch.onnx.export(..., dynamo=True)``."""
    import inspect
    try:
        from torch.export import Dim, export  # noqa: F401
    except ImportError:
        return False
    return ('dynamic_shapes' in inspect.signature(export).parameters
            and 'dynamo' in inspect.signature(torch.onnx.export).parameters)
