"""Attention modules that wrap the pure functions of :mod:`mmlinattn.core.ops`.

``TokenAttention`` works on token sequences (B, N, C) of an H x W map (the InLine-Swin and
InLine-PVT families); ``QKVOAttention`` is MAViT's channels-first module (qkvo projection, LePE,
output gate, 2-D RoPE); Swin's window attention is in :mod:`.window`.

The attention itself is chosen by a *core* name, an entry of the table
:data:`mmlinattn.core.ops.cores.CORES` (``'inline'``, ``'linear'``, ``'softmax'``, ``'mala'``, and
any core registered later), so the papers' ablations are config switches (plus kernel / residual /
beta / gamma options). The modules ask the table what a core takes (kernel, RoPE, bias, spatial
reduction). Every module keeps its table entry (``core_entry``) and takes the core's further
switches as one dict, ``core_options`` (e.g. MALA's ``beta`` / ``gamma``). For the analysis tools
every module also returns the queries and keys its core sees (``queries_keys``) and its explicit
attention matrix (``attention_matrix``), computed from the same weights and inputs as the
linear-time path.
"""
import warnings
from typing import Optional, Tuple

import torch
import torch.nn as nn

from mmlinattn.core.ops import dynamic_depthwise_conv3x3, rope_sin_cos
from mmlinattn.core.ops.cores import CORES, Core, get_core
from mmlinattn.core.ops.kernels import rope_angles


def run_core(core: str, q, k, v, scale: Optional[float] = None, kernel: Optional[str] = None,
             rope=None, attn_bias=None, **options):
    """Run the core called ``core`` (an entry of :data:`mmlinattn.core.ops.cores.CORES`) on (B, h,
    N, d) q, k, v; settings it does not take are not passed (see
    :class:`mmlinattn.core.ops.cores.Core`)."""
    return get_core(core)(q, k, v, scale=scale, kernel=kernel, rope=rope, attn_bias=attn_bias,
                          **options)


def core_matrix(core: str, q, k, scale: Optional[float] = None, kernel: Optional[str] = None,
                rope=None, attn_bias=None, **options):
    """The explicit (B, h, N, N) attention matrix of ``core`` (quadratic; analysis only)."""
    return get_core(core).attention_matrix(q, k, scale=scale, kernel=kernel, rope=rope,
                                           attn_bias=attn_bias, **options)


def _core_for_module(core: str, kernel: Optional[str]) -> Core:
    """The table entry of ``core``, with ``kernel`` checked against it (fails early, listing
    both)."""
    entry = get_core(core)
    entry.kwargs(kernel=kernel)
    return entry


