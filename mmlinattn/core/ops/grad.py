"""The linear-time InLine and MALA cores: forward passes and a backward written as GEMMs. The
Functions save q, k, v (in their dtype; the math in float32 for half ones, autocast off) and the
small states, recompute phi and the rotation, and form the gradients as batched products.

Notation per (batch, head): P = phi(Q), K' = phi(K), V, G = dL/dout, c = s / N with N the keys'
count, 1 a column of ones; R the per-token RoPE rotation ``x cos + rot(x) sin``, whose adjoint is
``R^T y = y cos - rot(y sin)`` (``rot`` is a quarter turn of each channel pair, ``rot^T = -rot``).

InLine, forward ``out = P S + 1 m`` with ``m = 1^T V / N`` and
``S = c (K'^T V - (1^T K')^T m)``. Backward::

    dS = P^T G                          dm = 1^T G - c (1^T K') dS
    dP = G S^T                          dK' = c (V - 1 m) dS^T  = c V dS^T - 1 (c m dS^T)
    dV = c K' dS + 1 dm / N             dQ = dP * phi'(Q),  dK = dK' * phi'(K)

MALA (phi = ELU + 1, phi' = min(phi, 1)), forward with ``kv = c (R K')^T V``, ``w = c (1^T K')^T``
(d x 1), ``z = P w``, ``b = 1 + 1 / (z + eps)`` (or 1), ``num = (R P) kv`` and
``out = b * num - z m`` (gamma term optional). Backward, with ``M = G kv^T`` (N x d)::

    db = rowsum((R P) * M)              dz = -db / (z + eps)^2 - G m^T      (N x 1)
    dkv = (R P)^T (b * G)               dw = P^T dz                           (d x 1)
    dP = R^T(b * M) + dz w^T            dm = -z^T G
    dV = c (R K') dkv + 1 dm / N        dK' = R^T(c V dkv^T) + 1 c dw^T
    dQ = dP * phi'(Q),  dK = dK' * phi'(K)

(``db_i = G_i . num_i = (R P)_i . M_i``: num is never stored.)
"""
import functools
from typing import Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from .kernels import eager, elu_plus_one, elu_plus_one_scratch, exp_, get_kernel, rotate_pairs

Tensor = torch.Tensor
RopeTables = Optional[Tuple[Tensor, Tensor]]


