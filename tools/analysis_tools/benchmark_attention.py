"""Time and peak memory of the attention ops against softmax SDPA, one run, one process.

    python tools/analysis_tools/benchmark_attention.py                 # N = 1k .. 64k, h=4, d=32
    python tools/analysis_tools/benchmark_attention.py --tokens 1024 4096 --out work_dirs/bench

For every N it prints the time of every core of the table (mmlinattn.core.ops.CORES: softmax runs
SDPA, then plain linear, InLine, MALA and any core registered since), the ratio of each linear-time
core to the *floor* (the two unavoidable matmuls K^T V and Q (K^T V) of the same shapes timed alone
in the same run), and the peak memory of each; the JSON file also keeps the GFLOP/s of a large GEMM
measured in the same run. Peak memory is what the op allocates on top of its inputs (torch
profiler). A PNG plot and a JSON file go to --out.

``--repeats R`` times every op R times, the ops interleaved within each round, and adds a table of
the ratios to the floor per round: best and median over the rounds (the spread of a noisy machine).
``--compile`` adds the linear-time cores compiled with ``torch.compile`` (inductor, fused
elementwise kernels around the GEMMs; compiled once per N, the compile time is not counted).

``--train`` times forward + backward instead (gradients of q, k and v for one upstream gradient):
every linear-time core next to the floor's forward + backward (the two products and their four
gradient products), and the peak memory of the step; softmax is left out.

    python tools/analysis_tools/benchmark_attention.py --train --repeats 3

``--stages`` times the linear-time cores at the shapes the backbones hand them instead of the
square grid: one row per stage of each model (tokens, heads, head dim, batch and the memory layout
the model's q, k, v come in: MAViT's heads are strided views of one channels-first projection),
recorded from a forward of the backbone on the meta device (no arithmetic), then timed on
--device with inputs of that shape and layout, next to the floor of the same inputs and the core
on contiguous copies; MALA gets the stage's RoPE tables as in the model. The defaults are MAViT-T,
InLine-Swin-T and InLine-PVT-T at 512x512 (batch 2, the segmentors' size) and 224x224 (batch 1).

    python tools/analysis_tools/benchmark_attention.py --stages --repeats 3
    python tools/analysis_tools/benchmark_attention.py --stages --models mavit-t@512x512x2

On CUDA (``--device cuda``) every timed call ends with ``torch.cuda.synchronize()``.

``--passes`` prints, instead of timing, how many passes over (N x d) memory every linear-time core
makes in the inference forward and in forward + backward
(:func:`tools.workshop.profiling.count_passes` at a small N): the figure that does not depend on
the CPU.
"""
import argparse
import contextlib
import json
import os
import os.path as osp
import statistics
import sys

os.environ.setdefault('KINETO_LOG_LEVEL', '5')  # the profiler's start/stop chatter

import torch  # noqa: E402

from mmlinattn.core.ops import CORES  # noqa: E402

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..', '..')))  # for tools.workshop
from tools.workshop.benchmarking import cpu_name, peak_memory, timeit  # noqa: E402
from tools.workshop.profiling import count_passes  # noqa: E402


def gemm_gflops(n=2048, device='cpu'):
    device = torch.device(device)
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    t = timeit(on_device(lambda: a @ b, device), min_time=0.5)
    return 2 * n ** 3 / t / 1e9


# the kernel each core is timed with where it takes one (plain linear attention: ELU+1, as MALA's
# figures); every other setting is the core's default
KERNELS = {'linear': 'elu'}


def on_device(fn, device: torch.device):
    """``fn`` that returns once its work is done: on CUDA it synchronizes (kernels are queued)."""
    if device.type != 'cuda':
        return fn

    def synced():
        out = fn()
        torch.cuda.synchronize(device)
        return out
    return synced


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


