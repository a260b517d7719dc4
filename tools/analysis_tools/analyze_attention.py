"""The papers' attention analyses on an image, for any of our backbones (random or loaded weights).

    python tools/analysis_tools/analyze_attention.py --backbone InLinePVT tiny [--checkpoint F]
        [--image photo.jpg] [--size 224] [--query 0.5 0.5] [--out work_dirs/attention]

Prints, per attention layer: its core, tokens, the number of *confused* query pairs (different
queries, attention distributions closer than 1e-3 in L2 - InLine Fig. 2) and the attention mass in
each query's 3x3 neighbourhood against the 9/N chance level (InLine Fig. 3). Saves
``attention_maps.png``: for the first global attention layer, one query's attention map as scored by
softmax, plain linear, InLine and MALA attention on the *same* queries and keys (InLine Fig. 4,
MALA Fig. 4/7; no RoPE in these), next to the model's own map. Without --image a synthetic test card
is used.
"""
import argparse
import os
import os.path as osp

import numpy as np
import torch

import mmlinattn  # noqa: F401
from mmlinattn.core.families import backbone_classes
from tools.workshop.analysis import (
    attention_map,
    collect_attention,
    matrices_for_cores,
    summarize,
)

BACKBONES = backbone_classes()  # InLinePVT, InLineSwin, MAViT
MEAN, STD = np.array([123.675, 116.28, 103.53]), np.array([58.395, 57.12, 57.375])


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
