"""Time and peak memory of the attention ops against softmax SDPA, one run, one process.

    python tools/analysis_tools/benchmark_attention.py                 # N = 1k .. 64k, h=4, d=32
    python tools/analysis_tools/benchmark_attention.py --tokens 1024 4096 --out work_dirs/bench

For every N it prints the time of softmax SDPA, plain linear, InLine and MALA attention, the ratios to
SDPA and to plain linear, the ratio to the *floor* (the two unavoidable matmuls K^T V and Q (K^T V)
of the same shapes timed alone in the same run), and the GFLOP/s each reaches next to a large GEMM
measured in the same run. Peak memory is what the op allocates on top of its inputs (torch profiler).
A PNG plot and a JSON file go to --out.

``--repeats R`` times every op R times, the ops interleaved within each round, and adds a table of the
ratios to the floor per round: best and median over the rounds (the spread of a noisy machine).
``--compile`` adds InLine and MALA compiled with ``torch.compile`` (inductor, fused elementwise
kernels around the GEMMs; compiled once per N, the compile time is not counted).
"""
import argparse
import json
import os
import os.path as osp
import platform
import statistics

os.environ.setdefault('KINETO_LOG_LEVEL', '5')  # the profiler's start/stop chatter

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from benchmark_utils import peak_memory, timeit  # noqa: E402  (tools/analysis_tools/)

from mmlinattn.ops import inline_attention, linear_attention, mala_attention  # noqa: E402


