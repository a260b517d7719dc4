"""The papers' attention analyses on any of our models (random or loaded weights).

* :func:`confusion_count` - InLine Fig. 2: query pairs with different queries whose attention
  distributions are closer than ``tol`` in L2 (semantic confusion; 0 for an injective attention);
* :func:`local_mass` - InLine Fig. 3: mean attention mass inside each query's 3x3 neighbourhood,
  versus the 9/N a uniform distribution would give;
* :func:`collect_attention` - runs a backbone once and returns, for each attention module, the
  explicit attention matrix computed from the same weights and inputs as its linear-time path
  (``module.attention_matrix``), with its queries and map size;
* :func:`matrices_for_cores` - the same queries/keys scored by softmax, plain linear, InLine and
  MALA attention, for side-by-side maps (InLine Fig. 4, MALA Fig. 4/7).
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from mmlinattn.core.models.layers import QKVOAttention, TokenAttention, core_matrix
from mmlinattn.core.ops.cores import CORES

Tensor = torch.Tensor


@torch.no_grad()
def confusion_count(attn: Tensor, queries: Tensor, tol: float = 1e-3, q_tol: float = 1e-6,
                    max_queries: Optional[int] = 512) -> int:
    """Pairs (i < j) with ``||q_i - q_j|| > q_tol`` but ``||A_i - A_j|| < tol``.

    attn: (N, N) one head's attention matrix; queries: (N, d). With ``max_queries`` a fixed, evenly
    spaced subset of queries is compared (the count is then over that subset).
    """
    n = attn.shape[0]
    idx = torch.arange(n)
    if max_queries and n > max_queries:
        idx = torch.linspace(0, n - 1, max_queries).long()
    a, q = attn[idx].double(), queries[idx].double()
    da = torch.cdist(a, a)
    dq = torch.cdist(q, q)
    close = (da < tol) & (dq > q_tol)
    return int(torch.triu(close, diagonal=1).sum())


@torch.no_grad()
def local_mass(attn: Tensor, hw: Tuple[int, int]) -> float:
    """Mean over queries of the attention weight on the query's 3x3 neighbourhood (itself included).

    attn: (..., N, N) for an H x W map (row-major); returns a float (averaged over leading dims).
    """
    h, w = hw
    n = h * w
    a = attn.reshape(-1, n, h, w).double()
    ys, xs = torch.div(torch.arange(n), w, rounding_mode='floor'), torch.arange(n) % w
    total = torch.zeros(a.shape[0], n, dtype=a.dtype)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            yy, xx = ys + dy, xs + dx
            ok = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            q = torch.arange(n)[ok]
            total[:, q] += a[:, q, yy[ok], xx[ok]]
    return float(total.mean())


def collect_attention(model: torch.nn.Module, x: Tensor,
                      max_tokens: int = 4096) -> List[Dict]:
    """Run ``model(x)`` and return, for every global attention module (TokenAttention,
    QKVOAttention) with at most ``max_tokens`` tokens, dict(name, core, attn (B, h, N, N),
    queries and keys (B, h, N, d), hw)."""
    records, hooks = [], []

    def make_hook(name, mod):
        def hook(module, args):
            if isinstance(module, TokenAttention):
                tokens, hw = args[0], args[1]
                if tokens.shape[1] > max_tokens:
                    return
                q, k = module.queries_keys(tokens, hw)
                a = module.attention_matrix(tokens, hw)
            else:
                inp, rope = args[0], (args[1] if len(args) > 1 else None)
                hw = tuple(inp.shape[-2:])
                if hw[0] * hw[1] > max_tokens:
                    return
                q, k = module.queries_keys(inp)
                a = module.attention_matrix(inp, rope)
            records.append(dict(name=name, core=module.core, attn=a.detach(),
                                queries=q.detach(), keys=k.detach(), hw=tuple(hw)))
        return hook

    for name, mod in model.named_modules():
        if isinstance(mod, (TokenAttention, QKVOAttention)):
            hooks.append(mod.register_forward_pre_hook(make_hook(name, mod)))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return records


@torch.no_grad()
def matrices_for_cores(q: Tensor, k: Tensor, scale: float, cores: Optional[Sequence[str]] = None,
                       kernels: Optional[Dict[str, str]] = None) -> Dict[str, Tensor]:
    """Score the same (B, h, N, d) queries and keys with several attentions: ``cores`` (default:
    every core of :data:`mmlinattn.core.ops.cores.CORES`), each with its default kernel unless
    ``kernels`` names one (default: ELU+1 for plain linear attention, as in MALA's figures)."""
    kernels = {'linear': 'elu'} if kernels is None else kernels
    return {c: core_matrix(c, q, k, scale, kernel=kernels.get(c))
            for c in (list(CORES) if cores is None else cores)}


def summarize(records: List[Dict], tol: float = 1e-3) -> List[Dict]:
    """Per layer: confusion count (head 0 of sample 0) and local mass vs chance."""
    rows = []
    for r in records:
        a, q, hw = r['attn'], r['queries'], r['hw']
        n = hw[0] * hw[1]
        rows.append(dict(name=r['name'], core=r['core'], tokens=n,
                         confusion=confusion_count(a[0, 0], q[0, 0], tol),
                         local_mass=local_mass(a, hw), chance=min(1.0, 9.0 / n)))
    return rows


def attention_map(attn: Tensor, hw: Tuple[int, int], query: Tuple[int, int]) -> Tensor:
    """The (H, W) map of one query's attention weights (head-averaged)."""
    i = query[0] * hw[1] + query[1]
    return attn[..., i, :].reshape(-1, *hw).mean(0)
