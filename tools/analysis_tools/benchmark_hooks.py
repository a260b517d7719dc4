"""What our default training hooks cost per iteration, against the training step they follow.

    python tools/analysis_tools/benchmark_hooks.py configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py
    python tools/analysis_tools/benchmark_hooks.py \\
        configs/inline_swin/mask-rcnn_inline-swin-t_fpn_1x_coco.py --size 800 1333 --batch 2
    python tools/analysis_tools/benchmark_hooks.py --allreduce 2   # the vote's collective

For each iteration: one real training step of the config's model on a synthetic batch (forward,
backward, optimizer step; ``tools.workshop.benchmarking``), then the hooks mmengine runs after
it, timed one by one on that step's outputs and the model's parameters:

* ``RuntimeInfoHook`` - mmengine's own (copies every loss term to the host for the log); paid with
  or without our hooks, shown for scale;
* ``NonFiniteLossHook`` and ``PreemptionHook`` as they are now (one shared vote);
* ``0.1 check`` - what ``NonFiniteLossHook`` did per iteration before 0.2: one host sync per loss
  term and a norm over every parameter (``NonFiniteLossHook._non_finite_params``), re-run here.

Single process: the votes run no collective. ``--allreduce N`` times the collective itself (gloo, N
processes on this machine, 2 floats, the mean of 200 calls): 0.1 ran two per iteration, 0.2 one.
Prints a table with the CPU named; timings are one run.
"""
import argparse
import os
import statistics
import sys
import time
import types

import torch

from tools.workshop.benchmarking import cpu_name


def _step_fn(config, size, batch):
    """(model, step) where ``step()`` runs one training step and returns mmengine's log_vars."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper

    from tools.workshop import benchmarking as B
    bench = B.bench_model(config, batch=batch, size=size)
    model = bench.model
    cfg = Config.fromfile(os.path.join(B.ROOT, config))
    optim = build_optim_wrapper(model, dict(cfg.optim_wrapper))
    det = cfg.default_scope == 'mmdet'
    hw = bench.train_hw

    def step():
        model.train()
        raw = B.det_batch(bench.n, hw, 'mask_head' in str(cfg.model)) if det else \
            B.seg_batch(bench.n, hw)
        data = model.data_preprocessor(raw, True)
        losses = model(**data, mode='loss')
        loss, log_vars = model.parse_losses(losses)
        optim.update_params(loss)
        return log_vars

    return model, step, bench.n, hw


def old_check(runner, outputs):
    """0.1's NonFiniteLossHook per iteration on the healthy path: a sync per tensor term and a
    norm over every parameter."""
    from mmlinattn.training.hooks import NonFiniteLossHook
    for value in outputs.values():
        if isinstance(value, torch.Tensor):
            bool(torch.isfinite(value.detach()).all())
    NonFiniteLossHook._non_finite_params(runner)


def bench_config(config, size=None, batch=None, iters=3):
    from mmengine.hooks import RuntimeInfoHook
    from mmengine.logging import MessageHub

    from mmlinattn.training.hooks import NonFiniteLossHook, PreemptionHook
    model, step, n, hw = _step_fn(config, size, batch)
    check, pre, info = NonFiniteLossHook(), PreemptionHook(signals=(), ctrl_c=False), \
        RuntimeInfoHook()
    runner = types.SimpleNamespace(iter=0, epoch=0, hooks=[info, check, pre], model=model,
                                   work_dir='.', message_hub=MessageHub.get_instance('bench_hooks'),
                                   train_loop=object(), optim_wrapper=None)
    check.before_train(runner)
    rows = {k: [] for k in ('step', 'RuntimeInfoHook', 'NonFiniteLossHook', 'PreemptionHook',
                            '0.1 check')}
    step()  # warm-up: first-step set-up is not what a user pays per iteration
    for it in range(iters):
        runner.iter = it
        t = time.perf_counter()
        outputs = step()
        rows['step'].append(time.perf_counter() - t)
        for name, fn in (('RuntimeInfoHook',
                          lambda: info.after_train_iter(runner, 0, None, outputs)),
                         ('NonFiniteLossHook',
                          lambda: check.after_train_iter(runner, 0, None, outputs)),
                         ('PreemptionHook', lambda: pre.after_train_iter(runner, 0, None, outputs)),
                         ('0.1 check', lambda: old_check(runner, outputs))):
            t = time.perf_counter()
            fn()
            rows[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in rows.items()}, n, hw


def _allreduce_worker(rank, world, port, out):
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


def bench_allreduce(world: int) -> float:
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    ctx = mp.get_context('spawn')
    out = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_worker, args=(r, world, port, out))
             for r in range(world)]
    for p in procs:
        p.start()
    value = out.get(timeout=300)
    for p in procs:
        p.join()
    return value


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('configs', nargs='*')
    p.add_argument('--size', type=int, nargs=2, metavar=('H', 'W'), help='training scale')
    p.add_argument('--batch', type=int, help='images per step (default: the config\'s)')
    p.add_argument('--iters', type=int, default=3, help='timed iterations (median)')
    p.add_argument('--allreduce', type=int, metavar='N',
                   help='time the vote\'s all-reduce over N local ranks')
    args = p.parse_args(argv)
    print(f'CPU: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads')
    if args.configs:
        print('| config | images x size | step (s) | RuntimeInfoHook (ms, mmengine) | '
              'NonFiniteLossHook (ms) | PreemptionHook (ms) | ours, % of step | 0.1 check (ms) '
              '| 0.1, % of step |')
        print('|---|---|---|---|---|---|---|---|---|')
    for config in args.configs:
        t, n, hw = bench_config(config, args.size, args.batch, args.iters)
        ours = t['NonFiniteLossHook'] + t['PreemptionHook']
        print(f"| {os.path.basename(config)[:-3]} | {n} x {hw[0]}x{hw[1]} | {t['step']:.3f} | "
              f"{t['RuntimeInfoHook'] * 1e3:.3f} | {t['NonFiniteLossHook'] * 1e3:.3f} | "
              f"{t['PreemptionHook'] * 1e3:.3f} | {100 * ours / t['step']:.3f} % | "
              f"{t['0.1 check'] * 1e3:.2f} | {100 * t['0.1 check'] / t['step']:.2f} % |",
              flush=True)
    if args.allreduce:
        sec = bench_allreduce(args.allreduce)
        print(f'all-reduce of the vote (gloo, {args.allreduce} ranks, 2 floats): '
              f'{sec * 1e3:.3f} ms per call; 0.1: 2 per iteration, 0.2: 1')
    return 0


if __name__ == '__main__':
    sys.exit(main())
