"""InLine-PVT (docs/design.md section 2.2): PVTv1 with InLine attention, twice the heads, no spatial
reduction, per-stage learned position tables resized bilinearly, no final norm. Parameter names
equal the authors' flat ones (``patch_embed{i}``, ``pos_embed{i}``, ``block{i}.{j}``): their
ImageNet checkpoints load without ``head``; :meth:`InLinePVT.stage` gathers a stage's parts."""
import math
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer

from mmlinattn.core.models.layers import (
    DropPath,
    Mlp,
    PatchEmbed,
    TokenAttention,
    resize_pos_embed,
    run_block,
)
from mmlinattn.core.ops.cores import get_core
from mmlinattn.core.registry import MODELS
from mmlinattn.core.weights import AuthorsLayout

from .base import LinAttnBackbone

PVT_NORM = dict(type='LN', eps=1e-6)  # the blocks' LayerNorm, as PVT v1


class PVTBlock(nn.Module):
    """``x + attn(LN(x))``, then ``x + MLP(LN(x))``, each with drop path."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, core: str, drop_path: float,
                 sr_ratio: int = 1, attn_cfg: Optional[dict] = None, norm_cfg: dict = PVT_NORM):
        super().__init__()
        self.norm1 = build_norm_layer(norm_cfg, dim)[1]
        self.attn = TokenAttention(dim, num_heads, core=core, qkv_layout='q_kv', sr_ratio=sr_ratio,
                                   **(attn_cfg or {}))
        self.drop_path = DropPath(drop_path)
        self.norm2 = build_norm_layer(norm_cfg, dim)[1]
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x, hw):
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PVTStage(NamedTuple):
    """The parts of one InLine-PVT stage (registered under the authors' flat names)."""
    patch_embed: PatchEmbed
    pos_embed: nn.Parameter
    pos_drop: nn.Dropout
    blocks: nn.ModuleList


def _resize_pos_tables(state: Dict[str, torch.Tensor],
                       model: 'InLinePVT') -> Dict[str, torch.Tensor]:
    """Square position tables learned at another size, bilinearly resized to the model's."""
    out = dict(state)
    for i, hw in enumerate(model.pos_hw):
        key = f'pos_embed{i + 1}'
        if key in out and out[key].shape[1] != hw[0] * hw[1]:
            side = int(math.isqrt(out[key].shape[1]))
            if side * side == out[key].shape[1]:
                out[key] = resize_pos_embed(out[key], (side, side), hw)
    return out


@MODELS.register_module()
class InLinePVT(LinAttnBackbone):
    """InLine-PVT backbone (Han et al., "Bridging the Divide: Reconsidering Softmax and Linear
    Attention"). The shared arguments are :class:`LinAttnBackbone`'s; here:

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'medium'``, ``'large'``, or a dict that also
            has ``mlp_ratio`` (or the former ``mlp_ratios``) unless the argument is given.
        attn_type: default ``'IIII'``; ``S`` is PVT's spatial-reduction softmax (``sr_ratios``).
        attn_cfg: for :class:`TokenAttention`, also ``local_residual``, ``norm_eps``.
        frozen_stages (int): 0 is the first patch embedding and position table.
        drop_rate (float): dropout after adding the position tables.
        pretrain_img_size (int): size the position tables were learned at (224).
        patch_size (int): stride of the first patch embedding (4).
        sr_ratios (Sequence[int]): spatial reduction per stage of the ``S`` stages.
        mlp_ratio (float | Sequence[float] | None): MLP hidden width / channels, one value or one
            per stage (``None``: the arch's, 8/8/4/4).
        out_norm (bool): off by default (the authors' model has none).
        pad_patches (bool): ``False`` (PVT v1): each patch conv drops the remainder, so inputs need
            >= 32 px per side; ``True`` zero-pads the bottom/right (any size, ceil-sized maps).
        norm_cfg (dict): ``LN``, eps 1e-6 as PVT v1 (the patch embeddings keep eps 1e-5).
        init_scheme (str): the init without a checkpoint (docs/design.md): ``'trunc_normal'``
            (Linear and conv weights trunc-normal std 0.02, biases 0), ``'authors'`` (their code:
            Linears so, convolutions torch's default) or ``'mmdet_pvt'`` (mmdet's
            ``PyramidVisionTransformer``: convolutions and MLPs normal std sqrt(2 / fan_out),
            q|k|v xavier-uniform).
    """
    arch_zoo = {
        'tiny': dict(depths=[2, 2, 2, 2], drop_path_rate=0.1),
        'small': dict(depths=[3, 4, 6, 3], drop_path_rate=0.1),
        'medium': dict(depths=[3, 4, 18, 3], drop_path_rate=0.3),
        'large': dict(depths=[3, 8, 27, 3], drop_path_rate=0.3),
    }
    for _v in arch_zoo.values():
        _v.update(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], mlp_ratio=[8, 8, 4, 4])
    del _v
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    default_attn_type = 'IIII'
    authors_layout = AuthorsLayout('inline_pvt', classification=('head.',),
                                   adapt=_resize_pos_tables)
    init_schemes = ('trunc_normal', 'authors', 'mmdet_pvt')

    def __init__(self, arch='tiny', in_channels: int = 3, attn_type: Optional[str] = None,
                 attn_cfg: Optional[dict] = None, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 drop_path_rate: Optional[float] = None, drop_rate: float = 0.,
                 pretrain_img_size: int = 224, patch_size: int = 4,
                 sr_ratios: Sequence[int] = (8, 4, 2, 1), out_norm: bool = False,
                 pad_patches: bool = False, mlp_ratio=None, norm_cfg: dict = PVT_NORM,
                 init_scheme: str = 'trunc_normal', init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if init_scheme not in self.init_schemes:
            raise ValueError(f'{type(self).__name__}: init_scheme={init_scheme!r} must be one of '
                             f'{list(self.init_schemes)}')
        self.init_scheme = init_scheme
        arch = self._setup(arch, out_indices, frozen_stages, norm_eval, with_cp, drop_path_rate)
        self._check_attn_cfg(attn_cfg, TokenAttention,
                             ('dim', 'num_heads', 'core', 'qkv_layout', 'sr_ratio'))
        self._set_dims(arch['embed_dims'])
        dims, depths, n = self.embed_dims, self.depths, self.num_stages
        heads = list(arch['num_heads'])
        ratios = self._mlp_ratios(arch, mlp_ratio)
        cores = self._block_cores(attn_type, arch)
        self.pos_hw = []
        side = pretrain_img_size // patch_size
        for i in range(n):
            if i > 0:
                side = side // 2
            self.pos_hw.append((side, side))
            # the authors' flat names: patch_embed{i}, pos_embed{i}, pos_drop{i}, block{i}
            setattr(self, f'patch_embed{i + 1}',
                    PatchEmbed(in_channels if i == 0 else dims[i - 1], dims[i],
                               patch_size if i == 0 else 2, pad=pad_patches))
            setattr(self, f'pos_embed{i + 1}', nn.Parameter(torch.zeros(1, side * side, dims[i])))
            setattr(self, f'pos_drop{i + 1}', nn.Dropout(drop_rate))
            setattr(self, f'block{i + 1}', nn.ModuleList([
                PVTBlock(dims[i], heads[i], ratios[i], cores[i][j], self.dpr[i][j],
                         sr_ratio=sr_ratios[i] if get_core(cores[i][j]).reduced_kv else 1,
                         attn_cfg=attn_cfg, norm_cfg=norm_cfg)
                for j in range(depths[i])]))
        self._build_out_norms(out_norm, norm_cfg)
        self._freeze_stages()

    def _mlp_ratios(self, arch: dict, mlp_ratio) -> List[float]:
        ratio = mlp_ratio if mlp_ratio is not None else arch.get('mlp_ratio',
                                                                 arch.get('mlp_ratios'))
        if ratio is None:
            raise ValueError(f'{type(self).__name__}: give mlp_ratio (one value or one per stage) '
                             'in the arch dict or as an argument')
        ratios = list(ratio) if isinstance(ratio, (list, tuple)) else [ratio] * self.num_stages
        if len(ratios) != self.num_stages:
            raise ValueError(f'{type(self).__name__}: mlp_ratio {ratio!r} needs one value per '
                             f'stage ({self.num_stages})')
        return ratios

    def stage(self, i: int) -> PVTStage:
        """The parts of stage ``i`` (0-based)."""
        return PVTStage(*(getattr(self, f'{name}{i + 1}') for name in PVTStage._fields[:3]),
                        getattr(self, f'block{i + 1}'))

    def _post_init(self):
        for i in range(self.num_stages):
            nn.init.trunc_normal_(self.stage(i).pos_embed, std=.02)
        if self.init_scheme == 'authors':  # their code initialises Linears and LayerNorms only
            for m in self.modules():
                if isinstance(m, (nn.Conv1d, nn.Conv2d)):
                    m.reset_parameters()
        elif self.init_scheme == 'mmdet_pvt':
            self._init_as_mmdet_pvt()

    def _init_as_mmdet_pvt(self):
        """mmdet's ``PyramidVisionTransformer.init_weights``: convolutions and MLPs normal(0, sqrt(2
        / fan_out)), q and kv uniform within sqrt(6 / 4C) (xavier on the fused q|k|v), biases 0."""
        def fan_out_normal(m):
            fan_out = m.weight.shape[0] * m.weight[0, 0].numel() // getattr(m, 'groups', 1)
            nn.init.normal_(m.weight, 0., math.sqrt(2. / fan_out))
            if m.bias is not None:
                nn.init.zeros_(m.bias)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out_normal(m)
            elif isinstance(m, PVTBlock):
                fan_out_normal(m.mlp.fc1)
                fan_out_normal(m.mlp.fc2)
                bound = math.sqrt(6. / (4 * m.attn.dim))
                for lin in (m.attn.q, m.attn.kv):
                    nn.init.uniform_(lin.weight, -bound, bound)

    def _stage_modules(self, i):
        # 0: the stem (patch_embed1 + pos_embed1); s >= 1: everything of stage s
        if i == 0:
            return [self.patch_embed1, self.pos_embed1]
        parts = self.stage(i - 1)
        return [parts.patch_embed, parts.pos_embed, parts.blocks]

    def forward_stem(self, x):
        return x  # each stage starts with its own patch embedding

    def get_pos_embed(self, i: int, hw: Tuple[int, int]) -> torch.Tensor:
        return resize_pos_embed(self.stage(i).pos_embed, self.pos_hw[i], hw)

    def run_stage(self, i: int, x: torch.Tensor, downsample: bool = True):
        """Stage ``i`` -> ``(its NCHW map, the same map)`` (it downsamples at its start)."""
        parts = self.stage(i)
        x, hw = parts.patch_embed(x)
        x = parts.pos_drop(x + self.get_pos_embed(i, hw))
        for blk in parts.blocks:
            x = run_block(blk, self.with_cp, x, hw)
        x = x.transpose(1, 2).reshape(x.shape[0], -1, *hw)
        return x, x
