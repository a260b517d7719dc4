"""Time and peak memory of the attention cores against the floor and softmax SDPA, one run.

    python tools/analysis_tools/benchmark_attention.py                 # N = 1k .. 64k, h=4, d=32
    python tools/analysis_tools/benchmark_attention.py --tokens 1024 4096 --repeats 3 --out OUT
    python tools/analysis_tools/benchmark_attention.py --train --repeats 3   # forward + backward
    python tools/analysis_tools/benchmark_attention.py --stages --models mavit-t@512x512x2
    python tools/analysis_tools/benchmark_attention.py --passes     # passes over (N x d) memory

The floor: K^T V and Q (K^T V) of the same shapes, timed in the same run; ``--repeats``: rounds
with the ops interleaved (best and median ratios); ``--compile``: the cores compiled too;
``--stages``: at the shapes and layouts the backbones hand the cores. docs/benchmarks.md 1, 5, 14.
"""
import argparse
import contextlib
import os
import os.path as osp
import statistics
import sys

os.environ.setdefault('KINETO_LOG_LEVEL', '5')  # the profiler's start/stop chatter

import torch  # noqa: E402

from mmlinattn.analysis.benchmarking import (  # noqa: E402
    peak_memory,
    plot,
    rounds,
    save,
    synced,
    timeit,
    where,
)
from mmlinattn.analysis.profiling import count_passes  # noqa: E402
from mmlinattn.core.ops import CORES  # noqa: E402

# the kernel each core is timed with where it takes one (plain linear attention: ELU+1, as MALA's
# figures); every other setting is the core's default
KERNELS = {'linear': 'elu'}
#: family-arch@HxWxB: the segmentors' 512x512 at batch 2 and ImageNet's 224x224 at batch 1
STAGE_MODELS = ('mavit-t@512x512x2', 'mavit-t@224x224x1', 'inline-swin-t@512x512x2',
                'inline-swin-t@224x224x1', 'inline-pvt-t@512x512x2', 'inline-pvt-t@224x224x1')


def floor(q, k, v):
    """The two products no linear-time core can avoid: Q (K^T V)."""
    return torch.matmul(q, torch.matmul(k.transpose(-2, -1), v))


def core_ops(q, k, v, compiled=None):
    """name -> call, one per core of the table (softmax runs SDPA), plus ``<name>_c`` for the
    compiled ones."""
    ops = {}
    for name, core in CORES.items():
        kw = core.kwargs(kernel=KERNELS.get(name))
        ops[name] = (lambda c=core, kw=kw: c.linear(q, k, v, **kw))
        if compiled and name in compiled:
            ops[name + '_c'] = (lambda f=compiled[name], kw=kw: f(q, k, v, **kw))
    return ops


def train_step(fn, inputs):
    """``fn`` then the gradients of its output with respect to ``inputs`` (one fixed upstream
    gradient, made on the first call)."""
    grad_out = []

    def step():
        out = fn()
        if not grad_out:
            grad_out.append(torch.randn_like(out))
        return torch.autograd.grad(out, inputs, grad_out[0])
    return step


