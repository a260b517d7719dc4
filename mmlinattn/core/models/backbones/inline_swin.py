"""InLine-Swin (docs/design.md section 2.1): Swin-T/S/B with InLine attention in the authors'
stages and Swin's shifted-window softmax elsewhere. Parameter names equal the authors' (timm's):
their ImageNet checkpoints load without ``head`` and ``norm``. Outputs: each stage's features
before patch merging, through a new norm ``out_norms.{i}`` (as mmdet's Swin).

InLine blocks attend over the whole map at any size (at 224 what the released models computed:
their 56-token window covers each stage map); ``inline_window=56`` keeps their literal windows.
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer

from mmlinattn.core.models.layers import (
    DropPath,
    Mlp,
    PatchEmbed,
    TokenAttention,
    WindowSoftmaxAttention,
    pad_to_multiple,
    run_block,
)
from mmlinattn.core.ops.cores import get_core
from mmlinattn.core.registry import MODELS
from mmlinattn.core.weights import AuthorsLayout

from .base import LinAttnBackbone

MASK_VALUE = -100.0
SWIN_NORM = dict(type='LN', eps=1e-5)  # torch's default eps, as Swin's nn.LayerNorm


def window_partition(x: torch.Tensor, ws: int) -> torch.Tensor:
    """(B, H, W, C) with H, W multiples of ws -> (B, nW, ws*ws, C)."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // ws) * (w // ws), ws * ws, c)


