"""InLine-Swin (docs/design.md section 2.1): Swin-T/S/B with InLine attention in the stages the authors
chose and Swin's shifted-window softmax attention elsewhere.

Parameter names equal the authors' timm-style ones (``patch_embed.{proj,norm}``,
``layers.{s}.blocks.{b}.{norm1,attn.{qkv,proj,residual.0,residual.2,relative_position_bias_table},
norm2,mlp.fc1,mlp.fc2}``, ``layers.{s}.downsample.{norm,reduction}``), so their ImageNet checkpoints
load by dropping ``head`` and the final ``norm``. Outputs are each stage's features before patch
merging, each through a new LayerNorm ``out_norms.{i}`` (as mmdet's Swin, eps 1e-5).

InLine blocks attend globally over the whole map at any resolution (no partition, no shift), which at
224 is exactly what the released models computed (their 56-token window covers each stage map).
``inline_window=56`` keeps the authors' literal classification behaviour at larger sizes instead:
56 x 56 windows, shifted by 28 on odd blocks when the map is larger than the window.
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from mmlinattn.models.layers import (DropPath, Mlp, PatchEmbed, TokenAttention,
                                     WindowSoftmaxAttention, pad_to_multiple)
from mmlinattn.registry import MODELS

from .base import LinAttnBackbone
from .utils import parse_stage_attn

MASK_VALUE = -100.0


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
    """One block; ``core`` 'inline'/'linear' (global or literal windows) or 'softmax' (windows)."""

    def __init__(self, dim, num_heads, core, window_size=7, shift=False, mlp_ratio=4.,
                 drop_path=0., inline_window: Optional[int] = None, attn_cfg=None):
        super().__init__()
        self.core, self.shift, self.window_size = core, shift, window_size
        self.inline_window = inline_window
        self.norm1 = nn.LayerNorm(dim)
        if core == 'softmax':
            self.attn = WindowSoftmaxAttention(dim, num_heads, window_size)
        else:
            self.attn = TokenAttention(dim, num_heads, core=core, qkv_layout='qkv', **(attn_cfg or {}))
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def _windowed(self, x: torch.Tensor, ws: int, shift: int, fn):
        """Pad (B, H, W, C) to multiples of ws, roll by -shift, run fn on windows, undo."""
        b, h, w, c = x.shape
        x = pad_to_multiple(x, ws)
        hp, wp = x.shape[1:3]
        if shift:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
        out = window_reverse(fn(window_partition(x, ws), hp, wp), ws, hp, wp)
        if shift:
            out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
        return out[:, :h, :w, :]

    def attention(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        b, n, c = x.shape
        h, w = hw
        if self.core != 'softmax':
            win = self.inline_window
            if win is None or (h <= win and w <= win):
                return self.attn(x, hw)
            shift = win // 2 if (self.shift and min(h, w) > win) else 0

            def run(windows, hp, wp):
                bw, nw, nt, _ = windows.shape
                return self.attn(windows.reshape(bw * nw, nt, c), (win, win)).reshape(bw, nw, nt, c)
            return self._windowed(x.reshape(b, h, w, c), win, shift, run).reshape(b, n, c)

        ws = self.window_size
        if h <= ws and w <= ws:  # the whole map is one window; no shift (as Swin's own code)
            return self.attn(x.unsqueeze(1), (h, w)).squeeze(1)
        shift = ws // 2 if (self.shift and min(h, w) > ws) else 0

        def run(windows, hp, wp):
            mask = shift_mask(hp, wp, ws, shift, x.device) if shift else None
            return self.attn(windows, (ws, ws), mask)
        return self._windowed(x.reshape(b, h, w, c), ws, shift, run).reshape(b, n, c)

    def forward(self, x, hw):
        x = x + self.drop_path(self.attention(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    """2x2 neighbourhood concat (timm order x00, x10, x01, x11) -> LN(4C) -> Linear(4C, 2C).

    Odd maps are zero-padded at the bottom/right first."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x, hw):
        b, n, c = x.shape
        x = pad_to_multiple(x.reshape(b, *hw, c), 2)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        out_hw = (x.shape[1], x.shape[2])
        return self.reduction(self.norm(x.reshape(b, -1, 4 * c))), out_hw


class SwinStage(nn.Module):
    def __init__(self, dim, depth, num_heads, cores, dprs, downsample, window_size, mlp_ratio,
                 inline_window, attn_cfg):
        super().__init__()
        self.blocks = nn.ModuleList([
            SwinBlock(dim, num_heads, cores[i], window_size, shift=(i % 2 == 1), mlp_ratio=mlp_ratio,
                      drop_path=dprs[i], inline_window=inline_window, attn_cfg=attn_cfg)
            for i in range(depth)])
        self.downsample = PatchMerging(dim) if downsample else None