def timed_rounds(ops, repeats, device):
    """(every round's best-of time per op, the best round per op), the ops synced on ``device``."""
    r = rounds({n: synced(fn, device) for n, fn in ops.items()}, repeats, timeit)
    return r, {n: min(ts) for n, ts in r.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--tokens', type=int, nargs='+',
                   default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--head-dim', type=int, default=32)
    p.add_argument('--batch', type=int, default=1)
    p.add_argument('--softmax-max-tokens', type=int, default=32768,
                   help='skip softmax above this N (it is quadratic: 64k takes ~15 s a call)')
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--repeats', type=int, default=1,
                   help='timing rounds (best and median reported)')
    p.add_argument('--compile', action='store_true',
                   help='also time the linear-time cores compiled')
    p.add_argument('--train', action='store_true',
                   help='time forward + backward (grads of q, k, v) of the linear-time cores')
    p.add_argument('--passes', action='store_true',
                   help='count passes over (N x d) memory per core instead of timing')
    p.add_argument('--stages', action='store_true',
                   help='time the linear-time cores at the backbones\' stage shapes')
    p.add_argument('--models', nargs='+', default=list(STAGE_MODELS),
                   help='with --stages: family-arch@HxWxB, e.g. mavit-t@512x512x2')
    p.add_argument('--device', default='cpu', help='cpu or cuda (default: cpu)')
    p.add_argument('--out', default='work_dirs/benchmark_attention')
    args = p.parse_args(argv)
    if args.passes:
        return print_passes(args.heads, args.head_dim)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        print(f'--device {args.device}: this torch sees no CUDA device; run on the CPU (--device '
              'cpu) or on a machine with a GPU', file=sys.stderr)
        return 2
    torch.manual_seed(0)
    if args.stages:
        return bench_stages(args, device)
    h, d, b = args.heads, args.head_dim, args.batch
    linear_cores = [n for n in CORES if n != 'softmax']
    cores = linear_cores if args.train else list(CORES)
    compiled = ({n: torch.compile(CORES[n].linear, dynamic=False) for n in linear_cores}
                if args.compile else None)
    a, bb = torch.randn(2048, 2048, device=device), torch.randn(2048, 2048, device=device)
    ref_gflops = 2 * 2048 ** 3 / timeit(synced(lambda: a @ bb, device), min_time=0.5) / 1e9
    print(where(device))
    mode = 'forward + backward' if args.train else 'forward, inference mode'
    print(f'reference GEMM 2048^3: {ref_gflops:.1f} GFLOP/s; B={b} h={h} d={d} fp32; {mode}; '
          f'cores: {cores}\n')
    hdr = (f'{"N":>6} | {"floor":>8} ' + ' '.join(f'{n:>9}' for n in cores) + ' | '
           + ' '.join(f'{n[:6] + "/fl":>9}' for n in linear_cores) + ' | '
           + ' '.join(f'{"MB " + n[:6]:>9}' for n in cores))
    print(hdr + '\n' + '-' * len(hdr))
    rows, nan = [], float('nan')
    for n in args.tokens:
        q, k, v = (torch.randn(b, h, n, d, device=device).requires_grad_(args.train)
                   for _ in range(3))
        ops = dict(floor=lambda: floor(q, k, v), **core_ops(q, k, v, compiled))
        if n > args.softmax_max_tokens or args.train:
            ops.pop('softmax', None)
        if args.train:
            ops = {name: train_step(fn, (q, k, v)) for name, fn in ops.items()}
        with torch.inference_mode() if not args.train else contextlib.nullcontext():
            each, times = timed_rounds(ops, args.repeats, device)
            mem = {name: peak_memory(synced(fn, device)) / 2 ** 20 for name, fn in ops.items()
                   if not name.endswith('_c')}
        spread = {name: [t / f for t, f in zip(ts, each['floor'])] for name, ts in each.items()
                  if name not in ('floor', 'softmax')}
        rows.append(dict(N=n, time_s=times, peak_mb=mem, rounds_s=each,
                         floor_ratio_best_median={k: [min(v), statistics.median(v)]
                                                  for k, v in spread.items()},
                         gflops_linear_ops=4 * b * h * n * d * d / 1e9,
                         gflops_sdpa=4 * b * h * n * n * d / 1e9, gemm_ref_gflops=ref_gflops))
        print(f'{n:>6} | {times["floor"] * 1e3:7.2f}m '
              + ' '.join(f'{times.get(c, nan) * 1e3:8.2f}m' for c in cores) + ' | '
              + ' '.join(f'{times[c] / times["floor"]:9.2f}' for c in linear_cores) + ' | '
              + ' '.join(f'{mem.get(c, nan):9.1f}' for c in cores))
    names = list(rows[0]['floor_ratio_best_median'])
    print(f'\nratio to the floor over {args.repeats} round(s), best / median '
          f'(_c: torch.compile, inductor)')
    print(f'{"N":>6} | ' + ' | '.join(f'{n:>13}' for n in names))
    for r in rows:
        br = r['floor_ratio_best_median']
        print(f'{r["N"]:>6} | ' + ' | '.join(f'{br[n][0]:5.2f} / {br[n][1]:5.2f}' for n in names))
    stem = osp.join(args.out, 'benchmark_attention_train' if args.train else 'benchmark_attention')
    save(stem, dict(where=where(device), threads=torch.get_num_threads(), train=args.train,
                    rows=rows))
    styles = ['k-o', 'b-s', 'g-^', 'r-v', 'm-D', 'y-P', 'k-x']
    try:
        plot(stem + '.png', [(c, s, [(r['N'], r['time_s'][c] * 1e3) for r in rows
                                     if c in r['time_s']],
                              [(r['N'], r['peak_mb'][c]) for r in rows
                               if c in r['peak_mb'] and c != 'floor'])
                             for c, s in [*((c, styles[i % len(styles)])
                                            for i, c in enumerate(CORES)), ('floor', 'c--')]],
             'tokens N', f'attention time{", forward + backward" if args.train else ""}, '
             f'{device.type} fp32', xbase=2)
        print(f'\nplot: {stem}.png')
    except ImportError:
        print('matplotlib not installed: no plot')


