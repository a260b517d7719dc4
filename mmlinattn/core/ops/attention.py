"""Attention as pure functions on (B, h, N, d) tensors (formulas: docs/design.md section 1):
``<name>_attention`` (what the models run), ``<name>_attention_matrix`` (the explicit matrix A) and
``<name>_attention_reference`` (``A @ v``, the oracle). ``scale`` defaults to ``d ** -0.5``. The
linear attentions compute in float32 for half inputs and return the input dtype; with autograd in
eager, InLine and MALA run as the Functions of :mod:`.grad`."""
from typing import Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from . import probes
from .grad import (
    _LOW_PRECISION,
    InlineAttentionFunction,
    MalaAttentionFunction,
    _float32,
    inline_forward,
    key_pass,
    mala_forward,
    query_pass,
)
from .kernels import apply_rope, elu_plus_one, get_kernel

Tensor = torch.Tensor
RopeTables = Optional[Tuple[Tensor, Tensor]]

def _check_qkv(q: Tensor, k: Tensor, v: Optional[Tensor] = None) -> None:
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f'q and k must be (B, h, N, d), got {tuple(q.shape)} and {tuple(k.shape)}')
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f'q {tuple(q.shape)} and k {tuple(k.shape)} disagree on B, h or d')
    if v is not None and (v.dim() != 4 or v.shape[:3] != k.shape[:3]):
        raise ValueError(f'v {tuple(v.shape)} must be (B, h, N, d_v) with the B, h, N of k '
                         f'{tuple(k.shape)}')


def _check_rope(q: Tensor, k: Tensor, rope: RopeTables) -> None:
    """One (N, d) pair of RoPE tables rotates queries and keys of the same positions."""
    if rope is not None and q.shape[-2] != k.shape[-2]:
        raise ValueError(f'RoPE tables rotate queries and keys at the same positions: q has '
                         f'{q.shape[-2]} tokens and k {k.shape[-2]}')


def _batch_flat(*tensors: Tensor):
    """Extra leading dims (e.g. Swin's windows) folded into B, for the shape checks."""
    return [t.flatten(0, -4) if t.dim() > 4 else t for t in tensors]


def _scale(q: Tensor, scale: Optional[float]) -> float:
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


# Tokens per chunk on the CPU's no-autograd path: the per-chunk intermediates stay in cache
# (docs/benchmarks.md: a sweep of chunk sizes)
CHUNK_TOKENS = 4096

# device type -> tokens per chunk (None: the whole sequence), set by set_chunk_tokens
_CHUNK_SET: Dict[str, Optional[int]] = {}


def _device_type(device: Union[str, torch.device, Tensor]) -> str:
    if isinstance(device, Tensor):
        return device.device.type
    return device.type if isinstance(device, torch.device) else torch.device(device).type


def chunk_tokens(device: Union[str, torch.device, Tensor] = 'cpu') -> Optional[int]:
    """Tokens per chunk of the no-autograd path on ``device``: :data:`CHUNK_TOKENS` on the CPU, else
    ``None`` (one piece), unless set by :func:`set_chunk_tokens`."""
    kind = _device_type(device)
    if kind in _CHUNK_SET:
        return _CHUNK_SET[kind]
    return CHUNK_TOKENS if kind == 'cpu' else None


_DEFAULT = object()


def set_chunk_tokens(device_type: str, tokens=_DEFAULT) -> Optional[int]:
    """Set a device type's chunk length (``None``: none; left out: default); returns the old one."""
    kind = _device_type(device_type)
    old = chunk_tokens(kind)
    if tokens is _DEFAULT:
        _CHUNK_SET.pop(kind, None)
        return old
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or tokens < 1):
        raise ValueError(f'set_chunk_tokens({kind!r}, {tokens!r}): the chunk length must be a '
                         'positive number of tokens, or None for no chunking')
    _CHUNK_SET[kind] = tokens
    return old


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _chunk(q: Tensor, k: Tensor) -> int:
    """:func:`chunk_tokens` for q's device, as a length (the whole sequence for None)."""
    whole = max(q.shape[-2], k.shape[-2])
    step = chunk_tokens(q.device)
    return whole if step is None else step


def _step(q: Tensor, k: Tensor, v: Tensor) -> int:
    """Chunk length along N: the whole sequence with autograd and while traced for export (a loop
    would unroll at the example's N); else :func:`_chunk`."""
    if _needs_grad(q, k, v) or probes.is_exporting() or torch.jit.is_tracing():
        return max(q.shape[-2], k.shape[-2])
    return _chunk(q, k)