def _rotate(x: Tensor, sin: Tensor, cos: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """``x cos + rot(x) sin`` (:func:`~.kernels.apply_rope`) pair-wise into ``out`` (not overlapping
    ``x``; None: new), three passes without a ``rot(x)`` temporary (docs/benchmarks.md)::

        out = x cos;  out_even -= x_odd sin_even;  out_odd += x_even sin_odd

    With autograd and in traced graphs: the formula out of place."""
    if torch.is_grad_enabled() or not eager():
        return torch.addcmul(x * cos, rotate_pairs(x), sin, out=out)
    out = torch.mul(x, cos, out=out)
    xp, sp, op = (t.unflatten(-1, (-1, 2)) for t in (x, sin, out))
    op[..., 0].addcmul_(xp[..., 1], sp[..., 0], value=-1.0)
    op[..., 1].addcmul_(xp[..., 0], sp[..., 1])
    return out


def key_pass(k: Tensor, v: Tensor, phi, step: int, rope: RopeTables = None):
    """Pass 1 over the keys: sum_j phi~(k_j)^T v_j (d x dv), sum_j phi(k_j), sum_j v_j."""
    n = k.shape[-2]
    kv = sum_k = sum_v = None
    # no slicing when it fits one step (always while exporting: a loop would fix N)
    spans = [slice(None)] if step >= n else [slice(i, i + step) for i in range(0, n, step)]
    for span in spans:
        phk, vc = phi(k[..., span, :]), v[..., span, :]
        sk, sv = phk.sum(dim=-2, keepdim=True), vc.sum(dim=-2, keepdim=True)
        if rope is not None:
            phk = _rotate(phk, rope[0][span], rope[1][span], out=_spare(phi, phk))
        kvc = torch.matmul(phk.transpose(-2, -1), vc)
        if kv is None:
            kv, sum_k, sum_v = kvc, sk, sv
        else:
            kv, sum_k, sum_v = kv + kvc, sum_k + sk, sum_v + sv
    return kv, sum_k, sum_v


def _spare(phi, like: Tensor) -> Optional[Tensor]:
    """Where to write a rotated copy of ``phi``'s last result: its spare buffer, or None (new)."""
    spare = getattr(phi, 'spare', None)
    return None if spare is None else spare(like.shape[-2])


def query_pass(q: Tensor, step: int, dv: int, fn) -> Tensor:
    """Pass 2 over the queries: ``fn(q_chunk, start) -> out_chunk``, concatenated along N."""
    n = q.shape[-2]
    if step >= n:
        return fn(q, 0)
    out = q.new_empty(q.shape[:-1] + (dv,))
    for i in range(0, n, step):
        out[..., i:i + step, :] = fn(q[..., i:i + step, :], i)
    return out


def _bmm(a: Tensor, w: Tensor, bias: Optional[Tensor] = None, alpha: float = 1.0) -> Tensor:
    """``bias + alpha * a @ w`` for (..., N, m) @ (..., m, e), (..., 1, e) bias: one GEMM."""
    if bias is None:
        return torch.matmul(a, w * alpha if alpha != 1.0 else w)
    lead, n = a.shape[:-2], a.shape[-2]
    out = torch.baddbmm(bias.reshape(-1, 1, bias.shape[-1]), a.reshape(-1, n, a.shape[-1]),
                        w.reshape(-1, *w.shape[-2:]), alpha=alpha)
    return out.reshape(*lead, n, -1)


def inline_forward(q: Tensor, k: Tensor, v: Tensor, phi, s: float, step: int):
    """InLine's output and states (S, mean(V), sum phi(K)); the means run over the keys."""
    b, h, _, d = q.shape
    n = k.shape[-2]
    kv, sum_k, sum_v = key_pass(k, v, phi, step)
    mean_v = sum_v / n
    # state = (s/N) phi(K)^T V - s mean(phi(K))^T mean(V)   (d x dv)
    state = (kv - sum_k.transpose(-2, -1) * mean_v) * (s / n)

    def chunk(qc, _):
        nc = qc.shape[-2]
        out = torch.baddbmm(mean_v.reshape(b * h, 1, -1), phi(qc).reshape(b * h, nc, d),
                            state.reshape(b * h, d, -1))
        return out.reshape(b, h, nc, -1)
    return query_pass(q, step, v.shape[-1], chunk), state, mean_v, sum_k


def _tokens_inner(x: Tensor) -> bool:
    """(..., N, d) ``x`` laid out with the tokens as its unit-stride dim (channels first)."""
    return x.stride(-2) == 1 and x.stride(-1) != 1 and x.shape[-1] > 1


def mala_forward(q: Tensor, k: Tensor, v: Tensor, s: float, rope: RopeTables, eps: float,
                 beta: bool, gamma: bool, step: int, keep_z: bool = False):
    """MALA's output, states (kv, w = s mean(phi(K))^T, mean(V)) and, if ``keep_z``, z."""
    n = k.shape[-2]
    inplace = not torch.is_grad_enabled()
    # eager calls without autograd write phi into two scratch buffers reused for every chunk
    longest = max(n, q.shape[-2])
    scratch = inplace and eager()
    phi = elu_plus_one_scratch(q, min(step, longest)) if scratch else elu_plus_one
    if scratch and rope is not None and _tokens_inner(q):
        # the scratch holds phi with the tokens inner (MAViT's layout): the tables too
        rope = tuple(t.t().contiguous().t() if t.dim() == 2 else t for t in rope)
    kv, sum_k, sum_v = key_pass(k, v, phi, step, rope)
    mean_v = sum_v / n
    kv = kv * (s / n)
    zvec = sum_k.transpose(-2, -1) * (s / n)  # s mean(phi(K))^T, (d x 1)
    zs = []

    def chunk(qc, i):
        phq = phi(qc)
        # z from the un-rotated phi(q), its own (d x 1) product (faster than [kv | zvec]); with
        # the tokens inner as z^T = w^T phi(q)^T (phi(q) w on that layout took 10x as long)
        if _tokens_inner(phq):
            z = torch.matmul(zvec.transpose(-2, -1), phq.transpose(-2, -1)).transpose(-2, -1)
        else:
            z = torch.matmul(phq, zvec)
        if keep_z:
            zs.append(z)
        if rope is not None:
            span = slice(i, i + qc.shape[-2])
            phq = _rotate(phq, rope[0][span], rope[1][span], out=_spare(phi, phq))
        num = torch.matmul(phq, kv)
        if inplace:  # same math, in place: fewer passes over the (chunk x d) tensors
            if beta:
                num = num.mul_(z.add(eps).reciprocal_().add_(1.0))
            return num.addcmul_(z, mean_v, value=-1.0) if gamma else num
        out = num * (1.0 + 1.0 / (z + eps)) if beta else num
        if gamma:
            out = torch.addcmul(out, z, mean_v, value=-1.0)
        return out
    out = query_pass(q, step, v.shape[-1], chunk)
    z = (zs[0] if len(zs) == 1 else torch.cat(zs, dim=-2)) if keep_z else None
    return out, kv, zvec, mean_v, z


def _elu1(x: Tensor, out: Optional[Tensor] = None):
    """phi(x) = ELU(x) + 1 = relu(x) + e and its slope phi'(x) = e = exp(min(x, 0))."""
    e = exp_(x.clamp(max=0))
    return torch.add(x.relu(), e, out=out), e


def _phi_and_slope(kernel: str, x: Tensor):
    """phi(x) and what :func:`_times_dphi` needs besides x (the slope tensor for 'elu' / 'exp')."""
    if kernel == 'elu':
        return _elu1(x)
    phx = get_kernel(kernel)(x)
    return phx, phx if kernel == 'exp' else None


def _times_dphi(grad: Tensor, x: Tensor, slope: Optional[Tensor], kernel: str) -> Tensor:
    """``grad * phi'(x)`` in place; for 'exp' (phi' = 0.2 phi) the 0.2 is in the caller's GEMM."""
    if kernel == 'relu':
        return torch.ops.aten.threshold_backward(grad, x, 0)
    if kernel == 'leakyrelu':
        return torch.ops.aten.leaky_relu_backward(grad, x, 0.01, False)
    return grad if slope is None else grad.mul_(slope)  # identity; exp and elu


def inline_backward(g: Tensor, q: Tensor, k: Tensor, v: Tensor, state: Tensor, mean_v: Tensor,
                    sum_k: Tensor, kernel: str, s: float):
    f = 0.2 if kernel == 'exp' else 1.0
    n = k.shape[-2]
    c = s / n
    pq, slope = _phi_and_slope(kernel, q)
    ds = torch.matmul(pq.transpose(-2, -1), g)                      # d x dv
    dmean = g.sum(dim=-2, keepdim=True) - c * torch.matmul(sum_k, ds)
    dq = _times_dphi(torch.matmul(g, state.transpose(-2, -1) * f), q, slope, kernel)
    pk, slope = _phi_and_slope(kernel, k)
    dv = _bmm(pk, ds, dmean / n, alpha=c)
    dk = _bmm(v, ds.transpose(-2, -1), torch.matmul(mean_v, ds.transpose(-2, -1)) * (-c * f),
              alpha=c * f)
    return dq, _times_dphi(dk, k, slope, kernel), dv


def _rope_adjoint(y: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """R^T y = y cos - rot(y sin), the transpose of :func:`_rotate`, pair-wise::

        out = y cos;  out_even += y_odd sin_odd;  out_odd -= y_even sin_even"""
    out = y * cos
    yp, sp, op = (t.unflatten(-1, (-1, 2)) for t in (y, sin, out))
    op[..., 0].addcmul_(yp[..., 1], sp[..., 1])
    op[..., 1].addcmul_(yp[..., 0], sp[..., 0], value=-1.0)
    return out


def mala_backward(g: Tensor, q: Tensor, k: Tensor, v: Tensor, kv: Tensor, zvec: Tensor,
                  mean_v: Tensor, z: Optional[Tensor], rope: RopeTables, s: float, eps: float,
                  beta: bool, gamma: bool):
    """The module docstring's formulas with the (N x 1) terms folded into the GEMMs:
    A = [P | -z / b], B = [b * G | dz], A^T B = [[dkv, dw], [dm, .]], dP = B [kv^T ; w^T]."""
    n, d, dv = k.shape[-2], q.shape[-1], v.shape[-1]
    c = s / n
    buf_a = q.new_empty(q.shape[:-1] + (d + 1,))
    pq, slope = _elu1(q, out=buf_a[..., :d])
    buf_r = buf_a if rope is None else torch.empty_like(buf_a)  # [R P | -z / b]
    pqr = pq if rope is None else _rotate(pq, *rope, out=buf_r[..., :d])
    b = dz = None
    if beta:
        gm = torch.matmul(g, torch.cat([kv, mean_v], dim=-2).transpose(-2, -1))  # [G kv^T | G m^T]
        r = (z + eps).reciprocal_()
        dz = torch.linalg.vecdot(pqr, gm[..., :d]).unsqueeze(-1).mul_(r * r).neg_()
        b = r.add_(1.0)
        if gamma:
            dz.sub_(gm[..., d:])
    elif gamma:
        dz = torch.matmul(g, mean_v.transpose(-2, -1)).neg_()
    buf_b = g.new_empty(g.shape[:-1] + (dv + 1,))
    if b is None:
        buf_b[..., :dv] = g
    else:
        torch.mul(g, b, out=buf_b[..., :dv])
    buf_b[..., dv:] = 0.0 if dz is None else dz
    buf_r[..., d:] = -z / b if gamma and beta else (-z if gamma else 0.0)
    if rope is None:
        prods = torch.matmul(buf_a.transpose(-2, -1), buf_b)         # [[dkv, dw], [dm, .]]
        dkv, dzvec = prods[..., :d, :dv], prods[..., :d, dv:]
        dp = torch.matmul(buf_b, torch.cat([kv, zvec], dim=-1).transpose(-2, -1))
    else:
        prods = torch.matmul(buf_r.transpose(-2, -1), buf_b[..., :dv])  # [[dkv], [dm]]
        dkv = prods[..., :d, :]
        dzvec = torch.matmul(pq.transpose(-2, -1), buf_b[..., dv:])
        dp = _rope_adjoint(torch.matmul(buf_b[..., :dv], kv.transpose(-2, -1)), *rope)
        dp.addcmul_(buf_b[..., dv:], zvec.transpose(-2, -1))
    dmean = prods[..., d:, :dv] if gamma else None
    dq = dp.mul_(slope)
    pk, slope = _elu1(k)
    pkr = pk if rope is None else _rotate(pk, *rope)
    dv_ = _bmm(pkr, dkv, None if dmean is None else dmean / n, alpha=c)
    row = dzvec.transpose(-2, -1) * c if dz is not None else None  # 1 x d
    if rope is None:
        dk = _bmm(v, dkv.transpose(-2, -1), row, alpha=c)
    else:
        dk = _rope_adjoint(_bmm(v, dkv.transpose(-2, -1), alpha=c), *rope)
        if row is not None:
            dk.add_(row)
    return dq, dk.mul_(slope), dv_


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _float32(t: Optional[Tensor]) -> Optional[Tensor]:
    """A half tensor as a float32 copy, any other (or None) as it is."""
    return t.float() if t is not None and t.dtype in _LOW_PRECISION else t


@functools.lru_cache(maxsize=None)
def _autocast_marked(fn, device_type: str, backward: bool):
    """``fn`` marked ``custom_fwd`` / ``custom_bwd`` for ``device_type``: autocast off in both."""
    amp = getattr(torch, 'amp', None)
    if hasattr(amp, 'custom_fwd'):  # torch >= 2.4
        mark = amp.custom_bwd if backward else amp.custom_fwd
        return mark(fn, device_type=device_type)
    if device_type == 'cuda':  # torch < 2.4
        return (torch.cuda.amp.custom_bwd if backward else torch.cuda.amp.custom_fwd)(fn)
    if not backward:
        return fn

    @functools.wraps(fn)
    def autocast_off(ctx, *args):
        with torch.autocast(device_type=device_type, enabled=False):
            return fn(ctx, *args)
    return autocast_off


def _forward(body, backward, ctx, q: Tensor, *args):
    """``body(ctx, q, *args)`` with autocast off, marked for q's device; ``backward``: its body."""
    ctx.device_type, ctx.backward_body = q.device.type, backward
    with torch.autocast(device_type=ctx.device_type, enabled=False):
        return _autocast_marked(body, ctx.device_type, False)(ctx, q, *args)


class _CoreFunction(torch.autograd.Function):
    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        return _autocast_marked(ctx.backward_body, ctx.device_type, True)(ctx, g)


def _inline_forward_body(ctx, q, k, v, kernel: str, scale: float, step: int):
    out, state, mean_v, sum_k = inline_forward(_float32(q), _float32(k), _float32(v),
                                               get_kernel(kernel), scale, step)
    ctx.save_for_backward(q, k, v, state, mean_v, sum_k)  # q, k, v in their own dtype
    ctx.kernel, ctx.scale = kernel, scale
    return out.to(v.dtype)


def _inline_backward_body(ctx, g):
    q, k, v, state, mean_v, sum_k = ctx.saved_tensors
    grads = inline_backward(_float32(g), _float32(q), _float32(k), _float32(v), state, mean_v,
                            sum_k, ctx.kernel, ctx.scale)
    return (*(d.to(x.dtype) for d, x in zip(grads, (q, k, v))), None, None, None)


class InlineAttentionFunction(_CoreFunction):
    """InLine's core with the backward above: ``apply(q, k, v, kernel, scale, step)``."""

    @staticmethod
    def forward(ctx, q, k, v, kernel: str, scale: float, step: int):
        return _forward(_inline_forward_body, _inline_backward_body, ctx, q, k, v, kernel, scale,
                        step)


def _mala_forward_body(ctx, q, k, v, sin, cos, scale: float, eps: float, beta: bool, gamma: bool,
                       step: int):
    qf = _float32(q)
    rope = None if sin is None else (sin.to(qf.dtype), cos.to(qf.dtype))
    out, kv, zvec, mean_v, z = mala_forward(qf, _float32(k), _float32(v), scale, rope, eps, beta,
                                            gamma, step, keep_z=beta or gamma)
    # q, k, v in their own dtype; the tables as given (the caller's, shared by a stage's blocks)
    ctx.save_for_backward(q, k, v, kv, zvec, mean_v, z, sin, cos)
    ctx.options = (scale, eps, beta, gamma)
    return out.to(v.dtype)


def _mala_backward_body(ctx, g):
    q, k, v, kv, zvec, mean_v, z, sin, cos = ctx.saved_tensors
    qf = _float32(q)
    rope = None if sin is None else (sin.to(qf.dtype), cos.to(qf.dtype))
    grads = mala_backward(_float32(g), qf, _float32(k), _float32(v), kv, zvec, mean_v, z, rope,
                          *ctx.options)
    return (*(d.to(x.dtype) for d, x in zip(grads, (q, k, v))),
            None, None, None, None, None, None, None)


class MalaAttentionFunction(_CoreFunction):
    """MALA's core: ``apply(q, k, v, sin, cos, scale, eps, beta, gamma, step)`` (sin None: no
    RoPE)."""

    @staticmethod
    def forward(ctx, q, k, v, sin, cos, scale: float, eps: float, beta: bool, gamma: bool,
                step: int):
        return _forward(_mala_forward_body, _mala_backward_body, ctx, q, k, v, sin, cos, scale, eps,
                        beta, gamma, step)