def parse_swin_attn(attn_type, depths, owner='InLineSwin'):
    """Swin letters: one per stage, ``I`` InLine, ``S`` softmax, ``L`` plain linear, ``M`` mixed -
    a trailing number k (e.g. ``'IIMS2'``) makes the first k blocks of each ``M`` stage InLine and the
    rest softmax."""
    letters_map = InLineSwin.letters()
    if not isinstance(attn_type, str):
        return parse_stage_attn(attn_type, depths, letters_map, owner)
    n = len(depths)
    letters, k = attn_type[:n], attn_type[n:]
    valid = "one letter per stage from I (InLine), S (softmax), L (linear), M (mixed, then k)"
    if len(letters) != n or any(c not in 'ISLM' for c in letters):
        raise ValueError(f'{owner}: unknown attn_type {attn_type!r}: {valid}, e.g. IIIS or IIMS2')
    if 'M' in letters and not k.isdigit():
        raise ValueError(f'{owner}: attn_type {attn_type!r} has an M stage but no block count after '
                         f'the letters (e.g. IIMS2)')
    if k and 'M' not in letters:
        raise ValueError(f'{owner}: unknown attn_type {attn_type!r}: {valid}')
    out = []
    for i, c in enumerate(letters):
        if c == 'M':
            out.append(['inline' if j < int(k) else 'softmax' for j in range(depths[i])])
        else:
            out.append([letters_map[c]] * depths[i])
    return out


@MODELS.register_module()
class InLineSwin(LinAttnBackbone):
    """InLine-Swin backbone (Han et al., "Bridging the Divide: Reconsidering Softmax and Linear
    Attention").

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'`` or a dict with ``embed_dims, depths,
            num_heads`` (and optionally ``attn_type``, ``drop_path_rate``).
        attn_type (str | None): per-stage letters (see :func:`parse_swin_attn`); default the arch's
            (tiny ``IIIS``, small ``IISS``, base ``IIMS2``).
        window_size (int): softmax window (7).
        inline_window (int | None): ``None`` global InLine (default); an int for the authors' literal
            windowed behaviour.
        attn_cfg (dict): TokenAttention options (``kernel``, ``local_residual``) for ablations.
    """
    arch_zoo = {
        'tiny': dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                     attn_type='IIIS', drop_path_rate=0.2),
        'small': dict(embed_dims=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24],
                      attn_type='IISS', drop_path_rate=0.3),
        'base': dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
                     attn_type='IIMS2', drop_path_rate=0.5),
    }
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    attn_letters = 'ISL'
    _ckpt_drop_prefixes = ('head.', 'norm.')
    _ckpt_tolerated = ('relative_position_index', 'attn_mask')

    def __init__(self, arch='tiny', in_channels: int = 3, attn_type: Optional[str] = None,
                 attn_cfg: Optional[dict] = None, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 drop_path_rate: Optional[float] = None, window_size: int = 7, patch_size: int = 4,
                 mlp_ratio: float = 4., inline_window: Optional[int] = None, out_norm: bool = True,
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        arch = self._setup(arch, out_indices, frozen_stages, norm_eval, with_cp, drop_path_rate)
        dims0, heads, n = arch['embed_dims'], list(arch['num_heads']), self.num_stages
        self._set_dims([dims0 * 2 ** i for i in range(n)] if isinstance(dims0, int) else dims0)
        dims = self.embed_dims
        cores = parse_swin_attn(attn_type or arch.get('attn_type', 'I' * n), self.depths)
        self.num_heads = heads
        self.patch_embed = PatchEmbed(in_channels, dims[0], patch_size, pad=True)
        self.layers = nn.ModuleList([
            SwinStage(dims[i], self.depths[i], heads[i], cores[i], self.dpr[i], i < n - 1, window_size,
                      mlp_ratio, inline_window, attn_cfg) for i in range(n)])
        self._build_out_norms(out_norm, eps=1e-5)
        self._freeze_stages()

    def _post_init(self):
        for m in self.modules():
            if isinstance(m, WindowSoftmaxAttention):
                nn.init.trunc_normal_(m.relative_position_bias_table, std=.02)

    def _stage_modules(self, i):
        return [self.patch_embed] if i == 0 else [self.layers[i - 1]]

    def forward(self, x):
        b = x.shape[0]
        x, hw = self.patch_embed(x)
        outs = []
        for i, layer in enumerate(self.layers):
            for blk in layer.blocks:
                x = self.run_block(blk, self.with_cp, x, hw)
            if i in self.out_indices:
                outs.append(self._output(i, x.transpose(1, 2).reshape(b, -1, *hw)))
            if i >= max(self.out_indices):
                break
            if layer.downsample is not None:
                x, hw = layer.downsample(x, hw)
        return tuple(outs)
