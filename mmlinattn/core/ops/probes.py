"""What the installed torch offers, found by looking for it (never by its version string).

mmlinattn runs from torch 2.1 (the newest torch with OpenMMLab's prebuilt mmcv 2.1.0 wheels) to
today's. Two questions the cores ask on every call have had different homes over that range:

* "is ``torch.compile`` tracing this?": ``torch.compiler.is_compiling`` (torch >= 2.3),
  before that ``torch._utils.is_compiling`` (2.1, 2.2; dynamo swaps it for True while tracing);
* "is ``torch.export`` tracing this?": ``torch.compiler.is_exporting`` (torch >= 2.5). An older
  torch has no export tracer that sets such a flag (its ``torch.onnx.export`` traces with the jit,
  which ``torch.jit.is_tracing`` answers), so there the answer is False.

Features that need a newer torch (:func:`has_export`) are probed where a tool uses them, which says
in one line what it needs; the models, training and testing never need them.
"""
from typing import Callable, Optional

import torch


def _lookup(dotted: str) -> Optional[Callable]:
    """``torch.a.b`` when it exists, without importing a submodule torch has not loaded (torch
    imports some lazily, ``torch._dynamo`` among them, at a cost of a second or more)."""
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
    """``torch.export.export`` with ``dynamic_shapes`` and ``Dim`` (torch >= 2.2), and
    ``torch.onnx.export(..., dynamo=True)`` (torch >= 2.5), which tools/deployment needs."""
    import inspect
    try:
        from torch.export import Dim, export  # noqa: F401
    except ImportError:
        return False
    return ('dynamic_shapes' in inspect.signature(export).parameters
            and 'dynamo' in inspect.signature(torch.onnx.export).parameters)
