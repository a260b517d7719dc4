"""The backbones' token projections on this CPU: torch's ``F.linear`` (BLAS) against our route
(``mmlinattn.core.ops.linear``: oneDNN's 1x1 convolution on the tokens viewed channels-last).

    python tools/analysis_tools/benchmark_linear.py
    python tools/analysis_tools/benchmark_linear.py --batch 2 --threads 2

The shapes are those of the tiny backbones at 224x224 (InLine-Swin-T's and InLine-PVT-T's MLPs and
qkv projections, stage by stage): ``(batch, tokens, C_in) -> C_out``. For each: the median time of
forward + backward (gradients of input, weight and bias, from a fixed output gradient) and of a
forward under ``no_grad``, the two routes one after the other on the same tensors in one run; the
ratio is BLAS time / ours. Also the largest difference between the two outputs. With one torch
thread the route is ``F.linear`` itself (mmlinattn.core.ops.linear), so use ``--threads`` 2 or
more. Prints a table with the CPU named; one run.
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from mmlinattn.workshop.benchmarking import cpu_name

# (C_in, C_out, tokens at 224x224): InLine-Swin-T (C 96..768, MLP ratio 4, qkv 3C) and
# InLine-PVT-T (C 64..512, MLP ratios 8, 8, 4, 4)
SHAPES = [(96, 384, 3136), (384, 96, 3136), (96, 288, 3136), (192, 768, 784), (768, 192, 784),
          (384, 1536, 196), (1536, 384, 196), (768, 3072, 49), (3072, 768, 49),
          (64, 512, 3136), (512, 64, 3136), (320, 1280, 196), (1280, 320, 196)]


def median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--reps', type=int, default=9)
    p.add_argument('--threads', type=int, help="torch CPU threads (default: torch's own)")
    args = p.parse_args(argv)
    from mmlinattn.core.ops import linear as L
    if args.threads:
        torch.set_num_threads(args.threads)
    L.set_cpu_linear('onednn')
    print(f'{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, '
          f'batch {args.batch}, fp32; ratio = F.linear (BLAS) time / ours; one run\n')
    print('| C_in -> C_out | tokens | train: BLAS / ours ms | ratio | inference: BLAS / ours ms '
          '| ratio | max abs diff |')
    print('|---|---|---|---|---|---|---|')
    g = torch.Generator().manual_seed(0)
    totals = [0.] * 4
    for cin, cout, n in SHAPES:
        x = torch.randn(args.batch, n, cin, generator=g, requires_grad=True)
        w = torch.randn(cout, cin, generator=g, requires_grad=True)
        b = torch.randn(cout, generator=g, requires_grad=True)
        grad = torch.randn(args.batch, n, cout, generator=g)
        row = []
        for fn in (F.linear, L.linear):
            row.append(median_ms(lambda: torch.autograd.grad(fn(x, w, b), (x, w, b), grad),
                                 args.reps))
        with torch.no_grad():
            for fn in (F.linear, L.linear):
                row.append(median_ms(lambda: fn(x, w, b), args.reps))
            diff = (F.linear(x, w, b) - L.linear(x, w, b)).abs().max().item()
        totals = [t + r for t, r in zip(totals, row)]
        print(f'| {cin} -> {cout} | {n} | {row[0]:.2f} / {row[1]:.2f} | {row[0] / row[1]:.2f} | '
              f'{row[2]:.2f} / {row[3]:.2f} | {row[2] / row[3]:.2f} | {diff:.1e} |')
    print(f'| **all** | | {totals[0]:.1f} / {totals[1]:.1f} | **{totals[0] / totals[1]:.2f}** | '
          f'{totals[2]:.1f} / {totals[3]:.1f} | **{totals[2] / totals[3]:.2f}** | |')
    return 0


if __name__ == '__main__':
    sys.exit(main())
