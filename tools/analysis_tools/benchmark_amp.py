"""Memory of one training step of the tiny backbones, float32 against CPU bfloat16 autocast.

    python tools/analysis_tools/benchmark_amp.py [--batch 2] [--size 224] [--out FILE.json]

Each (backbone, precision) runs in a fresh process: the tiny backbone (random init, drop path off)
on a random batch of ``--batch`` images of ``--size`` x ``--size``, one warm-up step, then the
measured step. A step is the forward (under ``torch.autocast('cpu', dtype=torch.bfloat16)`` for
bf16, nothing for fp32), the loss (the sum of the mean of every returned stage) and the backward;
no optimizer step (its state is float32 in both precisions). Three figures:

* ``saved``: what autograd keeps for the backward at the end of the forward, every storage packed
  through ``torch.autograd.graph.saved_tensors_hooks`` counted once at its full size, the
  parameters' own storages and the input batch left out (they exist without the step; autocast's
  bf16 copies of the weights are counted);
* ``weights``: of which autocast's bf16 copies of the parameters (saved tensors made by a cast
  straight from a parameter; autocast keeps them for the forward anyway), so that
  ``saved - weights`` is the activations;
* ``cores``: of ``saved``, what the InLine / MALA autograd Functions save (numel x element size of
  each tensor they save, once), found by walking the autograd graph from the loss;
* ``peak``: how far the process's resident memory rises during the step above its size just
  before it (``VmHWM`` reset through ``/proc/self/clear_refs`` after ``malloc_trim``, read from
  ``/proc/self/status``): the activations plus the gradients, the backward's transients and what
  the allocator keeps. The processes run with glibc's mmap threshold fixed at 64 KiB
  (``MALLOC_MMAP_THRESHOLD_=65536``, unless set): every tensor above it is its own mapping, given
  back to the system when freed, so the resident peak follows the live tensors (identical runs
  agree to 0.1 MB; with glibc's sliding threshold they differ by up to 4 %).
"""
import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys

BACKBONES = ('InLinePVT', 'InLineSwin', 'MAViT')
CORE_NODES = ('InlineAttentionFunctionBackward', 'MalaAttentionFunctionBackward')


def _status_kb(key):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1])
    raise KeyError(key)


def _trim_and_reset_peak():
    gc.collect()
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except OSError:  # not glibc
        pass
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # resets VmHWM to the current resident size


def _core_saved_bytes(loss):
    """Bytes of the tensors the cores' Functions save (each tensor once), by walking the graph."""
    seen_nodes, seen, total, stack = set(), set(), 0, [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen_nodes:
            continue
        seen_nodes.add(node)
        if type(node).__name__ in CORE_NODES:
            for t in node.saved_tensors:
                if t is None:
                    continue
                key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
                if key not in seen:
                    seen.add(key)
                    total += t.numel() * t.element_size()
        stack.extend(f for f, _ in node.next_functions)
    return total


def _cast_of_parameter(t):
    """``t`` is (a view of) a cast of a leaf parameter (autocast's weight copy): ToCopy straight
    from it."""
    fn = (t if t._base is None else t._base).grad_fn
    return (fn is not None and type(fn).__name__ == 'ToCopyBackward0'
            and type(fn.next_functions[0][0]).__name__ == 'AccumulateGrad')


def measure(backbone, precision, batch, size):
    """One (backbone, precision) in this process: a dict of MB figures."""
    import torch

    import mmlinattn.core.models.backbones as bb
    torch.manual_seed(0)
    model = getattr(bb, backbone)(arch='tiny', drop_path_rate=0.0)
    model.init_weights()
    model.train()
    x = torch.randn(batch, 3, size, size)
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded.add(x.untyped_storage().data_ptr())
    amp = precision == 'bf16'

    def step(account=False):
        saved, weights = {}, {}

        def pack(t):
            s = t.untyped_storage()
            if s.data_ptr() not in excluded:
                saved[s.data_ptr()] = s.nbytes()
                if _cast_of_parameter(t):
                    weights[s.data_ptr()] = s.nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):
                outs = model(x)
            loss = sum(o.float().mean() for o in outs)
        cores = _core_saved_bytes(loss) if account else 0
        loss.backward()
        model.zero_grad(set_to_none=True)
        return sum(saved.values()), sum(weights.values()), cores

    step()  # warm-up: lazy initialisations, the allocator's first growth
    _trim_and_reset_peak()
    before = _status_kb('VmRSS')
    saved, weights, cores = step(account=True)
    peak = _status_kb('VmHWM') - before
    mb = 2 ** 20
    return dict(backbone=backbone, precision=precision, batch=batch, size=size,
                saved_mb=round(saved / mb, 1), weights_mb=round(weights / mb, 1),
                activations_mb=round((saved - weights) / mb, 1), cores_mb=round(cores / mb, 1),
                peak_mb=round(peak * 1024 / mb, 1), threads=torch.get_num_threads())


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--batch', type=int, default=2)
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--backbones', nargs='+', default=list(BACKBONES), choices=BACKBONES)
    p.add_argument('--out', help='write the results as JSON')
    p.add_argument('--one', nargs=2, metavar=('BACKBONE', 'PRECISION'), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.batch, args.size)))
        return
    rows = []
    for name in args.backbones:
        for precision in ('fp32', 'bf16'):
            cmd = [sys.executable, os.path.abspath(__file__), '--one', name, precision,
                   '--batch', str(args.batch), '--size', str(args.size)]
            env = dict(os.environ)
            env.setdefault('MALLOC_MMAP_THRESHOLD_', '65536')
            out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                                 env=env).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            r = rows[-1]
            print(f'{name:10s} {precision}: saved {r["saved_mb"]:7.1f} MB (weight copies '
                  f'{r["weights_mb"]:5.1f}, cores {r["cores_mb"]:6.1f}), '
                  f'peak +{r["peak_mb"]:7.1f} MB', flush=True)
    print()
    print(f'| backbone (batch {args.batch}, {args.size}x{args.size}) | activations saved, fp32 / '
          'bf16 MB | of which the cores | + bf16 weight copies | peak step memory, fp32 / bf16 '
          'MB |')
    print('|---|---|---|---|---|')
    for fp, bf in zip(rows[::2], rows[1::2]):
        a32, a16 = fp['activations_mb'], bf['activations_mb']
        print(f'| {fp["backbone"]} tiny | {a32} / {a16} ({a16 / a32:.2f}x) | '
              f'{fp["cores_mb"]} / {bf["cores_mb"]} | {bf["weights_mb"]} | '
              f'{fp["peak_mb"]} / {bf["peak_mb"]} ({bf["peak_mb"] / fp["peak_mb"]:.2f}x) |')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(rows, f, indent=1)


if __name__ == '__main__':
    main()
