"""Backbone latency and peak memory across input sizes, ours vs mmdet's softmax backbones.

    python tools/analysis_tools/benchmark.py                       # 224^2 .. 1024^2 and 512x2048
    python tools/analysis_tools/benchmark.py --sizes 224 512 1024 2048 --out docs/benchmarks

One process, one run: for every size it times a batch-1 fp32 forward (inference mode) of
InLine-Swin-T vs mmdet's Swin-T, InLine-PVT-S vs mmdet's PVT-S, and MAViT-T, prints the times,
the ratios (Swin-T / InLine-Swin-T, PVT-S / InLine-PVT-S, PVT-S / MAViT-T) and the peak memory,
and saves a PNG plot and a JSON file.

``--compile`` also times every model compiled with ``torch.compile`` (inductor, one compilation per
size, not counted) and prints the compiled times, the eager/compiled speedup of each model and the
same ratios between the compiled models.
"""
import argparse
import json
import os
import os.path as osp
import platform

os.environ.setdefault('KINETO_LOG_LEVEL', '5')  # the profiler's start/stop chatter

import torch  # noqa: E402

import mmlinattn  # noqa: E402,F401
from mmlinattn.core.models import InLinePVT, InLineSwin, MAViT  # noqa: E402
from tools.workshop.benchmarking import build_reference, peak_memory, timeit  # noqa: E402


def build_models(names):
    zoo = {
        'InLine-Swin-T': lambda: InLineSwin(arch='tiny'),
        'Swin-T (mmdet)': lambda: build_reference('Swin-T'),
        'InLine-PVT-S': lambda: InLinePVT(arch='small'),
        'PVT-S (mmdet)': lambda: build_reference('PVT-S'),
        'MAViT-T': lambda: MAViT(arch='tiny'),
    }
    unknown = set(names) - set(zoo)
    if unknown:
        raise SystemExit(f'unknown models {sorted(unknown)}; choose from {list(zoo)}')
    models = {n: zoo[n]() for n in names}
    for m in models.values():
        m.eval()  # (mmdet's backbones' train() returns None, so no chaining)
    return models


def ratios(t):
    """The table's last columns from one size's times: Swin-T / InLine-Swin-T, PVT-S / InLine-PVT-S,
    PVT-S / MAViT-T (nan where a model was not run)."""
    def ratio(a, b):
        return t[a] / t[b] if a in t and b in t else float('nan')
    return (f'{ratio("Swin-T (mmdet)", "InLine-Swin-T"):8.2f} '
            f'{ratio("PVT-S (mmdet)", "InLine-PVT-S"):8.2f} '
            f'{ratio("PVT-S (mmdet)", "MAViT-T"):9.2f}')


def parse_size(s):
    h, _, w = s.partition('x')
    return (int(h), int(w or h))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--sizes', nargs='+', default=['224', '512', '768', '1024', '512x2048'],
                   help='H or HxW')
    p.add_argument('--models', nargs='+',
                   default=['InLine-Swin-T', 'Swin-T (mmdet)', 'InLine-PVT-S',
                                                   'PVT-S (mmdet)', 'MAViT-T'])
    p.add_argument('--channels-last', action='store_true', help='channels_last inputs/weights')
    p.add_argument('--no-memory', action='store_true', help='skip the (slower) memory pass')
    p.add_argument('--compile', action='store_true', help='also time the torch.compile-d models')
    p.add_argument('--out', default='work_dirs/benchmark')
    args = p.parse_args(argv)
    torch.manual_seed(0)
    models = build_models(args.models)
    sizes = [parse_size(s) for s in args.sizes]
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}, '
          f'batch 1, fp32, forward only\n')
    header = f'{"size":>10} | ' + ' | '.join(f'{n:>15}' for n in models)
    print(header + ' |  Swin/InL  PVT/InL  PVT/MAViT')
    print('-' * (len(header) + 32))
    rows = []
    for hw in sizes:
        x = torch.randn(1, 3, *hw)
        t, mem, tc = {}, {}, {}
        for name, m in models.items():
            xi = x
            if args.channels_last:
                m = m.to(memory_format=torch.channels_last)
                xi = x.to(memory_format=torch.channels_last)
            with torch.inference_mode():
                t[name] = timeit(lambda: m(xi), min_time=0.5, max_reps=10)
                if not args.no_memory:
                    mem[name] = peak_memory(lambda: m(xi)) / 2 ** 20
            if args.compile:
                # no_grad, not inference_mode: dynamo's guards on mmdet's PVT (a tensor made from a
                # numpy array) fail inside inference_mode in torch 2.14
                torch._dynamo.reset()
                mc = torch.compile(m, dynamic=False)
                try:
                    with torch.no_grad():
                        tc[name] = timeit(lambda: mc(xi), min_time=0.5, max_reps=10)
                except Exception as e:  # a benchmark over several models: each
                    # failure (torch.compile raises any type) printed with its type, the rest go on
                    print(f'{name}: torch.compile failed: {type(e).__name__}: {str(e)[:200]}')
                    tc[name] = float('nan')
        rows.append(dict(size=list(hw), time_s=t, peak_mb=mem, compiled_time_s=tc))

        print(f'{hw[0]:>4}x{hw[1]:<5} | ' + ' | '.join(f'{t[n] * 1e3:13.1f}ms' for n in models) +
              ' | ' + ratios(t), flush=True)
        if mem:
            print(f'{"peak MB":>10} | ' + ' | '.join(f'{mem[n]:15.0f}' for n in models) + ' |')
        if tc:
            print(f'{"compiled":>10} | ' + ' | '.join(f'{tc[n] * 1e3:13.1f}ms' for n in models) +
                  ' | ' + ratios(tc))
            print(f'{"eager/comp":>10} | '
                  + ' | '.join(f'{t[n] / tc[n]:14.2f}x' for n in models) + ' |', flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(osp.join(args.out, 'benchmark_backbones.json'), 'w') as f:
        json.dump(dict(torch=torch.__version__, threads=torch.get_num_threads(), rows=rows), f,
                  indent=1)
    plot(rows, list(models), osp.join(args.out, 'benchmark_backbones.png'))
    print(f'\nplot: {osp.join(args.out, "benchmark_backbones.png")}')


def plot(rows, names, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    px = [r['size'][0] * r['size'][1] / 1e6 for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n in names:
        axes[0].plot(px, [r['time_s'][n] * 1e3 for r in rows], 'o-', label=n)
        if rows[0]['peak_mb']:
            axes[1].plot(px, [r['peak_mb'][n] for r in rows], 'o-', label=n)
    for ax, lab in zip(axes, ['forward time (ms)', 'peak extra memory (MB)']):
        ax.set_xlabel('megapixels (H x W)')
        ax.set_ylabel(lab)
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.grid(True, which='both', alpha=.3)
        ax.legend(fontsize=8)
    axes[0].set_title('backbone latency, CPU, batch 1')
    axes[1].set_title('backbone peak memory')
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == '__main__':
    main()