class LocalResidual(nn.Sequential):
    """InLine's local attention residual weights: mean token -> per-channel 3x3 kernels.

    ``Conv1d(C, C, 1, groups=h) -> GELU -> Conv1d(C, 9C, 1, groups=h)`` (parameter names ``0`` and
    ``2`` as in the authors' ``residual`` Sequential).

    Args:
        dim (int): channels C.
        num_heads (int): heads h (the groups of both convs).
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__(nn.Conv1d(dim, dim, 1, groups=num_heads), nn.GELU(),
                         nn.Conv1d(dim, dim * 9, 1, groups=num_heads))

    def forward(self, x: torch.Tensor, v_map: torch.Tensor) -> torch.Tensor:
        """x: (B, N, C) attention input; v_map: (B, C, H, W) values. Returns (B, C, H, W)."""
        weight = super().forward(x.mean(dim=1).unsqueeze(-1))  # (B, 9C, 1)
        return dynamic_depthwise_conv3x3(v_map, weight)


class TokenAttention(nn.Module):
    """Global multi-head attention over the N = H*W tokens of a map, any core of the table.

    Args:
        dim (int): channels.
        num_heads (int): heads; ``dim`` must be divisible by it.
        core (str): a core name of :data:`mmlinattn.core.ops.cores.CORES` (``'inline'`` by default,
            ``'softmax'``, ``'linear'``, ``'mala'``, ...).
        qkv_bias (bool): biases in the q/k/v projections.
        qkv_layout (str): ``'qkv'`` (one ``qkv`` Linear, the Swin family) or ``'q_kv'`` (``q`` and
            ``kv`` Linears, the PVT family) - the authors' parameter names.
        local_residual (bool | None): add InLine's local attention residual; ``None``: the core's
            default (on for ``inline``).
        kernel (str | None): feature map phi for the cores that take one (``None``: the core's
            default, ``identity`` for InLine, ``relu`` for linear).
        sr_ratio (int): spatial reduction of keys/values (PVT's softmax blocks; only cores marked
            ``reduced_kv`` and the ``'q_kv'`` layout): a strided conv and a LayerNorm (``sr``,
            ``norm``, eps ``norm_eps``).
        attn_drop (float): attention dropout, for the cores that take ``dropout_p`` (softmax).
        proj_drop (float): dropout after the output projection.
        norm_eps (float): eps of the spatial-reduction LayerNorm (torch's default 1e-5, as PVT v1).
        core_options (dict | None): further switches of the core (e.g. MALA's ``beta``/``gamma``);
            those the core does not take are not passed to it.
    """

    def __init__(self, dim: int, num_heads: int, core: str = 'inline', qkv_bias: bool = True,
                 qkv_layout: str = 'qkv', local_residual: Optional[bool] = None,
                 kernel: Optional[str] = None, sr_ratio: int = 1, attn_drop: float = 0.,
                 proj_drop: float = 0., norm_eps: float = 1e-5,
                 core_options: Optional[dict] = None):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        entry = _core_for_module(core, kernel)
        self.core, self.core_entry = core, entry
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.kernel = kernel
        self.core_options = dict(core_options or {})
        if qkv_layout == 'qkv':
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        elif qkv_layout == 'q_kv':
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        else:
            raise ValueError(f"qkv_layout must be 'qkv' or 'q_kv', got {qkv_layout!r}")
        self.qkv_layout = qkv_layout
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            if qkv_layout != 'q_kv':  # one fused qkv Linear cannot reduce keys/values alone
                raise ValueError(f"spatial reduction (sr_ratio={sr_ratio}) needs qkv_layout='q_kv' "
                                 f"(separate q and kv projections), not {qkv_layout!r}")
            if not entry.reduced_kv:
                reducible = [c.name for c in CORES.values() if c.reduced_kv]
                raise ValueError('spatial reduction (sr_ratio > 1) is only supported with the '
                                 f'cores {reducible}, not {core!r}')
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if local_residual is None:
            local_residual = entry.local_residual
        self.residual = LocalResidual(dim, num_heads) if local_residual else None

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        b, n, _ = t.shape
        return t.reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def _qkv(self, x: torch.Tensor, hw: Tuple[int, int]):
        b, n, c = x.shape
        if self.qkv_layout == 'qkv':
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            return self._heads(q), self._heads(k), self._heads(v), v
        q = self.q(x)
        kv_in = x
        if self.sr_ratio > 1:
            kv_in = self.sr(x.transpose(1, 2).reshape(b, c, *hw)).flatten(2).transpose(1, 2)
            kv_in = self.norm(kv_in)
        k, v = self.kv(kv_in).chunk(2, dim=-1)
        return self._heads(q), self._heads(k), self._heads(v), v

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        b, n, c = x.shape
        if hw[0] * hw[1] != n:
            raise ValueError(f'{n} tokens do not form a {hw[0]}x{hw[1]} map')
        q, k, v, v_tokens = self._qkv(x, hw)
        out = self.core_entry(q, k, v, scale=self.scale, kernel=self.kernel,
                              dropout_p=self.attn_drop if self.training else 0.,
                              **self.core_options)
        out = out.transpose(1, 2).reshape(b, n, c)
        if self.residual is not None:
            v_map = v_tokens.transpose(1, 2).reshape(b, c, *hw)
            out = out + self.residual(x, v_map).flatten(2).transpose(1, 2)
        return self.proj_drop(self.proj(out))

    @torch.no_grad()
    def queries_keys(self, x: torch.Tensor,
                     hw: Tuple[int, int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """The (B, h, N, d) queries and (B, h, M, d) keys the core sees for input ``x`` (M < N after
        spatial reduction)."""
        q, k, _, _ = self._qkv(x, hw)
        return q, k

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        q, k = self.queries_keys(x, hw)
        return self.core_entry.attention_matrix(q, k, scale=self.scale, kernel=self.kernel,
                                                **self.core_options)


class RoPE(nn.Module):
    """MAViT's 2-D rotary position embedding; the buffer ``angle`` matches the authors' checkpoints.

    Args:
        dim (int): channels.
        num_heads (int): heads; the head dim ``dim // num_heads`` must be divisible by 4.
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.register_buffer('angle', rope_angles(dim // num_heads))

    def forward(self, hw: Tuple[int, int]):
        return rope_sin_cos(hw, self.angle)


class QKVOAttention(nn.Module):
    """MAViT's attention module on channels-first maps (B, C, H, W).

    ``q, k, v, o = split(Conv1x1(C -> 4C)(x))``; ``out = proj((core(q, k, v) + lepe(v)) * o)`` with
    ``lepe`` a depthwise 5x5 conv. Core ``'mala'`` (stages 1-2 of MAViT) or ``'softmax'`` (stages
    3-4), both with 2-D RoPE as in the authors' code; any other core of the table for ablations.

    Args:
        dim (int): channels.
        num_heads (int): heads; the head dim must be divisible by 4 for RoPE.
        core (str): a core name of :data:`mmlinattn.core.ops.cores.CORES`.
        kernel (str | None): feature map for the cores that take one (``None``: the core's default).
        use_rope (bool): pass the stage's 2-D RoPE tables to the core (cores with ``rope='none'``
            ignore them).
        core_options (dict | None): further switches of the core, e.g. MALA's ``beta`` (``False``:
            beta = 1, the paper's ablation) and ``gamma`` (``False``: gamma = 0); those the core
            does not take are not passed to it.
        beta, gamma (bool | None): the former spelling of ``core_options=dict(beta=...,
            gamma=...)``, still read with a ``FutureWarning``.
    """

    def __init__(self, dim: int, num_heads: int, core: str = 'mala', kernel: Optional[str] = None,
                 use_rope: bool = True, core_options: Optional[dict] = None,
                 beta: Optional[bool] = None, gamma: Optional[bool] = None):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.core, self.core_entry = core, _core_for_module(core, kernel)
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.kernel, self.use_rope = kernel, use_rope
        self.core_options = dict(core_options or {})
        legacy = {k: v for k, v in (('beta', beta), ('gamma', gamma)) if v is not None}
        if legacy:
            warnings.warn(f'QKVOAttention: pass {sorted(legacy)} in core_options '
                          '(attn_cfg=dict(core_options=dict(...))), as every attention module '
                          'takes them', FutureWarning, stacklevel=2)
            self.core_options.update(legacy)
        self.qkvo = nn.Conv2d(dim, dim * 4, 1)
        self.lepe = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.proj = nn.Conv2d(dim, dim, 1)

    def _split(self, x):
        b, c, h, w = x.shape
        qkvo = self.qkvo(x)
        qkv, o = qkvo[:, :3 * c], qkvo[:, 3 * c:]
        lepe = self.lepe(qkv[:, 2 * c:])
        q, k, v = qkv.reshape(b, 3, self.num_heads, self.head_dim,
                              h * w).transpose(-2, -1).unbind(1)
        return q, k, v, o, lepe

    def forward(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v, o, lepe = self._split(x)
        out = self.core_entry(q, k, v, scale=self.scale, kernel=self.kernel,
                              rope=rope if self.use_rope else None, **self.core_options)
        out = out.transpose(-2, -1).reshape(b, c, h, w)
        return self.proj((out + lepe) * o)

    @torch.no_grad()
    def queries_keys(self, x: torch.Tensor, rope=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The (B, h, N, d) queries and keys of the map ``x``, before any RoPE rotation (which the
        core applies itself)."""
        q, k, _, _, _ = self._split(x)
        return q, k

    @torch.no_grad()
    def attention_matrix(self, x, rope=None):
        q, k = self.queries_keys(x)
        return self.core_entry.attention_matrix(q, k, scale=self.scale, kernel=self.kernel,
                                                rope=rope if self.use_rope else None,
                                                **self.core_options)