def main():
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
                   help='time the linear-time cores at the backbones\' stage shapes (see above)')
    p.add_argument('--models', nargs='+', default=list(STAGE_MODELS),
                   help='with --stages: family-arch@HxWxB, e.g. mavit-t@512x512x2')
    p.add_argument('--device', default='cpu', help='cpu or cuda (default: cpu)')
    p.add_argument('--out', default='work_dirs/benchmark_attention')
    args = p.parse_args()
    if args.passes:
        return print_passes(args.heads, args.head_dim)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        print(f'--device {args.device}: this torch sees no CUDA device; run on the CPU (--device '
              'cpu) or on a machine with a GPU', file=sys.stderr)
        return 2
    if args.stages:
        return bench_stages(args, device)
    torch.manual_seed(0)
    h, d, b = args.heads, args.head_dim, args.batch
    linear_cores = [n for n in CORES if n != 'softmax']
    cores = linear_cores if args.train else list(CORES)
    compiled = ({n: torch.compile(CORES[n].linear, dynamic=False) for n in linear_cores}
                if args.compile else None)
    ref_gflops = gemm_gflops(device=device)
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, {where(device)}')
    mode = 'forward + backward' if args.train else 'forward, inference mode'
    print(f'reference GEMM 2048^3: {ref_gflops:.1f} GFLOP/s; B={b} h={h} d={d} fp32; {mode}; '
          f'cores: {cores}\n')
    hdr = (f'{"N":>6} | {"floor":>8} ' + ' '.join(f'{n:>9}' for n in cores) + ' | '
           + ' '.join(f'{n[:6] + "/fl":>9}' for n in linear_cores) + ' | '
           + ' '.join(f'{"MB " + n[:6]:>9}' for n in cores))
    print(hdr)
    print('-' * len(hdr))
    rows = []
    for n in args.tokens:
        q, k, v = (torch.randn(b, h, n, d, device=device).requires_grad_(args.train)
                   for _ in range(3))

        ops = dict(floor=lambda: floor(q, k, v), **core_ops(q, k, v, compiled))
        if n > args.softmax_max_tokens or args.train:
            ops.pop('softmax', None)
        if args.train:
            ops = {name: train_step(fn, (q, k, v)) for name, fn in ops.items()}
        ops = {name: on_device(fn, device) for name, fn in ops.items()}
        with torch.inference_mode() if not args.train else contextlib.nullcontext():
            rounds = {name: [] for name in ops}
            for _ in range(args.repeats):
                for name, fn in ops.items():
                    rounds[name].append(timeit(fn))
            times = {name: min(ts) for name, ts in rounds.items()}
            mem = {name: peak_memory(fn) / 2 ** 20 for name, fn in ops.items()
                   if not name.endswith('_c')}
        flops_lin = 4 * b * h * n * d * d
        spread = {name: [t / f for t, f in zip(ts, rounds['floor'])] for name, ts in rounds.items()
                  if name != 'floor' and name != 'softmax'}
        best_median = {k: [min(v), statistics.median(v)] for k, v in spread.items()}
        row = dict(N=n, time_s=times, peak_mb=mem, rounds_s=rounds,
                   floor_ratio_best_median=best_median, gflops_linear_ops=flops_lin / 1e9,
                   gflops_sdpa=4 * b * h * n * n * d / 1e9, gemm_ref_gflops=ref_gflops)
        rows.append(row)
        nan = float('nan')
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
    os.makedirs(args.out, exist_ok=True)
    stem = 'benchmark_attention_train' if args.train else 'benchmark_attention'
    with open(osp.join(args.out, stem + '.json'), 'w') as f:
        json.dump(dict(threads=torch.get_num_threads(), torch=torch.__version__, train=args.train,
                       rows=rows), f, indent=1)
    try:
        plot(rows, osp.join(args.out, stem + '.png'), 'forward + backward' if args.train else '')
        print(f'\nplot: {osp.join(args.out, stem + ".png")}')
    except ImportError:
        print('matplotlib not installed: no plot')


