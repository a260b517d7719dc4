from .attention import (LocalResidual, QKVOAttention, RoPE, TokenAttention, WindowSoftmaxAttention,
                        core_matrix, relative_position_index, run_core)
from .common import DropPath, LayerNorm2d, Mlp, PatchEmbed, pad_to_multiple

__all__ = ['LocalResidual', 'QKVOAttention', 'RoPE', 'TokenAttention', 'WindowSoftmaxAttention',
           'core_matrix', 'relative_position_index', 'run_core',
           'DropPath', 'LayerNorm2d', 'Mlp', 'PatchEmbed', 'pad_to_multiple']
