"""Swin's window attention (W-MSA / SW-MSA) with its relative position bias, on any core of the
table that takes an additive bias (:data:`mmlinattn.core.ops.cores.CORES`; softmax by default)."""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from .attention import AttentionModule


def relative_position_index(window: int, size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """Swin's (Wh*Ww, Wh*Ww) index into a (2*window-1)^2 bias table (``size``: a smaller window)."""
    h, w = size or (window, window)
    coords = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    return rel[..., 0] * (2 * window - 1) + rel[..., 1]


class WindowSoftmaxAttention(AttentionModule):
    """Swin's window attention with relative position bias (Swin's names): ``forward(x, window_hw,
    mask=None)``, (B, nW, N, C) windows of ``window_hw`` tokens, ``mask`` (nW, N, N) of 0 / -100.

    Args:
        dim, num_heads, core, qkv_bias, kernel, attn_drop, proj_drop, core_options: as
            :class:`~.attention.AttentionModule`; ``core`` takes a bias (``'softmax'``).
        window_size (int): window side (7); the bias table has (2 * window_size - 1)^2 rows.
    """

    def __init__(self, dim: int, num_heads: int, *, core: str = 'softmax', qkv_bias: bool = True,
                 kernel: Optional[str] = None, attn_drop: float = 0., proj_drop: float = 0.,
                 core_options: Optional[dict] = None, window_size: int = 7):
        super().__init__()
        self._init_core(dim, num_heads, core, kernel, attn_drop, core_options)
        if not self.core_entry.bias:
            raise ValueError(f'window attention needs a core that takes an attention bias; '
                             f'{core!r} does not')
        self.window_size = window_size
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size - 1) ** 2, num_heads))
        self.register_buffer('relative_position_index', relative_position_index(window_size),
                             persistent=False)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=.02)

    def bias(self, window_hw: Tuple[int, int]) -> torch.Tensor:
        if tuple(window_hw) == (self.window_size, self.window_size):
            index = self.relative_position_index
        else:
            index = relative_position_index(self.window_size, window_hw).to(
                self.relative_position_bias_table.device)
        n = window_hw[0] * window_hw[1]
        table = self.relative_position_bias_table
        return table[index.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)

    def _qkv(self, x):
        b, nw, n, c = x.shape
        qkv = self.qkv(x).reshape(b, nw, n, 3, self.num_heads,
                                  self.head_dim).permute(3, 0, 1, 4, 2, 5)
        return qkv[0], qkv[1], qkv[2]  # (B, nW, h, N, d)

    def _attn_bias(self, window_hw, mask, dtype):
        bias = self.bias(window_hw)  # (h, N, N)
        if mask is not None:
            bias = bias[None] + mask[:, None]  # (nW, h, N, N)
        return bias.to(dtype)

    def forward(self, x: torch.Tensor, window_hw: Tuple[int, int],
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        b, nw, n, c = x.shape
        q, k, v = self._qkv(x)
        out = self._run_core(q, k, v, attn_bias=self._attn_bias(window_hw, mask, q.dtype))
        out = out.transpose(2, 3).reshape(b, nw, n, c)
        return self.proj_drop(self.proj(out))

    @torch.no_grad()
    def queries_keys(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The (B, nW, h, N, d) queries and keys the module hands its core."""
        q, k, _ = self._qkv(x)
        return q, k

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, window_hw: Tuple[int, int],
                         mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The core's explicit (B, nW, h, N, N) matrix for ``forward(x, window_hw, mask)``."""
        q, k = self.queries_keys(x)
        return self._core_matrix(q, k, attn_bias=self._attn_bias(window_hw, mask, q.dtype))
