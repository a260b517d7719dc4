"""MAViT: the MALA backbone (docs/design.md section 2.3). Parameter names equal the authors': their
ImageNet checkpoints load without ``proj``, ``norm``, ``head``. Outputs: each stage's features
before its downsampling, through a new norm ``extra_norms.{i}``."""
import warnings
from typing import Optional, Sequence

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer

from mmlinattn.core.models.layers import DropPath, LayerNorm2d, QKVOAttention, RoPE, run_block
from mmlinattn.core.registry import MODELS
from mmlinattn.core.weights import AuthorsLayout

from .base import LinAttnBackbone

MAVIT_NORM = dict(type='LN', eps=1e-6)  # the blocks' LayerNorm over channels, as the authors'
CONV_NORM = dict(type='BN', requires_grad=True)  # the stem's and downsampling's, as the authors'


class ConvFFN(nn.Module):
    """1x1 -> GELU -> (t + DWConv3x3(t)) -> 1x1 (names ``fc1``, ``dwconv``, ``fc2``)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.act = nn.GELU()
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.fc2 = nn.Conv2d(hidden, dim, 1)

    def forward(self, x):
        x = self.act(self.fc1(x))
        return self.fc2(x + self.dwconv(x))


class MAViTBlock(nn.Module):
    """CPE -> x + gamma_1 * attn(LN(x)) -> x + gamma_2 * FFN(LN(x)), with drop path (gammas from
    ``layer_scale``; ``None``: none)."""

    def __init__(self, dim: int, num_heads: int, core: str, mlp_ratio: float = 3.5,
                 drop_path: float = 0., layer_scale: Optional[float] = 1.0,
                 attn_cfg: Optional[dict] = None, norm_cfg: dict = MAVIT_NORM):
        super().__init__()
        self.pos = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)
        self.norm1 = LayerNorm2d(dim, norm_cfg=norm_cfg)
        self.attn = QKVOAttention(dim, num_heads, core=core, **(attn_cfg or {}))
        self.drop_path = DropPath(drop_path)
        self.norm2 = LayerNorm2d(dim, norm_cfg=norm_cfg)
        self.ffn = ConvFFN(dim, int(mlp_ratio * dim))
        self.layer_scale = layer_scale
        if layer_scale is not None:
            self.gamma_1 = nn.Parameter(torch.full((1, dim, 1, 1), float(layer_scale)))
            self.gamma_2 = nn.Parameter(torch.full((1, dim, 1, 1), float(layer_scale)))

    def forward(self, x, rope):
        x = x + self.pos(x)
        a = self.attn(self.norm1(x), rope)
        if self.layer_scale is not None:
            a = self.gamma_1 * a
        x = x + self.drop_path(a)
        f = self.ffn(self.norm2(x))
        if self.layer_scale is not None:
            f = self.gamma_2 * f
        return x + self.drop_path(f)


class Downsample(nn.Module):
    """Conv3x3 stride 2 (``dim`` -> ``out_dim``) + a ``norm_cfg`` norm (``reduction``, ``norm``)."""

    def __init__(self, dim: int, out_dim: int, norm_cfg: dict):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = build_norm_layer(norm_cfg, out_dim)[1]

    def forward(self, x):
        return self.norm(self.reduction(x))


class MAViTStage(nn.Module):
    """Its 2-D RoPE tables, ``depth`` :class:`MAViTBlock` and a :class:`Downsample` (or none)."""

    def __init__(self, dim: int, out_dim: Optional[int], depth: int, num_heads: int,
                 cores: Sequence[str], dprs: Sequence[float], layer_scale: Optional[float],
                 conv_norm_cfg: dict, mlp_ratio: float = 3.5, attn_cfg: Optional[dict] = None,
                 with_cp: bool = False, norm_cfg: dict = MAVIT_NORM):
        super().__init__()
        self.with_cp = with_cp
        self.RoPE = RoPE(dim, num_heads)
        self.blocks = nn.ModuleList([
            MAViTBlock(dim, num_heads, cores[i], mlp_ratio, dprs[i], layer_scale, attn_cfg,
                       norm_cfg)
            for i in range(depth)])
        self.downsample = Downsample(dim, out_dim, conv_norm_cfg) if out_dim else None

    def forward(self, x: torch.Tensor, downsample: bool = True):
        """(B, C, H, W) -> ``(the map before the downsampling, after it)``."""
        rope = self.RoPE(x.shape[-2:])
        for blk in self.blocks:
            x = run_block(blk, self.with_cp, x, rope)
        if downsample and self.downsample is not None:
            return x, self.downsample(x)
        return x, x


class Stem(nn.Module):
    """Four 3x3 convs with norms, stride 4 in total (names ``proj.{0,1,3,4,6,7,9,10}``)."""

    def __init__(self, in_channels: int, dim: int, norm_cfg: dict):
        super().__init__()
        half = dim // 2
        layers = []
        for cin, cout, stride, act in [(in_channels, half, 2, True), (half, half, 1, True),
                                       (half, half, 1, True), (half, dim, 2, False)]:
            layers += [nn.Conv2d(cin, cout, 3, stride, 1), build_norm_layer(norm_cfg, cout)[1]]
            if act:
                layers.append(nn.GELU())
        self.proj = nn.Sequential(*layers)

    def forward(self, x):
        return self.proj(x)


@MODELS.register_module()
class MAViT(LinAttnBackbone):
    """MAViT backbone with MALA attention (Fan et al., "Rectifying Magnitude Neglect in Linear
    Attention"). The shared arguments are :class:`LinAttnBackbone`'s; here:

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'``, ``'large'``, or a dict (optionally
            with ``layer_scale``).
        attn_type: default ``'MMSS'``, as the released models.
        attn_cfg: for :class:`QKVOAttention`, also ``use_rope``.
        mlp_ratio (float): ConvFFN hidden width / channels (3.5); ``ffn_ratio``, its former name,
            is read with a ``FutureWarning``.
        norm_cfg (dict): ``LN``, eps 1e-6.
        conv_norm_cfg (dict): the norm after each conv of the stem and the downsampling (``BN``;
            ``SyncBN`` multi-GPU); a BatchNorm ``norm_cfg`` (its former meaning) is read as this,
            with a ``FutureWarning``.
        layer_scale_init (float | list | None): override the arch's initial LayerScale values.
        init_cfg (dict | None): may also set ``use_ema=True`` (the file's ``model_ema``).
    """
    arch_zoo = {
        'tiny': dict(embed_dims=[64, 128, 256, 512], depths=[2, 2, 6, 2], num_heads=[1, 2, 4, 8],
                     drop_path_rate=0.1, layer_scale=[1., 1., 1., 1.]),
        'small': dict(embed_dims=[64, 128, 320, 512], depths=[3, 5, 9, 3], num_heads=[1, 2, 5, 8],
                      drop_path_rate=0.15, layer_scale=[1., 1., 1., 1.]),
        'base': dict(embed_dims=[96, 192, 384, 512], depths=[4, 6, 12, 6], num_heads=[1, 2, 6, 8],
                     drop_path_rate=0.4, layer_scale=[1., 1., 1e-6, 1e-6]),
        'large': dict(embed_dims=[96, 192, 448, 640], depths=[4, 7, 19, 8], num_heads=[1, 2, 7, 10],
                      drop_path_rate=0.55, layer_scale=[1e-6] * 4),
    }
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    default_attn_type = 'MMSS'
    out_norm_name = 'extra_norms'  # the authors' downstream name (extra_norms.<i>.norm.*)
    # classification parts: the 1x1 projection + BN before pooling, and the head
    authors_layout = AuthorsLayout(
        'mavit', classification=('head.', 'proj.', 'norm.'), optional=('angle',),
        classifier=(('head.', 'head.fc.'), ('proj.', 'neck.proj.'), ('norm.', 'neck.norm.')),
        conv_head=True)

    def __init__(self, arch='tiny', in_channels: int = 3, attn_type: Optional[str] = None,
                 attn_cfg: Optional[dict] = None, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 drop_path_rate: Optional[float] = None, mlp_ratio: float = 3.5,
                 norm_cfg: dict = MAVIT_NORM, conv_norm_cfg: dict = CONV_NORM,
                 out_norm: bool = True,
                 layer_scale_init=None, init_cfg=None, ffn_ratio: Optional[float] = None):
        super().__init__(init_cfg=init_cfg)
        if 'BN' in str(norm_cfg.get('type', '')):  # the former meaning: the convolutions' BN
            warnings.warn('MAViT: norm_cfg now sets the blocks\' and output norms, as in every '
                          'family; the stem\'s and downsampling\'s BatchNorm is conv_norm_cfg '
                          f'(read {norm_cfg} as conv_norm_cfg)', FutureWarning, stacklevel=2)
            norm_cfg, conv_norm_cfg = MAVIT_NORM, norm_cfg
        if ffn_ratio is not None:
            warnings.warn('MAViT: ffn_ratio is now called mlp_ratio (as in the other backbones)',
                          FutureWarning, stacklevel=2)
            mlp_ratio = ffn_ratio
        arch = self._setup(arch, out_indices, frozen_stages, norm_eval, with_cp, drop_path_rate)
        self._check_attn_cfg(attn_cfg, QKVOAttention)
        self._set_dims(arch['embed_dims'])
        dims, depths, n = self.embed_dims, self.depths, self.num_stages
        heads = list(arch['num_heads'])
        layer_scale = arch.get('layer_scale', [None] * n)
        if layer_scale_init is not None:
            layer_scale = (list(layer_scale_init) if isinstance(layer_scale_init, (list, tuple))
                           else [layer_scale_init] * n)
        cores = self._block_cores(attn_type, arch)
        self.patch_embed = Stem(in_channels, dims[0], conv_norm_cfg)
        self.layers = nn.ModuleList([
            MAViTStage(dims[i], dims[i + 1] if i < n - 1 else None, depths[i], heads[i], cores[i],
                       self.dpr[i], layer_scale[i], conv_norm_cfg, mlp_ratio, attn_cfg, with_cp,
                       norm_cfg)
            for i in range(n)])
        self._build_out_norms(out_norm, norm_cfg)
        self._freeze_stages()
        # MAViT's maps are channels-last in memory (the (B, N, C) tokens viewed as NCHW), so the
        # convolutions' weight gradients come out channels-last: weights in that layout get
        # gradients in their own layout, which DDP's buckets take without a copy ("Grad strides
        # do not match bucket view strides"). The values, and the state dict, are unchanged.
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and m.weight.is_contiguous(
                    memory_format=torch.channels_last):  # 1x1 and depthwise: the same memory
                w = torch.empty_like(m.weight.data, memory_format=torch.channels_last)
                m.weight.data = w.copy_(m.weight.data)  # (size-1 dims' strides too)

    def _post_init(self):
        for layer in self.layers:
            for blk in layer.blocks:
                if blk.layer_scale is not None:
                    nn.init.constant_(blk.gamma_1, blk.layer_scale)
                    nn.init.constant_(blk.gamma_2, blk.layer_scale)
