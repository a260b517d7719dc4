"""The backbones' token projections on the CPU: ``x W^T + b`` through oneDNN.

Every ``Linear`` of our token backbones (qkv / q / kv / proj, the MLPs, Swin's patch merging) is
:class:`mmlinattn.core.models.layers.common.Linear`, whose forward is :func:`linear`. On the CPU,
for contiguous float32 tokens (..., C) outside autocast and tracing, it runs the product as
oneDNN's 1x1 convolution on the tokens viewed as a channels-last (1, C, N, 1) map (inputs of more
than :data:`MIN_ELEMENTS` values, torch using more than one thread): no copy on
the way in or out, the same parameters and the same float32 arithmetic (a different summation
order: results agree with ``F.linear`` to float32 rounding). Everything else - CUDA, other
dtypes, strided inputs, autocast, ``torch.jit`` tracing and scripting, ``torch.fx`` symbolic
tracing, ``torch.compile`` and ``torch.export`` - goes to ``F.linear`` unchanged, so GPU training,
exported graphs and FLOP counts see a plain linear. (torch's dynamic quantization matches module
types exactly and leaves this ``Linear`` subclass in float; ``torch.jit.script`` cannot compile it.)

Why: on the CPUs we measured, torch's BLAS (MKL) is the slower of the two for these shapes
(many tokens, a few hundred channels). docs/benchmarks.md sections 12-13 have the figures, and
``MMLINATTN_CPU_LINEAR=blas`` (or :func:`set_cpu_linear`) switches back to ``F.linear``
everywhere, e.g. to compare on another CPU.
"""
import os

import torch
import torch.nn.functional as F
from torch import Tensor

from .probes import autocast_cpu_enabled, is_compiling, is_exporting

BACKENDS = ('onednn', 'blas')


def _checked(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f'CPU linear backend must be one of {BACKENDS}, got {backend!r} '
                         '(from set_cpu_linear or MMLINATTN_CPU_LINEAR)')
    return backend


#: ATen hands a 1x1 convolution of one image to oneDNN only above this many input elements, and
#: only with more than one thread (its own heuristic; otherwise it runs its native kernel, a GEMM
#: no faster than F.linear), so smaller inputs and single-threaded runs go to F.linear directly
MIN_ELEMENTS = 20480
_backend = _checked(os.environ.get('MMLINATTN_CPU_LINEAR', 'onednn'))
_ONEDNN = torch.backends.mkldnn.is_available()


def set_cpu_linear(backend: str) -> str:
    """``'onednn'`` (default) or ``'blas'`` (``F.linear`` everywhere); returns the previous one."""
    global _backend
    old, _backend = _backend, _checked(backend)
    return old


def cpu_linear() -> str:
    """The CPU backend :func:`linear` uses now."""
    return _backend


def _eager_cpu_float32(x) -> bool:
    # the tracers first (dynamo sees is_compiling() as a constant True and reads nothing after it:
    # get_num_threads() would be a graph break); then a plain tensor: torch.fx's Proxies and
    # tracing subclasses (FakeTensor, ...) take F.linear
    return (not is_compiling() and not is_exporting() and not torch.jit.is_tracing()
            and not torch.jit.is_scripting() and _backend == 'onednn'
            and type(x) is torch.Tensor and _ONEDNN and torch.backends.mkldnn.enabled
            and torch.get_num_threads() > 1 and x.device.type == 'cpu'
            and x.dtype == torch.float32 and not autocast_cpu_enabled())


def _onednn_applies(x, weight: Tensor) -> bool:
    return (_eager_cpu_float32(x) and weight.dtype == torch.float32 and x.dim() >= 2
            and x.numel() > MIN_ELEMENTS and x.is_contiguous() and weight.dim() == 2
            and weight.shape[0] > 0 and weight.shape[1] == x.shape[-1])


def cpu_channels_last(x: Tensor) -> Tensor:
    """An NCHW image batch in channels-last memory where :func:`linear` would take oneDNN (so a
    convolutional backbone's convolutions run in oneDNN's preferred layout too); ``x`` itself
    everywhere else. Values and shape are unchanged; only the strides differ."""
    if x.dim() == 4 and _eager_cpu_float32(x):
        return x.contiguous(memory_format=torch.channels_last)
    return x


def linear(x: Tensor, weight: Tensor, bias: Tensor = None) -> Tensor:
    """``F.linear(x, weight, bias)``; on the CPU through oneDNN where the module docstring says."""
    if not _onednn_applies(x, weight):
        return F.linear(x, weight, bias)
    c = x.shape[-1]
    n = x.numel() // c
    out = weight.shape[0]
    y = F.conv2d(x.view(1, n, 1, c).permute(0, 3, 1, 2), weight.reshape(out, c, 1, 1), bias)
    return y.permute(0, 2, 3, 1).reshape(*x.shape[:-1], out)
