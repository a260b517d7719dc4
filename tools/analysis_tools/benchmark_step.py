"""One training step and one inference of whole detectors / segmentors: time and peak memory.

    python tools/analysis_tools/benchmark_step.py CONFIG [CONFIG ...]
    python tools/analysis_tools/benchmark_step.py --matrix --references --out OUT
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --size 512 1024
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --size 2048 --no-train
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --size 512 --compile
    python tools/analysis_tools/benchmark_step.py --matrix --device cuda --amp          # on a GPU
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --profile --out OUT
    python tools/analysis_tools/benchmark_step.py CONFIG --hooks --size 800x1333 [--iters 3]
    python tools/analysis_tools/benchmark_step.py --allreduce 2   # the hooks' vote's collective

At the config's input size and per-GPU batch (synthetic data), each config in its own process
(its own peak memory); ratio columns: the reference backbone's time over ours (> 1: ours faster).
``--hooks``: what our default training hooks cost per iteration after a real step (median of
``--iters``), against mmengine's RuntimeInfoHook and 0.1's check (a sync per loss term and a norm
over every parameter). docs/benchmarks.md sections 4, 5, 8 and 9.
"""
import argparse
import json
import os
import os.path as osp
import statistics
import sys
import time

from mmlinattn.analysis.benchmarking import (
    REFERENCES,
    bench_model,
    in_fresh_process,
    infer_together,
    matrix_configs,
    measure_one,
    once,
    recipe_name,
    reference_jobs,
    result,
    save,
    where,
)
from mmlinattn.analysis.profiling import profile_step, summary_table

SWITCHES = ('amp', 'compile', 'no_train', 'same_head_work', 'profile')


def run_job(config, ref, args, size=None):
    """One config at one size in a fresh process (clean peak memory); returns its result dict."""
    argv = ['--one', config, '--device', args.device, '--warmup', args.warmup,
            '--infer-reps', args.infer_reps]
    argv += ['--reference', ref] if ref else []
    argv += ['--batch', args.batch] if args.batch else []
    argv += ['--size', f'{size[0]}x{size[1]}'] if size else []
    argv += ['--' + s.replace('_', '-') for s in SWITCHES if getattr(args, s)]
    r, proc = in_fresh_process(osp.abspath(__file__), argv)
    if r is not None:
        return r
    failed = dict(config=osp.basename(config)[:-3], backbone=ref or '?', size=size and list(size))
    if proc.returncode < 0:  # killed by a signal, most often SIGKILL from the kernel's OOM killer
        return dict(failed, error=f'process killed (signal {-proc.returncode}), out of memory?')
    return dict(failed, error=(proc.stdout.strip().splitlines()[-1:] or ['?'])[0][:200])


def _ratio(ref, ours):
    return '-' if ref is None or ours is None else f'{ref / ours:.2f}'


def table(rows):
    """Markdown: time / memory per config, and the reference backbones' time over ours in the same
    detector / segmentor at the same size (> 1: ours is faster)."""
    sized = any(r.get('size') for r in rows)
    size_of = lambda r: 'x'.join(map(str, r['size'])) if r.get('size') else ''  # noqa: E731
    out = ['| config | ' + ('size | ' if sized else '') + 'backbone | params (M) | batch | train '
           'step (s) | inference (s) | train peak (MB) | Swin-T / this: train, infer | '
           'PVT-S / this: train, infer |', '|' + '---|' * (10 if sized else 9)]
    refs = {(recipe_name(r['config']), r['backbone'], size_of(r)): r for r in rows
            if r.get('backbone') in REFERENCES and 'error' not in r}
    for r in rows:
        size = f'{size_of(r)} | ' if sized else ''
        if 'error' in r:
            out.append(f"| {r['config']} | {size}{r['backbone']} | error: {r['error']} |||||||")
            continue
        is_ref = r['backbone'] in REFERENCES
        ratios = []
        for ref in REFERENCES:
            b = refs.get((recipe_name(r['config']), ref, size_of(r)))
            cell = '' if b is None or is_ref else \
                f"{_ratio(b['train_s'], r['train_s'])} / {_ratio(b['infer_s'], r['infer_s'])}"
            if cell and r.get('infer_backbone_s') and b.get('infer_backbone_s'):
                cell += f" (backbone {_ratio(b['infer_backbone_s'], r['infer_backbone_s'])})"
            ratios.append(cell)
        name = recipe_name(r['config']).format(r['backbone'].lower()) if is_ref else r['config']
        trained = r['train_s'] is not None  # inference-only rows (--no-train) have no batch
        train, mem, batch = ((r['train_s'], r['train_mem_mb'], r['batch']) if trained
                             else ('-', '-', '-'))
        infer = r['infer_s'] if not r.get('infer_backbone_s') else \
            f"{r['infer_s']} (backbone {r['infer_backbone_s']})"
        out.append(f"| {name} | {size}{r['backbone']} | {r['params_m']} | {batch} | {train} | "
                   f"{infer} | {mem} | {ratios[0]} | {ratios[1]} |")
    return '\n'.join(out)