# --------------------------------------------------------------------------------------------------
# --stages: the cores at the shapes the backbones give them
# --------------------------------------------------------------------------------------------------
def parse_model(spec: str):
    """``family-arch@HxWxB`` -> (family name, arch letter, (H, W), B)."""
    from mmlinattn.core.families import FAMILIES
    try:
        name, size = spec.split('@')
        family, arch = name.rsplit('-', 1)
        h, w, b = (int(x) for x in size.lower().split('x'))
        family = family.replace('-', '_')
        if arch not in FAMILIES[family].archs:
            raise KeyError(arch)
    except (ValueError, KeyError):
        names = ', '.join(f'{f.prefix}-{a}' for f in FAMILIES.values() for a in f.archs)
        raise SystemExit(f'--models {spec!r}: write family-arch@HxWxB, e.g. mavit-t@512x512x2, '
                         f'with one of {names}') from None
    return family, arch, (h, w), b


def stage_calls(family: str, arch: str, hw, batch: int) -> list:
    """The distinct core calls of the backbone's forward on a (batch, 3, H, W) image, in order:
    dicts of the core's name, q, k, v as (shape, stride), the RoPE tables' shape or None, and
    whether an attention bias came (window blocks). Recorded on the meta device: no arithmetic,
    and the cores are not run (each call returns an empty output of the core's shape)."""
    from mmlinattn.core.families import FAMILIES
    from mmlinattn.core.ops.cores import Core
    fam = FAMILIES[family]
    model = fam.backbone(arch=fam.archs[arch]).eval().to('meta')
    calls, seen = [], set()
    run = Core.run

    def record(self, q, k, v, bound, rope=None, attn_bias=None, dropout_p=0.):
        call = dict(core=self.name, bound=bound,
                    **{n: (tuple(t.shape), tuple(t.stride())) for n, t in zip('qkv', (q, k, v))},
                    rope=None if rope is None else tuple(rope[0].shape),
                    bias=attn_bias is not None)
        key = repr(sorted((n, c) for n, c in call.items() if n != 'bound'))
        if key not in seen:
            seen.add(key)
            calls.append(call)
        # the output's shape without the core (autocast, which the cores enter, takes no meta)
        return q.new_empty(*q.shape[:-1], v.shape[-1])
    Core.run = record
    try:
        with torch.no_grad():
            model(torch.empty(batch, 3, *hw, device='meta'))
    finally:
        Core.run = run
    return calls


def strided(shape, stride, device) -> torch.Tensor:
    """A random tensor of ``shape`` laid out with ``stride`` (a view into a buffer that spans
    it, as the model's views of one projection)."""
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    return torch.randn(span, device=device).as_strided(shape, stride)


