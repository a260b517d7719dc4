"""Attention modules: ``TokenAttention`` on (B, N, C) tokens of an H x W map (InLine-Swin,
InLine-PVT), ``QKVOAttention`` (MAViT's) and ``WindowSoftmaxAttention`` (:mod:`.window`, Swin's),
each running a core of :data:`mmlinattn.core.ops.cores.CORES` chosen by name (docs/design.md section
1.6). Their shared keywords are :class:`AttentionModule`'s; ``forward(x, *context)``,
``attention_matrix(x, *context)`` (the explicit A: core output = A @ v) and ``queries_keys(x)``."""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn

from mmlinattn.core.ops import dynamic_depthwise_conv3x3, rope_sin_cos
from mmlinattn.core.ops.cores import CORES, get_core
from mmlinattn.core.ops.kernels import rope_angles


def core_matrix(core: str, q, k, scale: Optional[float] = None, kernel: Optional[str] = None,
                rope=None, attn_bias=None, **options):
    """The explicit (B, h, N, N) attention matrix of ``core`` (quadratic; analysis only)."""
    return get_core(core).attention_matrix(q, k, scale=scale, kernel=kernel, rope=rope,
                                           attn_bias=attn_bias, **options)


def _option_owners() -> Dict[str, list]:
    """option name -> the cores that take it (``dropout_p`` excluded: ``attn_drop`` sets it)."""
    owners: Dict[str, list] = {}
    for c in CORES.values():
        for o in c.options:
            if o != 'dropout_p':
                owners.setdefault(o, []).append(c.name)
    return owners


def check_core_options(core_options: Optional[dict], owner: str) -> dict:
    """``core_options`` as a dict of options of some core (not ``dropout_p``: ``attn_drop``)."""
    if core_options is None:
        return {}
    if not isinstance(core_options, dict):
        raise TypeError(f'{owner}: core_options must be a dict, got '
                        f'{type(core_options).__name__}')
    if 'dropout_p' in core_options:
        raise ValueError(f'{owner}: core_options cannot set dropout_p; write attn_drop='
                         f'{core_options["dropout_p"]!r} (applied while training only)')
    owners = _option_owners()
    bad = [k for k in core_options if k not in owners]
    if bad:
        known = ', '.join(f'{o} ({"/".join(cs)})' for o, cs in owners.items()) or 'none'
        raise ValueError(f'{owner}: core_options {bad} are options of no attention core; the '
                         f'cores take: {known}')
    return dict(core_options)


def refuse_core_keywords(owner: str, kwargs: dict, removed: Tuple[str, ...] = ()) -> None:
    """A core's option (or a ``removed`` one) as a module's keyword: a ``TypeError``."""
    owners = _option_owners()
    misplaced = {k: v for k, v in kwargs.items() if k in owners or k in removed}
    if not misplaced:
        return
    opts = ', '.join(f'{k}={v!r}' for k, v in misplaced.items())
    gone = [k + '=' for k in misplaced if k in removed]
    note = (f' ({", ".join(gone)}: removed in 0.2.0, see docs/changelog.md)' if gone else '')
    raise TypeError(f'{owner} takes no keyword {", ".join(misplaced)}: options of the attention '
                    f'core go in core_options - write core_options=dict({opts}) (in a backbone '
                    f'config: attn_cfg=dict(core_options=dict({opts})))' + note)


class AttentionModule(nn.Module):
    """Base of the attention modules: subclasses call :meth:`_init_core` first and run the core by
    :meth:`_run_core` / :meth:`_core_matrix`.

    Shared Args:
        dim (int): channels; divisible by ``num_heads``.
        num_heads (int): heads.
        core (str): a core name of :data:`mmlinattn.core.ops.cores.CORES`.
        qkv_bias (bool): biases in the query/key/value projection.
        kernel (str | None): feature map phi (``None``: the core's default; cores without kernels
            ignore it).
        attn_drop (float): attention dropout while training, for cores that take ``dropout_p``.
        proj_drop (float): dropout after the output projection.
        core_options (dict | None): options of the core (MALA's ``beta`` / ``gamma``).
    """

    #: keywords the module read until 0.2.0 (named as removed in the error)
    removed_keywords: Tuple[str, ...] = ()

    def __new__(cls, *args, **kwargs):
        # here, not in __init__: the signatures stay exact (backbones read them)
        refuse_core_keywords(cls.__name__, kwargs, cls.removed_keywords)
        return super().__new__(cls)

    def _init_core(self, dim: int, num_heads: int, core: str, kernel: Optional[str],
                   attn_drop: float, core_options: Optional[dict]) -> None:
        owner = type(self).__name__
        if dim % num_heads:
            raise ValueError(f'{owner}: dim {dim} is not divisible by num_heads {num_heads}')
        entry = get_core(core)
        self.core, self.core_entry = core, entry
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.kernel = kernel
        self.attn_drop = attn_drop
        self.core_options = check_core_options(core_options, owner)
        self._bound = entry.bind(scale=self.scale, kernel=kernel, **self.core_options)

    def _run_core(self, q, k, v, **context) -> torch.Tensor:
        """The core's output for (..., h, N, d) q, k, v; ``context``: ``rope`` / ``attn_bias``."""
        return self.core_entry.run(q, k, v, self._bound,
                                   dropout_p=self.attn_drop if self.training else 0., **context)

    def _core_matrix(self, q, k, **context) -> torch.Tensor:
        """The core's explicit matrix from the same settings as :meth:`_run_core`."""
        return self.core_entry.attention_matrix(q, k, scale=self.scale, kernel=self.kernel,
                                                **context, **self.core_options)