def _use_function(*tensors: Tensor) -> bool:
    """Autograd through the Functions of :mod:`.grad`: when a gradient is needed, in eager only."""
    return (_needs_grad(*tensors) and not torch.jit.is_tracing()
            and not probes.is_compiling() and not probes.is_exporting())


# InLine attention
def inline_attention(q: Tensor, k: Tensor, v: Tensor, kernel: str = 'identity',
                     scale: Optional[float] = None) -> Tensor:
    """Injective linear attention, O(N d^2):
    ``out = phi(Q) [ (s/N) phi(K)^T V - s mean(phi(K))^T mean(V) ] + mean(V)``, ``s = scale``: the
    paper's ``phi(Q) kv + (1 - s phi(Q) mean(phi(K))^T) mean(V)`` with the rank-one term folded
    into the d x d state."""
    _check_qkv(q, k, v)
    s = _scale(q, scale)
    phi = get_kernel(kernel)
    out_dtype = v.dtype
    with torch.autocast(device_type=q.device.type, enabled=False):
        if _use_function(q, k, v):
            # q, k, v as they come: the Function saves them in their dtype
            return InlineAttentionFunction.apply(q, k, v, kernel, s, _chunk(q, k))
        q, k, v = map(_float32, (q, k, v))
        return inline_forward(q, k, v, phi, s, _step(q, k, v))[0].to(out_dtype)


def inline_attention_matrix(q: Tensor, k: Tensor, kernel: str = 'identity',
                            scale: Optional[float] = None) -> Tensor:
    """A_ij = s_ij - mean_j(s_ij) + 1/N with s_ij = (scale/N) phi(q_i).phi(k_j)."""
    _check_qkv(q, k)
    phi = get_kernel(kernel)
    n = k.shape[-2]
    s = torch.matmul(phi(q), phi(k).transpose(-2, -1)) * (_scale(q, scale) / n)
    return s - s.mean(dim=-1, keepdim=True) + 1.0 / n


def inline_attention_reference(q, k, v, kernel='identity', scale=None):
    return torch.matmul(inline_attention_matrix(q, k, kernel, scale), v)


# MALA: magnitude-aware linear attention
def mala_attention(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None,
                   rope: RopeTables = None, eps: float = 1e-6, beta: bool = True,
                   gamma: bool = True) -> Tensor:
    """Magnitude-aware linear attention, phi = ELU + 1, linear time: ``z = s phi(q)
    mean(phi(K))^T``, ``out = (phi~(q) (s/N) phi~(K)^T V) * beta - z * mean(V)``, ``beta = 1 + 1/(z
    + eps)``; ``phi~``: phi then the 2-D RoPE ``rope=(sin, cos)`` ((N, d) tables); z un-rotated, as
    the authors' code. ``beta=False`` / ``gamma=False``: the paper's ablations (beta = 1, no z *
    mean(V) term)."""
    _check_qkv(q, k, v)
    _check_rope(q, k, rope)
    s = _scale(q, scale)
    out_dtype = v.dtype
    with torch.autocast(device_type=q.device.type, enabled=False):
        if rope is not None:  # in the dtype of the math: float32 for half q
            dtype = torch.float32 if q.dtype in _LOW_PRECISION else q.dtype
            rope = tuple(t.to(dtype) for t in rope)
        if _use_function(q, k, v) and not (rope is not None and _needs_grad(*rope)):
            sin, cos = (None, None) if rope is None else rope
            return MalaAttentionFunction.apply(q, k, v, sin, cos, s, eps, beta, gamma,
                                               _chunk(q, k))
        q, k, v = map(_float32, (q, k, v))
        step = _step(q, k, v)
        return mala_forward(q, k, v, s, rope, eps, beta, gamma, step)[0].to(out_dtype)


def mala_attention_matrix(q: Tensor, k: Tensor, scale: Optional[float] = None,
                          rope: RopeTables = None, eps: float = 1e-6, beta: bool = True,
                          gamma: bool = True) -> Tensor:
    """A_ij = beta_i (s/N) phi~(q_i).phi~(k_j) - z_i / N (docs/design.md 1.2)."""
    _check_qkv(q, k)
    _check_rope(q, k, rope)
    s = _scale(q, scale)
    n = k.shape[-2]
    phq, phk = elu_plus_one(q), elu_plus_one(k)
    z = torch.matmul(phq, phk.mean(dim=-2, keepdim=True).transpose(-2, -1)) * s
    if rope is not None:
        phq, phk = apply_rope(phq, *rope), apply_rope(phk, *rope)
    a = torch.matmul(phq, phk.transpose(-2, -1)) * (s / n)
    if beta:
        a = a * (1.0 + 1.0 / (z + eps))
    if gamma:
        a = a - z / n
    return a


