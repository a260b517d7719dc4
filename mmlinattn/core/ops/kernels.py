"""Feature maps (kernels) phi used by the linear attentions, and 2-D rotary position embedding."""
import math
import threading
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F

from . import probes

Tensor = torch.Tensor


def _identity(x: Tensor) -> Tensor:
    return x


_LOG2E = math.log2(math.e)


def eager() -> bool:
    """Not inside a jit trace, ``torch.compile`` or ``torch.export`` (which keep plain ``exp``)."""
    return not (torch.jit.is_tracing() or probes.is_compiling()
                or probes.is_exporting())


def exp_(t: Tensor, scale: float = 1.0) -> Tensor:
    """``exp(scale * t)`` into ``t`` (the caller's); eager as ``exp2(t * scale * log2(e))`` (3.5x
    faster on CPU; equal to 1e-13 relative in float64, 5e-7 in float32 for |t| <= 10)."""
    if eager():
        return t.mul_(scale * _LOG2E).exp2_()
    return (t.mul_(scale) if scale != 1.0 else t).exp_()


def _exp(x: Tensor) -> Tensor:
    # the InLine paper's exp kernel (temperature 0.2, as the authors' ablation code)
    if eager() and not (torch.is_grad_enabled() and x.requires_grad):
        return torch.mul(x, 0.2 * _LOG2E).exp2_()
    return torch.exp(0.2 * x)


def elu_plus_one(x: Tensor) -> Tensor:
    """ELU(x) + 1 as relu(x) + exp(min(x, 0)) (faster on CPU); in place without autograd."""
    if torch.is_grad_enabled() and x.requires_grad:
        return torch.relu(x) + torch.exp(x.clamp(max=0))
    return exp_(x.clamp(max=0)).add_(x.relu())


def elu_plus_one_into(x: Tensor, out: Tensor, tmp: Tensor) -> Tensor:
    """:func:`elu_plus_one` without autograd into ``out``, ``tmp`` as scratch (both like ``x``)."""
    return exp_(torch.clamp(x, max=0, out=out)).add_(torch.clamp(x, min=0, out=tmp))


#: bytes of scratch memory that :func:`elu_plus_one_scratch` keeps on the CPU from call to call
#: (per thread and dtype); a call that needs more allocates its buffers for itself
WORKSPACE_MAX_BYTES = 32 * 2 ** 20
_workspace = threading.local()


def cpu_workspace(numel: int, dtype: torch.dtype) -> Tensor:
    """A flat CPU tensor of ``numel`` elements, the same memory on every call of this thread (grown
    when needed), so that no call faults fresh pages in (docs/benchmarks.md)."""
    kept = getattr(_workspace, 'tensors', None)
    if kept is None:
        kept = _workspace.tensors = {}
    buf = kept.get(dtype)
    if buf is None or buf.numel() < numel:
        with torch.inference_mode(False):  # a normal tensor: usable inside and outside the mode
            buf = kept[dtype] = torch.empty(numel, dtype=dtype)
    return buf[:numel]


def elu_plus_one_scratch(like: Tensor, tokens: int) -> Callable[[Tensor], Tensor]:
    """:func:`elu_plus_one_into` over two scratch buffers for chunks of <= ``tokens`` tokens laid
    out like ``like``; ``phi.spare(m)``: the second buffer's first ``m`` tokens, free until next
    call."""
    *lead, _, d = like.shape
    per_token = math.prod(lead) * d
    size = per_token * tokens
    tokens_inner = like.stride(-2) == 1 and like.stride(-1) != 1 and d > 1
    if like.device.type == 'cpu' and 2 * size * like.element_size() <= WORKSPACE_MAX_BYTES:
        flat = cpu_workspace(2 * size, like.dtype)
        bufs = flat[:size], flat[size:]
    else:
        bufs = like.new_empty(size), like.new_empty(size)

    def head(t: Tensor, m: int) -> Tensor:  # the first m tokens of a buffer, in one block
        t = t[:per_token * m]
        return t.view(*lead, d, m).transpose(-2, -1) if tokens_inner else t.view(*lead, m, d)

    def phi(x: Tensor) -> Tensor:
        m = x.shape[-2]
        return elu_plus_one_into(x, head(bufs[0], m), head(bufs[1], m))
    phi.spare = lambda m: head(bufs[1], m)
    return phi


KERNELS: Dict[str, Callable[[Tensor], Tensor]] = {
    'identity': _identity,
    'relu': F.relu,
    'leakyrelu': F.leaky_relu,  # negative slope 0.01, nn.LeakyReLU's default
    'exp': _exp,
    'elu': elu_plus_one,  # ELU + 1: MALA's kernel and the classic linear-attention one
}


def get_kernel(name: str) -> Callable[[Tensor], Tensor]:
    """Return the feature map phi called ``name``; the error lists the valid names."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f'unknown attention kernel {name!r}; choose one of '
                         f'{sorted(KERNELS)}') from None


def rope_angles(head_dim: int, theta: float = 10000.0, device=None,
                dtype=torch.float32) -> Tensor:
    """Per-pair frequencies of MAViT's 2-D RoPE: ``1 / theta ** linspace(0, 1, head_dim // 4)``,
    each twice; the first half of the channels rotates with the row, the second with the column."""
    if head_dim % 4 != 0:
        raise ValueError(f'2-D RoPE needs a head dim divisible by 4, got {head_dim}')
    angle = 1.0 / (theta ** torch.linspace(0, 1, head_dim // 4, device=device, dtype=dtype))
    return angle.repeat_interleave(2)


def rope_sin_cos(hw: Tuple[int, int], angle: Tensor) -> Tuple[Tensor, Tensor]:
    """sin and cos tables of shape (H*W, 2*len(angle)) for a row-major flattened H x W map."""
    h, w = hw
    rows = torch.arange(h, device=angle.device, dtype=angle.dtype)[:, None] * angle  # (h, d/2)
    cols = torch.arange(w, device=angle.device, dtype=angle.dtype)[:, None] * angle  # (w, d/2)
    phase = torch.cat([rows[:, None, :].expand(h, w, -1),
                       cols[None, :, :].expand(h, w, -1)], dim=-1).reshape(h * w, -1)
    return phase.sin(), phase.cos()


def rotate_pairs(x: Tensor) -> Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...) on the last dim."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def apply_rope(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """Rotate ``x`` (..., N, d) by the position tables (N, d)."""
    return x * cos + rotate_pairs(x) * sin