def report(args, rows, md):
    """The table under the machine the rows were measured on; OUT.json and OUT.md with --out."""
    md = f"{rows[0].get('where', where(args.device)) if rows else where(args.device)}\n\n{md}"
    print(md)
    if args.out:
        save(args.out, rows, md)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('configs', nargs='*', help='config files')
    p.add_argument('--matrix', action='store_true', help='the smallest variant of every cell')
    p.add_argument('--references', action='store_true',
                   help="also each model family with mmdet's Swin-T and PVT-S backbones")
    p.add_argument('--with-references', action='store_true',
                   help="also each given config's detector / segmentor with Swin-T and PVT-S")
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    p.add_argument('--amp', action='store_true', help='autocast (CUDA: fp16, AmpOptimWrapper)')
    p.add_argument('--batch', type=int, help="images per step (default: the config's)")
    p.add_argument('--warmup', type=int, default=1, help='untimed training steps first')
    p.add_argument('--size', type=lambda v: tuple(int(x) for x in (v.split('x') * 2)[:2]),
                   nargs='+', help='H or HxW, one or more: every model at every size')
    p.add_argument('--no-train', action='store_true', help='time inference only')
    p.add_argument('--compile', action='store_true', help='torch.compile the backbone (inductor)')
    p.add_argument('--infer-reps', type=int, default=1, help='inference time = the median of this '
                   'many calls; > 1 also times the backbone alone')
    p.add_argument('--infer-together', action='store_true', help='inference only, every model in '
                   'this one process with the same head work, in turn (--infer-reps default 5)')
    p.add_argument('--same-head-work', action='store_true',
                   help='detectors: no score threshold or NMS drops a proposal or detection')
    p.add_argument('--profile', action='store_true', help='one warm step by model part instead')
    p.add_argument('--hooks', action='store_true', help='our training hooks per iteration')
    p.add_argument('--iters', type=int, default=3, help='with --hooks: timed iterations (median)')
    p.add_argument('--allreduce', type=int, metavar='N',
                   help="time the hooks' vote's all-reduce over N local ranks (gloo)")
    p.add_argument('--out', help='write OUT.json and OUT.md')
    p.add_argument('--table', help='only print the table of a saved OUT.json')
    p.add_argument('--one', help=argparse.SUPPRESS)
    p.add_argument('--reference', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    size = args.size[0] if args.size else None
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
    elif args.one and args.profile:
        result(profile_step(args.one, args.reference, args.device, args.batch, size,
                            max(args.warmup, 1)))
    elif args.one:
        result(measure_one(args.one, args.reference, args.device, args.amp, args.batch,
                           args.warmup, size, args.compile, not args.no_train, args.infer_reps,
                           args.same_head_work))
    else:
        return run_all(p, args)
    return 0


def run_all(p, args):
    jobs = [(c, None) for c in args.configs]
    if args.matrix:
        jobs += [(c, None) for c in matrix_configs()]
    if args.references:
        jobs += reference_jobs()
    if args.with_references:  # one reference row per detector / segmentor recipe
        firsts = {}
        for c in args.configs:
            firsts.setdefault(recipe_name(osp.basename(c)), c)
        jobs += [(c, ref) for c in firsts.values() for ref in REFERENCES]
    if args.hooks or args.allreduce:
        return hooks(args, [c for c, ref in jobs if ref is None])
    if not jobs:
        p.error('give config files, --matrix or --references')
    if args.infer_together:  # --infer-reps' default of 1 means 5 here (the help text says so)
        rows = [r for size in (args.size or [None])
                for r in infer_together(jobs, args.device, size,
                                        5 if args.infer_reps == 1 else args.infer_reps)]
        report(args, rows, table(rows))
        return 0
    runs = [(size, config, ref) for size in (args.size or [None]) for config, ref in jobs]
    rows = []
    for i, (size, config, ref) in enumerate(runs, 1):
        t0 = time.time()
        r = run_job(config, ref, args, size)
        rows.append(r)
        what = (f'[{i}/{len(runs)}] {osp.basename(config)[:-3]}' + (f' [{ref}]' if ref else '')
                + (f' at {size[0]}x{size[1]}' if size else ''))
        if 'error' in r:
            print(f'{what}: ERROR {r["error"]}', flush=True)
        elif args.profile:
            print(f'{what}: forward {r["forward_s"]:.2f} s, backward {r["backward_s"]:.2f} s, '
                  f'saved {r["saved_mb"]:.0f} MB ({time.time() - t0:.0f} s)', flush=True)
        else:
            train = ('' if r['train_s'] is None else
                     f'train step {r["train_s"]:.2f} s (peak +{r["train_mem_mb"]:.0f} MB), ')
            print(f'{what}: {train}inference {r["infer_s"]:.2f} s ({time.time() - t0:.0f} s)',
                  flush=True)
    ok = [r for r in rows if 'error' not in r]
    report(args, rows, summary_table(ok) if args.profile else table(rows))
    return 1 if any('error' in r for r in rows) else 0


def hook_costs(config, size=None, batch=None, iters=3):
    """Median seconds per iteration of the training step, each of our hooks, mmengine's
    RuntimeInfoHook and 0.1's check, each run on the step's outputs and the model."""
    import types

    import torch
    from mmengine.hooks import RuntimeInfoHook
    from mmengine.logging import MessageHub

    from mmlinattn.training.hooks import NonFiniteLossHook, PreemptionHook
    bench = bench_model(config, batch=batch, size=size)
    check, pre, info = (NonFiniteLossHook(), PreemptionHook(signals=(), ctrl_c=False),
                        RuntimeInfoHook())
    runner = types.SimpleNamespace(iter=0, epoch=0, hooks=[info, check, pre], model=bench.model,
                                   work_dir='.', message_hub=MessageHub.get_instance('bench_hooks'),
                                   train_loop=object(), optim_wrapper=None)
    check.before_train(runner)

    def old_check(outputs):  # 0.1's: a sync per tensor term, a norm over every parameter
        for value in outputs.values():
            if isinstance(value, torch.Tensor):
                bool(torch.isfinite(value.detach()).all())
        NonFiniteLossHook._non_finite_params(runner)
    rows = {k: [] for k in ('step', 'RuntimeInfoHook', 'NonFiniteLossHook', 'PreemptionHook',
                            '0.1 check')}
    bench.train_step()  # warm-up: first-step set-up is not what a user pays per iteration
    for it in range(iters):
        runner.iter = it
        t = time.perf_counter()
        outputs = bench.train_step()
        rows['step'].append(time.perf_counter() - t)
        for name, hook in (('RuntimeInfoHook', info), ('NonFiniteLossHook', check),
                           ('PreemptionHook', pre)):
            rows[name].append(once(lambda: hook.after_train_iter(runner, 0, None, outputs)))
        rows['0.1 check'].append(once(lambda: old_check(outputs)))
    return {k: statistics.median(v) for k, v in rows.items()}, bench.n, bench.train_hw


def _allreduce_worker(rank, world, port, out):
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world)
    t = torch.zeros(2)
    for _ in range(20):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(200):
        dist.all_reduce(t)
        t.tolist()
    if rank == 0:
        out.put((time.perf_counter() - start) / 200)
    dist.destroy_process_group()