def mala_attention_reference(q, k, v, scale=None, rope=None, eps=1e-6, beta=True, gamma=True):
    return torch.matmul(mala_attention_matrix(q, k, scale, rope, eps, beta, gamma), v)


# Baselines: plain linear attention and softmax attention
def linear_attention(q: Tensor, k: Tensor, v: Tensor, kernel: str = 'relu',
                     eps: float = 1e-6) -> Tensor:
    """Classic linear attention: phi(q_i) phi(K)^T V / (phi(q_i) sum_j phi(k_j) + eps)."""
    _check_qkv(q, k, v)
    phi = get_kernel(kernel)
    out_dtype = v.dtype
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = map(_float32, (q, k, v))
        step = _step(q, k, v)
        kv, sum_k, _ = key_pass(k, v, phi, step)
        state = torch.cat([kv, sum_k.transpose(-2, -1)], dim=-1)

        def chunk(qc, _):
            num_z = torch.matmul(phi(qc), state)
            return num_z[..., :-1] / (num_z[..., -1:] + eps)
        return query_pass(q, step, v.shape[-1], chunk).to(out_dtype)


def linear_attention_matrix(q: Tensor, k: Tensor, kernel: str = 'relu',
                            eps: float = 1e-6) -> Tensor:
    _check_qkv(q, k)
    phi = get_kernel(kernel)
    a = torch.matmul(phi(q), phi(k).transpose(-2, -1))
    return a / (a.sum(dim=-1, keepdim=True) + eps)


def linear_attention_reference(q, k, v, kernel='relu', eps=1e-6):
    return torch.matmul(linear_attention_matrix(q, k, kernel, eps), v)


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None,
                      attn_bias: Optional[Tensor] = None, dropout_p: float = 0.) -> Tensor:
    """Softmax attention through SDPA; extra leading dims allowed (Swin's (B, nW, h, N, d) windows,
    (nW, h, N, N) bias); ``dropout_p``: SDPA's dropout."""
    _check_qkv(*_batch_flat(q, k, v))
    if (probes.is_exporting() or torch.onnx.is_in_onnx_export()) and not dropout_p:
        # export / ONNX: explicit matmuls and softmax (ONNX's SDPA is 4-D only, torch 2.14's
        # decomposition lays its output out otherwise, torch 2.1's jit exporter takes no scale)
        return softmax_attention_reference(q, k, v, scale, attn_bias)
    lead = q.shape[:-2]
    q4, k4, v4, bias4 = _flash_layout(q, k, v, attn_bias)
    out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=bias4, dropout_p=dropout_p,
                                         scale=_scale(q, scale))
    return out.reshape(*lead, *out.shape[-2:])


def _flash_layout(q: Tensor, k: Tensor, v: Tensor, attn_bias: Optional[Tensor]):
    """q, k, v and the bias as SDPA's fused CPU kernel takes them: 4-D (Swin's windows folded into
    the heads), the last dim contiguous (else SDPA materialises every (N x M) matrix)."""
    if q.dim() > 4:
        b, mid = q.shape[0], q.shape[1:-2]
        q, k, v = (t.reshape(b, -1, *t.shape[-2:]) for t in (q, k, v))
        if attn_bias is not None:
            if attn_bias.dim() == len(mid) + 3:  # (B, nW, h, N, M): per image
                attn_bias = attn_bias.reshape(b, -1, *attn_bias.shape[-2:])
            else:
                attn_bias = attn_bias.expand(*mid, *attn_bias.shape[-2:])
                attn_bias = attn_bias.reshape(1, -1, *attn_bias.shape[-2:])
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return q, k, v, attn_bias


def softmax_attention_matrix(q: Tensor, k: Tensor, scale: Optional[float] = None,
                             attn_bias: Optional[Tensor] = None) -> Tensor:
    _check_qkv(*_batch_flat(q, k))
    logits = torch.matmul(q, k.transpose(-2, -1)) * _scale(q, scale)
    if attn_bias is not None:
        logits = logits + attn_bias
    return logits.softmax(dim=-1)


def softmax_attention_reference(q, k, v, scale=None, attn_bias=None):
    return torch.matmul(softmax_attention_matrix(q, k, scale, attn_bias), v)