def gemm_gflops(n=2048):
    a, b = torch.randn(n, n), torch.randn(n, n)
    t = timeit(lambda: a @ b, min_time=0.5)
    return 2 * n ** 3 / t / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--tokens', type=int, nargs='+',
                   default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--head-dim', type=int, default=32)
    p.add_argument('--batch', type=int, default=1)
    p.add_argument('--softmax-max-tokens', type=int, default=32768,
                   help='skip SDPA above this N (it is quadratic: 64k takes ~15 s a call)')
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--repeats', type=int, default=1, help='timing rounds (best and median reported)')
    p.add_argument('--compile', action='store_true', help='also time torch.compile-d InLine and MALA')
    p.add_argument('--out', default='work_dirs/benchmark_attention')
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    h, d, b = args.heads, args.head_dim, args.batch
    if args.compile:
        compiled_inline = torch.compile(inline_attention, dynamic=False)
        compiled_mala = torch.compile(mala_attention, dynamic=False)
    ref_gflops = gemm_gflops()
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}')
    print(f'reference GEMM 2048^3: {ref_gflops:.1f} GFLOP/s; B={b} h={h} d={d} fp32\n')
    hdr = (f'{"N":>6} | {"floor":>8} {"sdpa":>9} {"linear":>8} {"inline":>8} {"mala":>8} | '
           f'{"in/floor":>8} {"ma/floor":>8} {"in/lin":>7} {"ma/lin":>7} {"sdpa/in":>8} | '
           f'{"GF/s in":>7} {"GF/s ma":>7} | {"MB in":>6} {"MB ma":>6} {"MB sdpa":>7}')
    print(hdr)
    print('-' * len(hdr))
    rows = []
    for n in args.tokens:
        q, k, v = (torch.randn(b, h, n, d) for _ in range(3))

        def floor():
            s = torch.matmul(k.transpose(-2, -1), v)
            return torch.matmul(q, s)
        ops = {
            'floor': floor,
            'linear': lambda: linear_attention(q, k, v, kernel='elu'),
            'inline': lambda: inline_attention(q, k, v),
            'mala': lambda: mala_attention(q, k, v),
        }
        if n <= args.softmax_max_tokens:
            ops['sdpa'] = lambda: F.scaled_dot_product_attention(q, k, v)
        if args.compile:
            ops['inline_c'] = lambda: compiled_inline(q, k, v)
            ops['mala_c'] = lambda: compiled_mala(q, k, v)
        with torch.inference_mode():
            rounds = {name: [] for name in ops}
            for _ in range(args.repeats):
                for name, fn in ops.items():
                    rounds[name].append(timeit(fn))
            times = {name: min(ts) for name, ts in rounds.items()}
            mem = {name: peak_memory(fn) / 2 ** 20 for name, fn in ops.items()
                   if not name.endswith('_c')}
        flops_lin = 4 * b * h * n * d * d
        spread = {name: [t / f for t, f in zip(ts, rounds['floor'])] for name, ts in rounds.items()
                  if name in ('inline', 'mala', 'inline_c', 'mala_c')}
        row = dict(N=n, time_s=times, peak_mb=mem, rounds_s=rounds,
                   floor_ratio_best_median={k: [min(v), statistics.median(v)] for k, v in spread.items()},
                   gflops_linear_ops=flops_lin / 1e9, gflops_sdpa=4 * b * h * n * n * d / 1e9, gemm_ref_gflops=ref_gflops)
        rows.append(row)
        sd = times.get('sdpa', float('nan'))
        print(f'{n:>6} | {times["floor"] * 1e3:7.2f}m {sd * 1e3:8.1f}m {times["linear"] * 1e3:7.2f}m '
              f'{times["inline"] * 1e3:7.2f}m {times["mala"] * 1e3:7.2f}m | '
              f'{times["inline"] / times["floor"]:8.2f} {times["mala"] / times["floor"]:8.2f} '
              f'{times["inline"] / times["linear"]:7.2f} {times["mala"] / times["linear"]:7.2f} '
              f'{sd / times["inline"]:8.1f} | '
              f'{flops_lin / times["inline"] / 1e9:7.1f} {flops_lin / times["mala"] / 1e9:7.1f} | '
              f'{mem["inline"]:6.1f} {mem["mala"]:6.1f} {mem.get("sdpa", float("nan")):7.1f}')
    names = [n for n in ('inline', 'mala', 'inline_c', 'mala_c') if n in rows[0]['floor_ratio_best_median']]
    print(f'\nratio to the floor over {args.repeats} round(s), best / median '
          f'(_c: torch.compile, inductor)')
    print(f'{"N":>6} | ' + ' | '.join(f'{n:>13}' for n in names))
    for r in rows:
        br = r['floor_ratio_best_median']
        print(f'{r["N"]:>6} | ' + ' | '.join(f'{br[n][0]:5.2f} / {br[n][1]:5.2f}' for n in names))
    os.makedirs(args.out, exist_ok=True)
    with open(osp.join(args.out, 'benchmark_attention.json'), 'w') as f:
        json.dump(dict(threads=torch.get_num_threads(), torch=torch.__version__, rows=rows), f, indent=1)
    try:
        plot(rows, osp.join(args.out, 'benchmark_attention.png'))
        print(f'\nplot: {osp.join(args.out, "benchmark_attention.png")}')
    except ImportError:
        print('matplotlib not installed: no plot')


def plot(rows, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, style in [('sdpa', 'k-o'), ('linear', 'b-s'), ('inline', 'g-^'), ('mala', 'r-v'),
                        ('floor', 'c--')]:
        pts = [(r['N'], r['time_s'][name] * 1e3) for r in rows if name in r['time_s']]
        if pts:
            ax1.plot(*zip(*pts), style, label=name)
        pts = [(r['N'], r['peak_mb'][name]) for r in rows if name in r['peak_mb']]
        if pts and name != 'floor':
            ax2.plot(*zip(*pts), style, label=name)
    for ax, lab in [(ax1, 'time (ms)'), (ax2, 'peak extra memory (MB)')]:
        ax.set_xscale('log', base=2)
        ax.set_yscale('log')
        ax.set_xlabel('tokens N')
        ax.set_ylabel(lab)
        ax.grid(True, which='both', alpha=.3)
        ax.legend()
    ax1.set_title('attention time, CPU fp32')
    ax2.set_title('attention peak memory')
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == '__main__':
    main()
