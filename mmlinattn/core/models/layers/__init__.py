from .attention import (
    AttentionModule,
    LocalResidual,
    QKVOAttention,
    RoPE,
    TokenAttention,
    core_matrix,
)
from .common import (
    DropPath,
    LayerNorm2d,
    Mlp,
    PatchEmbed,
    pad_to_multiple,
    resize_pos_embed,
    run_block,
)
from .window import WindowSoftmaxAttention, relative_position_index

__all__ = ['AttentionModule', 'LocalResidual', 'QKVOAttention', 'RoPE',
           'TokenAttention', 'WindowSoftmaxAttention', 'core_matrix', 'relative_position_index',
           'DropPath', 'LayerNorm2d', 'Mlp', 'PatchEmbed', 'pad_to_multiple',
           'resize_pos_embed', 'run_block']