def window_reverse(windows: torch.Tensor, ws: int, h: int, w: int) -> torch.Tensor:
    b, _, _, c = windows.shape
    x = windows.reshape(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


def shift_mask(hp: int, wp: int, ws: int, shift: int, device) -> torch.Tensor:
    """Swin's (nW, ws*ws, ws*ws) mask for a cyclically shifted, padded hp x wp map (0 / -100)."""
    img = torch.zeros((1, hp, wp, 1), device=device)
    cnt = 0
    for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
        for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            img[:, hs, wsl, :] = cnt
            cnt += 1
    win = window_partition(img, ws).reshape(-1, ws * ws)
    diff = win[:, None, :] - win[:, :, None]
    return torch.zeros_like(diff).masked_fill(diff != 0, MASK_VALUE)


class SwinBlock(nn.Module):
    """``x + attn(LN(x))``, ``x + MLP(LN(x))``, with drop path; a ``windowed`` core (softmax) in
    Swin's (shifted) windows, the others on the map or in windows of ``inline_window``."""

    def __init__(self, dim: int, num_heads: int, core: str, window_size: int = 7,
                 shift: bool = False, mlp_ratio: float = 4., drop_path: float = 0.,
                 inline_window: Optional[int] = None, attn_cfg: Optional[dict] = None,
                 norm_cfg: dict = SWIN_NORM):
        super().__init__()
        self.core, self.shift, self.window_size = core, shift, window_size
        self.inline_window = inline_window
        self.windowed = get_core(core).windowed
        self.norm1 = build_norm_layer(norm_cfg, dim)[1]
        attn_cfg = dict(attn_cfg or {})
        if self.windowed:
            attn_cfg.pop('local_residual', None)  # a token-module option; window attention has none
            self.attn = WindowSoftmaxAttention(dim, num_heads, core=core, window_size=window_size,
                                               **attn_cfg)
        else:
            self.attn = TokenAttention(dim, num_heads, core=core, qkv_layout='qkv', **attn_cfg)
        self.drop_path = DropPath(drop_path)
        self.norm2 = build_norm_layer(norm_cfg, dim)[1]
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    @staticmethod
    def _windowed(x: torch.Tensor, ws: int, shift: int, fn):
        """Pad (B, H, W, C) to multiples of ws, roll by -shift, run fn on the windows, undo."""
        b, h, w, c = x.shape
        x = pad_to_multiple(x, ws)
        hp, wp = x.shape[1:3]
        if shift:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
        out = window_reverse(fn(window_partition(x, ws)), ws, hp, wp)
        if shift:
            out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
        return out[:, :h, :w, :]

    def attention(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        b, n, c = x.shape
        h, w = hw
        if not self.windowed:
            win = self.inline_window
            if win is None or (h <= win and w <= win):
                return self.attn(x, hw)
            shift = win // 2 if (self.shift and min(h, w) > win) else 0

            def run(windows):
                bw, nw, nt, _ = windows.shape
                return self.attn(windows.reshape(bw * nw, nt, c), (win, win)).reshape(bw, nw, nt, c)
            return self._windowed(x.reshape(b, h, w, c), win, shift, run).reshape(b, n, c)

        ws = self.window_size
        if h <= ws and w <= ws:  # the whole map is one window; no shift (as Swin's own code)
            return self.attn(x.unsqueeze(1), (h, w)).squeeze(1)
        shift = ws // 2 if (self.shift and min(h, w) > ws) else 0
        # the mask of the padded map (the sizes pad_to_multiple gives)
        mask = shift_mask(h + (-h) % ws, w + (-w) % ws, ws, shift, x.device) if shift else None
        return self._windowed(x.reshape(b, h, w, c), ws, shift,
                              lambda windows: self.attn(windows, (ws, ws), mask)).reshape(b, n, c)

    def forward(self, x, hw):
        x = x + self.drop_path(self.attention(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    """2x2 concat (timm order; odd maps padded) -> norm(4C) -> Linear(4C, ``out_dim`` or 2C)."""

    def __init__(self, dim: int, norm_cfg: dict = SWIN_NORM, out_dim: Optional[int] = None):
        super().__init__()
        self.norm = build_norm_layer(norm_cfg, 4 * dim)[1]
        self.reduction = nn.Linear(4 * dim, out_dim or 2 * dim, bias=False)

    def forward(self, x, hw):
        b, n, c = x.shape
        x = pad_to_multiple(x.reshape(b, *hw, c), 2)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        out_hw = (x.shape[1], x.shape[2])
        return self.reduction(self.norm(x.reshape(b, -1, 4 * c))), out_hw


class SwinStage(nn.Module):
    """``depth`` :class:`SwinBlock` (odd ones shifted), then (``downsample``) patch merging."""

    def __init__(self, dim: int, depth: int, num_heads: int, cores: Sequence[str],
                 dprs: Sequence[float], downsample: bool, window_size: int = 7,
                 mlp_ratio: float = 4., inline_window: Optional[int] = None,
                 attn_cfg: Optional[dict] = None, norm_cfg: dict = SWIN_NORM,
                 with_cp: bool = False, out_dim: Optional[int] = None):
        super().__init__()
        self.with_cp = with_cp
        self.blocks = nn.ModuleList([
            SwinBlock(dim, num_heads, cores[i], window_size, shift=(i % 2 == 1),
                      mlp_ratio=mlp_ratio,
                      drop_path=dprs[i], inline_window=inline_window, attn_cfg=attn_cfg,
                      norm_cfg=norm_cfg)
            for i in range(depth)])
        self.downsample = PatchMerging(dim, norm_cfg, out_dim) if downsample else None

    def forward(self, x: Tuple[torch.Tensor, Tuple[int, int]], downsample: bool = True):
        """``(tokens, hw)`` -> ``((B, C, H, W) map before the merging, (tokens, hw) after)``."""
        x, hw = x
        for blk in self.blocks:
            x = run_block(blk, self.with_cp, x, hw)
        out = x.transpose(1, 2).reshape(x.shape[0], -1, *hw)
        if downsample and self.downsample is not None:
            return out, self.downsample(x, hw)
        return out, (x, hw)


@MODELS.register_module()
class InLineSwin(LinAttnBackbone):
    """InLine-Swin backbone (Han et al., "Bridging the Divide: Reconsidering Softmax and Linear
    Attention"). The shared arguments are :class:`LinAttnBackbone`'s; here:

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'`` or a dict (``embed_dims``: stage 1's
            width, doubling per stage, or a list; optionally ``attn_type``).
        attn_type: default the arch's (tiny ``IIIS``, small ``IISS``, base ``II(I2S)S``); ``S`` is
            Swin's shifted-window softmax; the old ``IIMS2`` reads with a ``FutureWarning``.
        attn_cfg: for :class:`TokenAttention` and :class:`WindowSoftmaxAttention`, also
            ``local_residual`` (token blocks only).
        window_size (int): softmax window (7).
        patch_size (int): patch embedding stride (4).
        mlp_ratio (float): MLP hidden width / channels (4).
        inline_window (int | None): ``None`` global InLine; an int: the authors' literal windows.
        norm_cfg (dict): ``LN``, eps 1e-5 as Swin; also the patch embedding's and merging's.
    """
    arch_zoo = {
        'tiny': dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                     attn_type='IIIS', drop_path_rate=0.2),
        'small': dict(embed_dims=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24],
                      attn_type='IISS', drop_path_rate=0.3),
        'base': dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
                     attn_type='II(I2S)S', drop_path_rate=0.5),
    }
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    default_attn_type = 'IIII'
    legacy_mixed = True  # the old 'IIMS2' spelling of a mixed stage, read with a FutureWarning
    # classification parts: the final norm (our out_norms.3 in the classifier) and the head; the
    # window index and shift-mask buffers of the released files are recomputed here
    authors_layout = AuthorsLayout(
        'inline_swin', classification=('head.', 'norm.'),
        recomputed=('relative_position_index', 'attn_mask'),
        classifier=(('head.', 'head.fc.'), ('norm.', 'backbone.out_norms.3.norm.')))

    def __init__(self, arch='tiny', in_channels: int = 3, attn_type: Optional[str] = None,
                 attn_cfg: Optional[dict] = None, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 drop_path_rate: Optional[float] = None, window_size: int = 7, patch_size: int = 4,
                 mlp_ratio: float = 4., inline_window: Optional[int] = None, out_norm: bool = True,
                 norm_cfg: dict = SWIN_NORM, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        arch = self._setup(arch, out_indices, frozen_stages, norm_eval, with_cp, drop_path_rate)
        self._check_attn_cfg(attn_cfg, (TokenAttention, WindowSoftmaxAttention),
                             ('dim', 'num_heads', 'core', 'qkv_layout', 'window_size', 'sr_ratio',
                              'norm_eps'))
        heads, n = list(arch['num_heads']), self.num_stages
        self._set_dims(arch['embed_dims'])
        dims = self.embed_dims
        cores = self._block_cores(attn_type, arch)
        self.patch_embed = PatchEmbed(in_channels, dims[0], patch_size, pad=True, norm_cfg=norm_cfg)
        self.layers = nn.ModuleList([
            SwinStage(dims[i], self.depths[i], heads[i], cores[i], self.dpr[i], i < n - 1,
                      window_size, mlp_ratio, inline_window, attn_cfg, norm_cfg, with_cp,
                      out_dim=dims[i + 1] if i < n - 1 else None)
            for i in range(n)])
        self._build_out_norms(out_norm, norm_cfg)
        self._freeze_stages()

    @classmethod
    def resolve_arch(cls, arch) -> dict:
        """The base class's, with ``embed_dims`` as a list (an int: stage 1's, doubling)."""
        out = super().resolve_arch(arch)
        dims = out['embed_dims']
        out['embed_dims'] = [dims * 2 ** i for i in range(len(out['depths']))] \
            if isinstance(dims, int) else [int(c) for c in dims]
        return out
