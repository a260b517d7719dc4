"""MAViT: the MALA backbone (docs/design.md section 2.3).

Parameter names equal the authors' (``patch_embed.proj.{0,1,3,4,6,7,9,10}``,
``layers.{s}.blocks.{b}.{pos,norm1.norm,attn.qkvo,attn.lepe,attn.proj,norm2.norm,ffn.*,gamma_1,gamma_2}``,
``layers.{s}.RoPE.angle``, ``layers.{s}.downsample.{reduction,norm}``), so their ImageNet
checkpoints load by dropping the classification parts (``proj``, ``norm``, ``head``). Downstream
outputs are each stage's features *before* its downsampling, each through a new LayerNorm
``extra_norms.{i}``.
"""
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
    """1x1 -> GELU -> (t + DWConv3x3(t)) -> 1x1 (names ``fc1``, ``dwconv``, ``fc2``).

    Args:
        dim (int): channels in and out.
        hidden (int): hidden channels.
    """

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
    """CPE -> x + gamma_1 * attn(LN(x)) -> x + gamma_2 * FFN(LN(x)).

    Args:
        dim (int): channels.
        num_heads (int): heads.
        core (str): a core of :data:`mmlinattn.core.ops.cores.CORES`.
        mlp_ratio (float): ConvFFN hidden width / ``dim`` (3.5).
        drop_path (float): stochastic depth rate of this block.
        layer_scale (float | None): initial LayerScale (``gamma_1``, ``gamma_2``); ``None``: none.
        attn_cfg (dict | None): further :class:`QKVOAttention` keywords (the shared ones,
            ``use_rope``).
        norm_cfg (dict): the two norms over channels (``LN``, eps 1e-6).
    """

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
    """Conv3x3 stride 2 + norm (names ``reduction``, ``norm``).

    Args:
        dim (int): input channels.
        out_dim (int): output channels.
        norm_cfg (dict): the norm after the conv (BN in the released models).
    """

    def __init__(self, dim: int, out_dim: int, norm_cfg: dict):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = build_norm_layer(norm_cfg, out_dim)[1]

    def forward(self, x):
        return self.norm(self.reduction(x))


class MAViTStage(nn.Module):
    """A stage: its 2-D RoPE tables (``RoPE.angle``), ``depth`` blocks and the downsampling after
    them.

    Args:
        dim (int): channels.
        out_dim (int | None): channels after the downsampling (``None``: the last stage, none).
        depth (int): blocks.
        num_heads (int): heads.
        cores (list[str]): one core name per block.
        dprs (list[float]): one drop-path rate per block.
        layer_scale (float | None): initial LayerScale of the blocks (``None``: no LayerScale).
        conv_norm_cfg (dict): norm of the downsampling convolution (BN).
        mlp_ratio (float): ConvFFN hidden width / ``dim``.
        attn_cfg (dict | None): further :class:`QKVOAttention` keywords.
        with_cp (bool): activation checkpointing of each block while training.
        norm_cfg (dict): the blocks' norms over channels.
    """

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
        """(B, C, H, W) through the blocks -> ``(output, next stage's input)``: the map before the
        downsampling (the stage's output), and after it (the map itself for the last stage or when
        ``downsample`` is False)."""
        rope = self.RoPE(x.shape[-2:])
        for blk in self.blocks:
            x = run_block(blk, self.with_cp, x, rope)
        if downsample and self.downsample is not None:
            return x, self.downsample(x)
        return x, x


class Stem(nn.Module):
    """Four 3x3 convs, stride 4 in total (names ``proj.{0,1,3,4,6,7,9,10}``).

    Args:
        in_channels (int): image channels.
        dim (int): output channels (stage 1's width).
        norm_cfg (dict): the norm after each conv.
    """

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
    Attention").

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'``, ``'large'`` (or t/s/b/l), or a dict
            with ``embed_dims, depths, num_heads`` (and optionally ``drop_path_rate``,
            ``layer_scale``).
        in_channels (int): image channels.
        attn_type (str | list | None): the core of every block (see
            :func:`mmlinattn.core.ops.cores.parse_attn_type`): one letter per stage, ``M`` MALA,
            ``S`` softmax, ``L`` plain linear, ``I`` InLine, ... or a mixed stage in parentheses.
            Default ``'MMSS'`` as the released models; ``'MMMM'`` is all-MALA.
        attn_cfg (dict | None): keywords of every block's :class:`QKVOAttention`: the shared
            ``qkv_bias``, ``kernel``, ``attn_drop``, ``proj_drop``, ``core_options`` (e.g.
            ``dict(core_options=dict(beta=False))`` for MALA's ablations), and ``use_rope``.
        out_indices (Sequence[int]): stages whose features are returned.
        frozen_stages (int): -1 nothing frozen, 0 the stem, k also stages 1..k.
        norm_eval (bool): keep BatchNorm layers (``conv_norm_cfg``'s) in eval mode while training.
        with_cp (bool): activation checkpointing of each block while training.
        drop_path_rate (float | None): stochastic depth at the last block (``None``: the arch's).
        mlp_ratio (float): ConvFFN hidden width / channels (3.5). ``ffn_ratio``, its former name,
            is still read, with a ``FutureWarning``.
        norm_cfg (dict): the family's transformer norm (``LN``, eps 1e-6): the blocks' two norms
            and the output norms, as in every family.
        conv_norm_cfg (dict): the norm after each convolution of the stem and the downsampling
            (``BN``; ``SyncBN`` for multi-GPU, as the released detectors). A BatchNorm config given
            as ``norm_cfg`` (its meaning before it was the same in every family) is read as this,
            with a ``FutureWarning``.
        out_norm (bool): add the output norm on each returned stage (the authors' downstream setup).
        layer_scale_init (float | list | None): override the arch's initial LayerScale values
            (e.g. a small value to start the blocks near identity when training from scratch).
        init_cfg (dict | None): ``dict(type='Pretrained', checkpoint=PATH, use_ema=False)`` loads
            the authors' ``MAViT_*.pth`` directly (``use_ema=True`` picks ``model_ema``).
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

    def _post_init(self):
        for layer in self.layers:
            for blk in layer.blocks:
                if blk.layer_scale is not None:
                    nn.init.constant_(blk.gamma_1, blk.layer_scale)
                    nn.init.constant_(blk.gamma_2, blk.layer_scale)

    def _stage_modules(self, i):
        return [self.patch_embed] if i == 0 else [self.layers[i - 1]]

    def forward_stem(self, x):
        return self.patch_embed(x)
