"""Feature maps (kernels) phi used by the linear attentions, and 2-D rotary position embedding."""
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def _identity(x: Tensor) -> Tensor:
    return x


def _exp(x: Tensor) -> Tensor:
    # the InLine paper's exp kernel (temperature 0.2, as in the authors' ablation code)
    return torch.exp(0.2 * x)


def elu_plus_one(x: Tensor) -> Tensor:
    """ELU(x) + 1, computed as relu(x) + exp(min(x, 0)).

    Same values as ``F.elu(x) + 1`` (to rounding), but about 4x faster on CPU, where torch's ELU
    kernel is several times slower than exp; without autograd the passes run in place.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return torch.relu(x) + torch.exp(x.clamp(max=0))
    return x.clamp(max=0).exp_().add_(x.clamp(min=0))


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
    """Per-pair rotation frequencies of MAViT's 2-D RoPE, shape (head_dim // 2,).

    ``1 / theta ** linspace(0, 1, head_dim // 4)``, each entry repeated twice, so that channel pairs
    (2i, 2i+1) rotate together. The first half of the channels rotates with the row index, the
    second half with the column index.
    """
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
