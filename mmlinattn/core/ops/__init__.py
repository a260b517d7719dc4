"""Attention math as pure functions (docs/design.md section 1) and the table of attention cores."""
from .attention import (
                        CHUNK_TOKENS,
                        chunk_tokens,
                        inline_attention,
                        inline_attention_matrix,
                        inline_attention_reference,
                        linear_attention,
                        linear_attention_matrix,
                        linear_attention_reference,
                        mala_attention,
                        mala_attention_matrix,
                        mala_attention_reference,
                        set_chunk_tokens,
                        softmax_attention,
                        softmax_attention_matrix,
                        softmax_attention_reference,
)
from .cores import (
                        CORES,
                        Core,
                        core_letters,
                        format_attn_type,
                        get_core,
                        parse_attn_type,
                        register_core,
                        unregister_core,
)
from .kernels import KERNELS, apply_rope, get_kernel, rope_angles, rope_sin_cos
from .local import dynamic_depthwise_conv3x3, dynamic_depthwise_conv3x3_reference

__all__ = [
    'inline_attention', 'inline_attention_matrix', 'inline_attention_reference',
    'mala_attention', 'mala_attention_matrix', 'mala_attention_reference',
    'linear_attention', 'linear_attention_matrix', 'linear_attention_reference',
    'softmax_attention', 'softmax_attention_matrix', 'softmax_attention_reference',
    'CHUNK_TOKENS', 'chunk_tokens', 'set_chunk_tokens',
    'KERNELS', 'get_kernel', 'rope_angles', 'rope_sin_cos', 'apply_rope',
    'dynamic_depthwise_conv3x3', 'dynamic_depthwise_conv3x3_reference',
    'CORES', 'Core', 'core_letters', 'format_attn_type', 'get_core', 'parse_attn_type',
    'register_core', 'unregister_core',
]
