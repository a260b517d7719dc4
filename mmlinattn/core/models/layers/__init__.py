from .attention import LocalResidual, QKVOAttention, RoPE, TokenAttention, core_matrix, run_core
from .common import DropPath, LayerNorm2d, Mlp, PatchEmbed, pad_to_multiple, resize_pos_embed
from .window import WindowSoftmaxAttention, relative_position_index

__all__ = ['LocalResidual', 'QKVOAttention', 'RoPE', 'TokenAttention', 'WindowSoftmaxAttention',
           'core_matrix', 'relative_position_index', 'run_core',
           'DropPath', 'LayerNorm2d', 'Mlp', 'PatchEmbed', 'pad_to_multiple', 'resize_pos_embed']
