from .attention import (CORES, LocalResidual, QKVOAttention, RoPE, TokenAttention,
                        WindowSoftmaxAttention, core_matrix, relative_position_index, run_core)
from .common import DropPath, LayerNorm2d, Mlp, pad_to_multiple

__all__ = ['CORES', 'LocalResidual', 'QKVOAttention', 'RoPE', 'TokenAttention',
           'WindowSoftmaxAttention', 'core_matrix', 'relative_position_index', 'run_core',
           'DropPath', 'LayerNorm2d', 'Mlp', 'pad_to_multiple']