def bench_stages(args, device: torch.device) -> int:
    from mmlinattn.core.ops import chunk_tokens, rope_angles, rope_sin_cos
    print(f'{where(device)}; fp32, forward, inference mode; chunk {chunk_tokens(device)} tokens; '
          f'best of {args.repeats} round(s)\n')
    hdr = (f'{"model":<24} {"stage":>5} {"core":<7} {"B":>2} {"h":>3} {"N":>6} {"d":>3} '
           f'{"layout":<9} | {"floor":>8} {"core":>8} {"contig.":>8} | {"core/fl":>7} '
           f'{"contig/fl":>9} {"ns/token":>8}')
    print(hdr + '\n' + '-' * len(hdr))
    rows = []
    for spec in args.models:
        family, arch, hw, batch = parse_model(spec)
        tokens_seen = []
        for call in stage_calls(family, arch, hw, batch):
            shape, core = call['q'][0], CORES[call['core']]
            n = shape[-2]
            if n not in tokens_seen:
                tokens_seen.append(n)
            if call['core'] == 'softmax' or call['bias']:
                continue  # the floor compares linear-time cores
            q, k, v = (strided(*call[x], device) for x in 'qkv')
            contiguous = [t.contiguous() for t in (q, k, v)]
            rope = None
            if call['rope'] is not None and core.rope != 'none':
                side = int(round(n ** 0.5))
                grid = (side, n // side) if side * (n // side) == n else (1, n)
                rope = rope_sin_cos(grid, rope_angles(shape[-1], device=device))
            kw = dict(call['bound'])
            with torch.inference_mode():
                each, t = timed_rounds(dict(floor=lambda: floor(q, k, v),
                                            core=lambda: core.run(q, k, v, kw, rope=rope),
                                            contig=lambda: core.run(*contiguous, kw, rope=rope)),
                                       args.repeats, device)
            b, h, _, d = shape[-4:] if len(shape) >= 4 else (1, *shape[-3:])
            layout = 'contig' if q.is_contiguous() else 'strided'
            row = dict(model=spec, stage=tokens_seen.index(n) + 1, core=call['core'], B=b, h=h,
                       N=n, d=d, layout=layout, stride=call['q'][1], rope=rope is not None,
                       time_s=t, rounds_s=each, ratio=t['core'] / t['floor'],
                       ratio_contiguous=t['contig'] / t['floor'])
            rows.append(row)
            print(f'{spec:<24} {row["stage"]:>5} {call["core"]:<7} {b:>2} {h:>3} {n:>6} {d:>3} '
                  f'{layout:<9} | {t["floor"] * 1e3:7.2f}m {t["core"] * 1e3:7.2f}m '
                  f'{t["contig"] * 1e3:7.2f}m | {row["ratio"]:7.2f} {row["ratio_contiguous"]:9.2f} '
                  f'{t["core"] / (b * h * n) * 1e9:8.1f}', flush=True)
    stem = osp.join(args.out, f'benchmark_attention_stages_{device.type}')
    save(stem, dict(where=where(device), threads=torch.get_num_threads(),
                    chunk_tokens=chunk_tokens(device), repeats=args.repeats, rows=rows))
    print(f'\nfloor: Q (K^T V) on the same inputs; contig.: the core on contiguous copies of q, k, '
          f'v; ns/token: core time / (B h N)\njson: {stem}.json')
    return 0


def print_passes(h: int, d: int, n: int = 97):
    """Passes over (n x d) memory per linear-time core (n unlike any other size of the call)."""
    q, k, v = (torch.randn(1, h, n, d, requires_grad=True) for _ in range(3))
    ops = dict(floor=lambda: floor(q, k, v),
               **{c: f for c, f in core_ops(q, k, v).items() if c != 'softmax'})
    print(f'passes over (N x d) memory, h={h} d={d}: inference forward | forward + backward')
    for name, fn in ops.items():
        with torch.inference_mode():
            inference = count_passes(fn, n, d)
        step = train_step(fn, (q, k, v))
        step()  # the first call makes the upstream gradient
        train = count_passes(step, n, d)
        print(f'{name:>10} | {len(inference):3d} | {len(train):3d}   {" ".join(inference)}')


if __name__ == '__main__':
    sys.exit(main())