class LocalResidual(nn.Sequential):
    """InLine's local residual: mean token -> Conv1d(C, C) -> GELU -> Conv1d(C, 9C) (grouped by
    head; the authors' ``0``, ``2``) -> per-channel 3x3 kernels on the values' map."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__(nn.Conv1d(dim, dim, 1, groups=num_heads), nn.GELU(),
                         nn.Conv1d(dim, dim * 9, 1, groups=num_heads))

    def forward(self, x: torch.Tensor, v_map: torch.Tensor) -> torch.Tensor:
        """x: (B, N, C) attention input; v_map: (B, C, H, W) values. Returns (B, C, H, W)."""
        weight = super().forward(x.mean(dim=1).unsqueeze(-1))  # (B, 9C, 1)
        return dynamic_depthwise_conv3x3(v_map, weight)


class TokenAttention(AttentionModule):
    """Global multi-head attention over the N = H*W tokens of a map: ``forward(x, hw)``, (B, N, C).

    Args:
        dim, num_heads, core, qkv_bias, kernel, attn_drop, proj_drop, core_options: as
            :class:`AttentionModule` (``core`` ``'inline'`` by default).
        qkv_layout (str): ``'qkv'`` (one ``qkv`` Linear, Swin) or ``'q_kv'`` (``q``, ``kv``; PVT).
        local_residual (bool | None): InLine's local residual; ``None``: the core's default.
        sr_ratio (int): spatial reduction of keys/values (``reduced_kv`` cores, ``'q_kv'``): a
            strided conv ``sr`` and a LayerNorm ``norm`` of eps ``norm_eps`` (1e-5, as PVT v1).
    """

    def __init__(self, dim: int, num_heads: int, *, core: str = 'inline', qkv_bias: bool = True,
                 kernel: Optional[str] = None, attn_drop: float = 0., proj_drop: float = 0.,
                 core_options: Optional[dict] = None, qkv_layout: str = 'qkv',
                 local_residual: Optional[bool] = None, sr_ratio: int = 1,
                 norm_eps: float = 1e-5):
        super().__init__()
        self._init_core(dim, num_heads, core, kernel, attn_drop, core_options)
        entry = self.core_entry
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
        else:
            q, kv_in = self.q(x), x
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
        out = self._run_core(q, k, v)
        out = out.transpose(1, 2).reshape(b, n, c)
        if self.residual is not None:
            v_map = v_tokens.transpose(1, 2).reshape(b, c, *hw)
            out = out + self.residual(x, v_map).flatten(2).transpose(1, 2)
        return self.proj_drop(self.proj(out))

    @torch.no_grad()
    def queries_keys(self, x: torch.Tensor,
                     hw: Tuple[int, int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """The (B, h, N, d) queries and (B, h, M, d) keys the module hands its core."""
        q, k, _, _ = self._qkv(x, hw)
        return q, k

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """The core's explicit (B, h, N, M) matrix for ``forward(x, hw)`` (no local residual)."""
        q, k = self.queries_keys(x, hw)
        return self._core_matrix(q, k)


class RoPE(nn.Module):
    """MAViT's 2-D rotary position embedding (buffer ``angle``); head dim divisible by 4."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.register_buffer('angle', rope_angles(dim // num_heads))

    def forward(self, hw: Tuple[int, int]):
        return rope_sin_cos(hw, self.angle)


class QKVOAttention(AttentionModule):
    """MAViT's attention on (B, C, H, W) maps: ``q, k, v, o = split(Conv1x1(C -> 4C)(x))``,
    ``out = proj((core(q, k, v) + lepe(v)) * o)``, ``lepe`` a depthwise 5x5 conv; core ``'mala'``
    (stages 1-2) or ``'softmax'`` (3-4). ``forward(x, rope=None)``: the stage's (sin, cos) tables.

    Args:
        dim, num_heads, core, qkv_bias, kernel, attn_drop, proj_drop, core_options: as
            :class:`AttentionModule`; ``qkv_bias``: the ``qkvo`` conv's; head dim divisible by 4.
        use_rope (bool): pass the stage's RoPE tables to the core.
    """
    removed_keywords = ('beta', 'gamma')  # core_options=dict(beta=..., gamma=...) since 0.2.0

    def __init__(self, dim: int, num_heads: int, *, core: str = 'mala', qkv_bias: bool = True,
                 kernel: Optional[str] = None, attn_drop: float = 0., proj_drop: float = 0.,
                 core_options: Optional[dict] = None, use_rope: bool = True):
        super().__init__()
        self._init_core(dim, num_heads, core, kernel, attn_drop, core_options)
        self.use_rope = use_rope
        self.qkvo = nn.Conv2d(dim, dim * 4, 1, bias=qkv_bias)
        self.lepe = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.proj = nn.Conv2d(dim, dim, 1)
        self.proj_drop = nn.Dropout(proj_drop)

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
        out = self._run_core(q, k, v, rope=rope if self.use_rope else None)
        out = out.transpose(-2, -1).reshape(b, c, h, w)
        return self.proj_drop(self.proj((out + lepe) * o))

    @torch.no_grad()
    def queries_keys(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The (B, h, N, d) queries and keys the module hands its core (before any RoPE)."""
        q, k, _, _, _ = self._split(x)
        return q, k

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        """The core's explicit (B, h, N, N) matrix for ``forward(x, rope)``, RoPE included."""
        q, k = self.queries_keys(x)
        return self._core_matrix(q, k, rope=rope if self.use_rope else None)
