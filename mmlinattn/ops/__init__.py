"""Attention math as pure functions (docs/design.md section 1)."""
from .attention import (inline_attention, inline_attention_matrix, inline_attention_reference,
                        linear_attention, linear_attention_matrix, linear_attention_reference,
                        mala_attention, mala_attention_matrix, mala_attention_reference,
                        softmax_attention, softmax_attention_matrix, softmax_attention_reference)
from .kernels import KERNELS, apply_rope, get_kernel, rope_angles, rope_sin_cos
from .local import dynamic_depthwise_conv3x3, dynamic_depthwise_conv3x3_reference

__all__ = [
    'inline_attention', 'inline_attention_matrix', 'inline_attention_reference',
    'mala_attention', 'mala_attention_matrix', 'mala_attention_reference',
    'linear_attention', 'linear_attention_matrix', 'linear_attention_reference',
    'softmax_attention', 'softmax_attention_matrix', 'softmax_attention_reference',
    'KERNELS', 'get_kernel', 'rope_angles', 'rope_sin_cos', 'apply_rope',
    'dynamic_depthwise_conv3x3', 'dynamic_depthwise_conv3x3_reference',
]
