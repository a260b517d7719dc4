"""The papers' attention analyses on an image, for any of our backbones (random or loaded weights).

    python tools/analysis_tools/analyze_attention.py --backbone InLinePVT tiny [--checkpoint F]
        [--image photo.jpg] [--size 224] [--query 0.5 0.5] [--out work_dirs/attention]

Per attention layer: its core, tokens, confused query pairs (InLine Fig. 2) and the 3x3 attention
mass against chance (Fig. 3); ``attention_maps.png``: one query's map of the first global layer
under softmax, linear, InLine and MALA on the same queries and keys, beside the model's own
(InLine Fig. 4, MALA Fig. 4/7). Without --image, a synthetic test card. docs/attention_analysis.md.
"""
import argparse
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

import mmlinattn  # noqa: F401
from mmlinattn.core.families import backbone_classes
from mmlinattn.core.models.layers import QKVOAttention, TokenAttention, core_matrix
from mmlinattn.core.ops.cores import CORES

BACKBONES = backbone_classes()  # InLinePVT, InLineSwin, MAViT
MEAN, STD = np.array([123.675, 116.28, 103.53]), np.array([58.395, 57.12, 57.375])
Tensor = torch.Tensor


@torch.no_grad()
def confusion_count(attn: Tensor, queries: Tensor, tol: float = 1e-3, q_tol: float = 1e-6,
                    max_queries: Optional[int] = 512) -> int:
    """InLine Fig. 2: pairs (i < j) of one head's (N, N) ``attn`` with ``||q_i - q_j|| > q_tol`` but
    ``||A_i - A_j|| < tol``; over an evenly spaced subset of ``max_queries`` queries."""
    n = attn.shape[0]
    idx = torch.arange(n)
    if max_queries and n > max_queries:
        idx = torch.linspace(0, n - 1, max_queries).long()
    a, q = attn[idx].double(), queries[idx].double()
    close = (torch.cdist(a, a) < tol) & (torch.cdist(q, q) > q_tol)
    return int(torch.triu(close, diagonal=1).sum())


@torch.no_grad()
def local_mass(attn: Tensor, hw: Tuple[int, int]) -> float:
    """InLine Fig. 3: the mean attention weight of (..., N, N) ``attn`` on each query's 3x3
    neighbourhood of the H x W map (itself included)."""
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
    """The same (B, h, N, d) queries and keys scored by ``cores`` (default: every core), each with
    its default kernel unless ``kernels`` names one (default: ELU+1 for linear, as MALA's)."""
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


def load_image(path, size):
    from PIL import Image
    if path:
        img = Image.open(path).convert('RGB').resize((size, size), Image.BILINEAR)
        arr = np.asarray(img, dtype=np.float64)
    else:  # a test card: gradient + shapes, deterministic
        yy, xx = np.mgrid[0:size, 0:size] / size
        arr = np.stack([255 * xx, 255 * yy, 255 * (1 - xx) * yy], -1)
        arr[size // 4:size // 2, size // 4:size // 2] = (230, 40, 40)
        arr[(yy - .7) ** 2 + (xx - .7) ** 2 < .02] = (40, 60, 230)
    x = torch.from_numpy(((arr - MEAN) / STD).transpose(2, 0, 1)).float()[None]
    return x, arr.astype(np.uint8)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--backbone', nargs=2, default=['InLinePVT', 'tiny'], metavar=('TYPE', 'ARCH'))
    p.add_argument('--checkpoint', help="the authors' file or ours (random weights if absent)")
    p.add_argument('--use-ema', action='store_true')
    p.add_argument('--image')
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--query', nargs=2, type=float, default=[0.5, 0.5],
                   help='query position as fractions of (height, width)')
    p.add_argument('--tol', type=float, default=1e-3)
    p.add_argument('--out', default='work_dirs/attention')
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = BACKBONES[args.backbone[0]](arch=args.backbone[1])
    if args.checkpoint:
        model.load_pretrained(args.checkpoint, use_ema=args.use_ema)
    else:
        model.init_weights()
    model.eval()
    x, img = load_image(args.image, args.size)
    records = collect_attention(model, x)
    if not records:
        raise SystemExit('no global attention layer small enough to analyse; try a smaller --size')
    print(f'{"layer":40s} {"core":8s} {"tokens":>6s} {"confused pairs":>15s} {"3x3 mass":>9s} '
          f'{"chance":>7s}')
    for r in summarize(records, args.tol):
        print(f'{r["name"]:40s} {r["core"]:8s} {r["tokens"]:6d} {r["confusion"]:15d} '
              f'{r["local_mass"]:9.4f} {r["chance"]:7.4f}')
    os.makedirs(args.out, exist_ok=True)
    path = osp.join(args.out, 'attention_maps.png')
    plot_maps(model, records[0], img, args.query, path)
    print(f'\nmaps: {path}')


def plot_maps(model, rec, img, query, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    hw = rec['hw']
    qpos = (min(hw[0] - 1, int(query[0] * hw[0])), min(hw[1] - 1, int(query[1] * hw[1])))
    module = dict(model.named_modules())[rec['name']]
    maps = {f'model ({rec["core"]})': attention_map(rec['attn'][0], hw, qpos)}
    for core, a in matrices_for_cores(rec['queries'], rec['keys'], module.scale).items():
        maps[core] = attention_map(a[0], hw, qpos)
    fig, axes = plt.subplots(1, len(maps) + 1, figsize=(3 * (len(maps) + 1), 3.2))
    axes[0].imshow(img)
    axes[0].scatter([(qpos[1] + .5) * img.shape[1] / hw[1]],
                    [(qpos[0] + .5) * img.shape[0] / hw[0]],
                    c='yellow', marker='x', s=80)
    axes[0].set_title('image, query x')
    for ax, (name, m) in zip(axes[1:], maps.items()):
        ax.imshow(m.numpy(), cmap='viridis')
        ax.set_title(name)
    for ax in axes:
        ax.axis('off')
    fig.suptitle(f'{rec["name"]}: attention of one query, same q/k under each attention')
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == '__main__':
    main()
