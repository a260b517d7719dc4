"""InLine-PVT (docs/design.md section 2.2): PVTv1 with InLine attention, twice the heads, no spatial
reduction, per-stage learned position tables resized bilinearly, no final norm.

Parameter names equal the authors' (``patch_embed{i}.{proj,norm}``, ``pos_embed{i}``,
``block{i}.{j}.{norm1,attn.{q,kv,proj,residual.0,residual.2},norm2,mlp.fc1,mlp.fc2}``), so their
ImageNet checkpoints load by dropping ``head``.
"""
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from mmlinattn.checkpoint import resize_pos_embed
from mmlinattn.models.layers import DropPath, Mlp, PatchEmbed, TokenAttention
from mmlinattn.registry import MODELS

from .base import LinAttnBackbone
from .utils import parse_stage_attn


class PVTBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio, core, drop_path, sr_ratio=1, attn_cfg=None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = TokenAttention(dim, num_heads, core=core, qkv_layout='q_kv', sr_ratio=sr_ratio,
                                   **(attn_cfg or {}))
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x, hw):
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))


@MODELS.register_module()
class InLinePVT(LinAttnBackbone):
    """InLine-PVT backbone (Han et al., "Bridging the Divide: Reconsidering Softmax and Linear
    Attention").

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'medium'``, ``'large'``, or a dict with
            ``embed_dims, depths, num_heads, mlp_ratios``.
        attn_type (str): one letter per stage, ``I`` InLine (default ``'IIII'``), ``S`` softmax (PVT's
            spatial-reduction attention, sr ratios 8/4/2/1), ``L`` plain linear attention.
        attn_cfg (dict): TokenAttention options (``kernel``, ``local_residual``) for ablations.
        pretrain_img_size (int): size the position tables were learned at (224).
        out_norm (bool): add a LayerNorm on each output (off by default: the authors' model has none).
        pad_patches (bool): ``False`` (default, PVT v1's behaviour): each strided patch conv drops the
            remainder of a size that is not a multiple of its patch, so inputs need at least 32 px
            per side; ``True`` zero-pads the bottom/right instead (any size, ceil-sized maps).
    """
    arch_zoo = {
        'tiny': dict(depths=[2, 2, 2, 2], drop_path_rate=0.1),
        'small': dict(depths=[3, 4, 6, 3], drop_path_rate=0.1),
        'medium': dict(depths=[3, 4, 18, 3], drop_path_rate=0.3),
        'large': dict(depths=[3, 8, 27, 3], drop_path_rate=0.3),
    }
    for _v in arch_zoo.values():
        _v.update(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], mlp_ratios=[8, 8, 4, 4])
    del _v
    arch_keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios')
    attn_letters = 'ISL'
    default_attn_type = 'IIII'
    _ckpt_drop_prefixes = ('head.',)

    def __init__(self, arch='tiny', in_channels: int = 3, attn_type: Optional[str] = None,
                 attn_cfg: Optional[dict] = None, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 drop_path_rate: Optional[float] = None, drop_rate: float = 0.,
                 pretrain_img_size: int = 224, patch_size: int = 4,
                 sr_ratios: Sequence[int] = (8, 4, 2, 1), out_norm: bool = False,
                 pad_patches: bool = False, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        arch = self._setup(arch, out_indices, frozen_stages, norm_eval, with_cp, drop_path_rate)
        self._set_dims(arch['embed_dims'])
        dims, depths, n = self.embed_dims, self.depths, self.num_stages
        heads, ratios = list(arch['num_heads']), list(arch['mlp_ratios'])
        cores = parse_stage_attn(attn_type or self.default_attn_type, depths, self.letters(),
                                 type(self).__name__)
        self.num_heads = heads
        self.pos_hw = []
        side = pretrain_img_size // patch_size
        for i in range(n):
            if i > 0:
                side = side // 2
            self.pos_hw.append((side, side))
            setattr(self, f'patch_embed{i + 1}',
                    PatchEmbed(in_channels if i == 0 else dims[i - 1], dims[i],
                               patch_size if i == 0 else 2, pad=pad_patches))
            setattr(self, f'pos_embed{i + 1}', nn.Parameter(torch.zeros(1, side * side, dims[i])))
            setattr(self, f'pos_drop{i + 1}', nn.Dropout(drop_rate))
            setattr(self, f'block{i + 1}', nn.ModuleList([
                PVTBlock(dims[i], heads[i], ratios[i], cores[i][j], self.dpr[i][j],
                         sr_ratio=sr_ratios[i] if cores[i][j] == 'softmax' else 1, attn_cfg=attn_cfg)
                for j in range(depths[i])]))
        self._build_out_norms(out_norm, eps=1e-6)
        self._freeze_stages()

    def _post_init(self):
        for i in range(self.num_stages):
            nn.init.trunc_normal_(getattr(self, f'pos_embed{i + 1}'), std=.02)

    def convert_state_dict(self, state):
        """Resize position tables learned at another size (square tables assumed)."""
        for i in range(self.num_stages):
            key = f'pos_embed{i + 1}'
            if key in state and state[key].shape[1] != self.pos_hw[i][0] * self.pos_hw[i][1]:
                side = int(math.isqrt(state[key].shape[1]))
                if side * side == state[key].shape[1]:
                    state[key] = resize_pos_embed(state[key], (side, side), self.pos_hw[i])
        return state

    def _stage_modules(self, i):
        # 0: the stem (patch_embed1 + pos_embed1); s >= 1: everything of stage s
        if i == 0:
            return [self.patch_embed1, self.pos_embed1]
        return [getattr(self, f'patch_embed{i}'), getattr(self, f'pos_embed{i}'),
                getattr(self, f'block{i}')]

    def get_pos_embed(self, i: int, hw: Tuple[int, int]) -> torch.Tensor:
        pos = getattr(self, f'pos_embed{i + 1}')
        return resize_pos_embed(pos, self.pos_hw[i], hw)

    def forward(self, x):
        b = x.shape[0]
        outs = []
        for i in range(self.num_stages):
            x, hw = getattr(self, f'patch_embed{i + 1}')(x)
            x = getattr(self, f'pos_drop{i + 1}')(x + self.get_pos_embed(i, hw))
            for blk in getattr(self, f'block{i + 1}'):
                x = self.run_block(blk, self.with_cp, x, hw)
            x = x.transpose(1, 2).reshape(b, -1, *hw)
            if i in self.out_indices:
                outs.append(self._output(i, x))
            if i >= max(self.out_indices):
                break
        return tuple(outs)