def hooks(args, configs):
    """--hooks (per config) and --allreduce: one table row per config, the collective's time."""
    print(where())
    if configs:
        print('| config | images x size | step (s) | RuntimeInfoHook (ms, mmengine) | '
              'NonFiniteLossHook (ms) | PreemptionHook (ms) | ours, % of step | 0.1 check (ms) '
              '| 0.1, % of step |\n|---|---|---|---|---|---|---|---|---|')
    for config in configs:
        t, n, hw = hook_costs(config, args.size and args.size[0], args.batch, args.iters)
        ours = t['NonFiniteLossHook'] + t['PreemptionHook']
        print(f"| {osp.basename(config)[:-3]} | {n} x {hw[0]}x{hw[1]} | {t['step']:.3f} | "
              f"{t['RuntimeInfoHook'] * 1e3:.3f} | {t['NonFiniteLossHook'] * 1e3:.3f} | "
              f"{t['PreemptionHook'] * 1e3:.3f} | {100 * ours / t['step']:.3f} % | "
              f"{t['0.1 check'] * 1e3:.2f} | {100 * t['0.1 check'] / t['step']:.2f} % |",
              flush=True)
    if args.allreduce:
        import socket

        import torch.multiprocessing as mp
        with socket.socket() as sock:
            sock.bind(('127.0.0.1', 0))
            port = sock.getsockname()[1]
        out = mp.get_context('spawn').SimpleQueue()
        mp.spawn(_allreduce_worker, args=(args.allreduce, port, out), nprocs=args.allreduce)
        sec = out.get()
        print(f'all-reduce of the vote (gloo, {args.allreduce} ranks, 2 floats): '
              f'{sec * 1e3:.3f} ms per call; 0.1: 2 per iteration, 0.2: 1')
    return 0


if __name__ == '__main__':
    sys.exit(main())