def where(device: torch.device) -> str:
    """The processor the timings ran on, in words."""
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    return f'CPU: {cpu_name()}'


# --------------------------------------------------------------------------------------------------
# --stages: the cores at the shapes the backbones give them
# --------------------------------------------------------------------------------------------------
#: family-arch@HxWxB: the segmentors' 512x512 at batch 2 and ImageNet's 224x224 at batch 1
STAGE_MODELS = ('mavit-t@512x512x2', 'mavit-t@224x224x1', 'inline-swin-t@512x512x2',
                'inline-swin-t@224x224x1', 'inline-pvt-t@512x512x2', 'inline-pvt-t@224x224x1')


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
    from mmlinattn.core.ops import CORES, chunk_tokens, rope_angles, rope_sin_cos
    torch.manual_seed(0)
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, {where(device)}; '
          f'fp32, forward, inference mode; chunk {chunk_tokens(device)} tokens; best of '
          f'{args.repeats} round(s)\n')
    hdr = (f'{"model":<24} {"stage":>5} {"core":<7} {"B":>2} {"h":>3} {"N":>6} {"d":>3} '
           f'{"layout":<9} | {"floor":>8} {"core":>8} {"contig.":>8} | {"core/fl":>7} '
           f'{"contig/fl":>9} {"ns/token":>8}')
    print(hdr)
    print('-' * len(hdr))
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
            ops = dict(floor=lambda: floor(q, k, v),
                       core=lambda: core.run(q, k, v, kw, rope=rope),
                       contig=lambda: core.run(*contiguous, kw, rope=rope))
            ops = {name: on_device(fn, device) for name, fn in ops.items()}
            with torch.inference_mode():
                rounds = {name: [] for name in ops}
                for _ in range(args.repeats):
                    for name, fn in ops.items():
                        rounds[name].append(timeit(fn))
            t = {name: min(ts) for name, ts in rounds.items()}
            b, h, _, d = shape[-4:] if len(shape) >= 4 else (1, *shape[-3:])
            layout = 'contig' if q.is_contiguous() else 'strided'
            row = dict(model=spec, stage=tokens_seen.index(n) + 1, core=call['core'], B=b, h=h,
                       N=n, d=d, layout=layout, stride=call['q'][1], rope=rope is not None,
                       time_s=t, rounds_s=rounds, ratio=t['core'] / t['floor'],
                       ratio_contiguous=t['contig'] / t['floor'])
            rows.append(row)
            print(f'{spec:<24} {row["stage"]:>5} {call["core"]:<7} {b:>2} {h:>3} {n:>6} {d:>3} '
                  f'{layout:<9} | {t["floor"] * 1e3:7.2f}m {t["core"] * 1e3:7.2f}m '
                  f'{t["contig"] * 1e3:7.2f}m | {row["ratio"]:7.2f} {row["ratio_contiguous"]:9.2f} '
                  f'{t["core"] / (b * h * n) * 1e9:8.1f}', flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = osp.join(args.out, f'benchmark_attention_stages_{device.type}.json')
    with open(path, 'w') as f:
        json.dump(dict(threads=torch.get_num_threads(), torch=torch.__version__,
                       device=where(device), chunk_tokens=chunk_tokens(device),
                       repeats=args.repeats, rows=rows), f, indent=1)
    print(f'\nfloor: Q (K^T V) on the same inputs; contig.: the core on contiguous copies of q, k, '
          f'v; ns/token: core time / (B h N)\njson: {path}')
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


def plot(rows, path, what=''):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    styles = ['k-o', 'b-s', 'g-^', 'r-v', 'm-D', 'y-P', 'k-x']
    named = [(c, styles[i % len(styles)]) for i, c in enumerate(CORES)] + [('floor', 'c--')]
    for name, style in named:
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
    ax1.set_title(f'attention time{", " + what if what else ""}, CPU fp32')
    ax2.set_title('attention peak memory')
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == '__main__':
    sys.exit(main())
