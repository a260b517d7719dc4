"""Small building blocks shared by the backbones."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if p == 0. or not training:
        return x
    keep = 1 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
    return x * mask / keep


class DropPath(nn.Module):
    """Stochastic depth per sample: drops a sample's residual branch with probability ``p``."""

    def __init__(self, p: float = 0.):
        super().__init__()
        self.p = float(p)

    def forward(self, x):
        return drop_path(x, self.p, self.training)

    def extra_repr(self):
        return f'p={self.p}'


class Mlp(nn.Module):
    """Linear -> GELU -> Linear on tokens (timm's ``fc1``, ``fc2``), dropout after each."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class LayerNorm2d(nn.Module):
    """A norm (``.norm``) over the channels of an NCHW map: LayerNorm(eps), or from ``norm_cfg``."""

    def __init__(self, dim: int, eps: float = 1e-6, norm_cfg: Optional[dict] = None):
        super().__init__()
        cfg = dict(type='LN', eps=eps) if norm_cfg is None else dict(norm_cfg)
        self.norm = build_norm_layer(cfg, dim)[1]
        self.channels_last = isinstance(self.norm, nn.LayerNorm)

    def forward(self, x):
        if not self.channels_last:
            return self.norm(x)
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def pad_to_multiple(x: torch.Tensor, multiple: int, channels_last: bool = True) -> torch.Tensor:
    """Zero-pad a (B, H, W, C) (or (B, C, H, W)) map at the bottom/right to multiples."""
    h, w = (x.shape[1], x.shape[2]) if channels_last else (x.shape[2], x.shape[3])
    ph, pw = (-h) % multiple, (-w) % multiple
    if not ph and not pw:
        return x
    return F.pad(x, (0, 0, 0, pw, 0, ph) if channels_last else (0, pw, 0, ph))


class PatchEmbed(nn.Module):
    """Conv ``proj`` (kernel = stride = ``patch``) + ``norm`` on the tokens -> ``(tokens, (h, w))``;
    ``pad``: zero-pad to a multiple of ``patch`` (Swin), else drop the remainder (PVT v1)."""

    def __init__(self, in_channels: int, dim: int, patch: int, pad: bool = True, eps: float = 1e-5,
                 norm_cfg: Optional[dict] = None):
        super().__init__()
        self.patch, self.pad = patch, pad
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch, stride=patch)
        self.norm = (build_norm_layer(norm_cfg, dim)[1] if norm_cfg is not None
                     else nn.LayerNorm(dim, eps=eps))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        h, w = x.shape[-2:]
        if self.pad:
            x = F.pad(x, (0, (-w) % self.patch, 0, (-h) % self.patch))
        elif h < self.patch or w < self.patch:
            raise ValueError(f'a {h}x{w} map is smaller than the {self.patch}x{self.patch} patch '
                             'that embeds it: use a larger input (InLinePVT needs >= 32 px per '
                             'side unless pad_patches=True)')
        x = self.proj(x)
        # traced values under the jit (the legacy ONNX exporter's graph follows the input size)
        hw = (x.shape[2], x.shape[3]) if torch.jit.is_tracing() else \
            (int(x.shape[2]), int(x.shape[3]))
        return self.norm(x.flatten(2).transpose(1, 2)), hw


def resize_pos_embed(pos: torch.Tensor, src_hw: Tuple[int, int],
                     dst_hw: Tuple[int, int]) -> torch.Tensor:
    """Bilinearly resize a (1, H*W, C) position table (align_corners=False, as the authors do)."""
    if tuple(src_hw) == tuple(dst_hw) and not torch.onnx.is_in_onnx_export():
        # (a jit ONNX export would freeze the comparison: it always resizes)
        return pos
    c = pos.shape[-1]
    grid = pos.reshape(1, *src_hw, c).permute(0, 3, 1, 2)
    # half-precision tables are resized in float32, float32 and float64 ones in their own dtype
    grid = grid.to(torch.promote_types(grid.dtype, torch.float32))
    grid = F.interpolate(grid, size=tuple(dst_hw), mode='bilinear', align_corners=False)
    return grid.permute(0, 2, 3, 1).reshape(1, dst_hw[0] * dst_hw[1], c).to(pos.dtype)


def run_block(block: nn.Module, with_cp: bool, *args):
    """``block(*args)``, with activation checkpointing when ``with_cp`` and autograd is on."""
    if with_cp and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False)
    return block(*args)
