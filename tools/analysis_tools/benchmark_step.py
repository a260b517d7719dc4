"""Cost of one training step and one inference of whole detectors / segmentors, at the config's real
input size and per-GPU batch: time and peak memory, one progress line per config.

    python tools/analysis_tools/benchmark_step.py CONFIG [CONFIG ...]
    python tools/analysis_tools/benchmark_step.py --matrix --references \
        --out docs/benchmarks/step_cost
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --size 512 1024
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --size 2048 --no-train
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --size 512 --compile
    python tools/analysis_tools/benchmark_step.py --matrix --device cuda --amp          # on a GPU
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --profile --out OUT

* training step = forward + backward + optimizer step (the config's optim_wrapper, paramwise rules
  included) on a synthetic batch of ``train_dataloader.batch_size`` images at the training scale
  (detection: 1333x800 with a few boxes and masks; segmentation: the crop, 512x512), after
  ``--warmup`` untimed steps;
* inference = ``predict`` on one image at the test scale, after one untimed call
  (``--infer-reps N``: the median of N calls, and the backbone alone timed the same way;
  ``--same-head-work``: a detector's test-time score thresholds and NMS drop nothing, so its
  heads do the same work behind every backbone - with random weights the kept proposals and
  detections, and the heads' time, otherwise differ from model to model and run to run;
  ``--infer-together``: inference only, all models in one process with the same head work, timed
  in turn - separate processes time the same heads on the same work up to ~25 % apart on a
  shared machine);
* memory: on CUDA the peak allocated by torch (train and inference separately); on the CPU the
growth
  of the process's peak resident memory over its size after building the model (each config runs
  in its own process, so peaks do not leak between configs).

``--matrix`` takes the smallest variant of every cell of the config matrix; ``--references`` adds,
for each model family, the same detector / segmentor with mmdet's Swin-T and PVT-S backbones (only
the backbone and the neck / head input channels changed); ``--with-references`` does the same for
the given configs. ``--size H[xW] [H[xW] ...]`` trains and tests at these input sizes instead of the
config's scale, every model at every size in one run (a resolution sweep; the ratios compare models
at the same size). ``--no-train`` times inference only (for sizes whose training step does not fit
in memory). ``--compile`` wraps the backbone in ``torch.compile`` (inductor) before timing; the
untimed warm-up calls compile it (at least one for each of training and inference), so the timed
step runs the compiled code. Only the backbone is compiled: it is the part that differs between the
compared models, and the detectors' heads have data-dependent shapes that recompile on every batch.
``--amp`` runs both under autocast (fp16 on CUDA, bf16 on the CPU) with AmpOptimWrapper on CUDA.
SyncBN is reverted to BN (one process).

``--profile`` runs one warm training step of each model under ``torch.profiler`` instead, and prints
where its forward and backward time and its saved-for-backward memory go, by part (backbone stages,
attention module, attention core, RoPE, FFN, norms, neck, heads):
:mod:`tools.workshop.profiling`.
"""
import argparse
import json
import os
import os.path as osp
import sys
import time

from tools.workshop.benchmarking import (
    REFERENCES,
    ROOT,
    matrix_configs,
    measure_one,
    recipe_name,
    reference_jobs,
)
from tools.workshop.profiling import profile_step, summary_table


def run_job(config, ref, args, size=None):
    """One config at one size in a fresh process (clean peak memory); returns its result dict."""
    from mmlinattn.training.runs import run_script
    cmd = ['--one', config, '--device', args.device, '--warmup', str(args.warmup)]
    if ref:
        cmd += ['--reference', ref]
    if args.amp:
        cmd.append('--amp')
    if args.batch:
        cmd += ['--batch', str(args.batch)]
    if size:
        cmd += ['--size', f'{size[0]}x{size[1]}']
    if args.compile:
        cmd.append('--compile')
    if args.no_train:
        cmd.append('--no-train')
    if args.infer_reps > 1:
        cmd += ['--infer-reps', str(args.infer_reps)]
    if args.same_head_work:
        cmd.append('--same-head-work')
    if args.profile:
        cmd.append('--profile')
    r = run_script(osp.abspath(__file__), cmd, cwd=ROOT, show=False, check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('RESULT ')]
    if r.returncode != 0 or not lines:
        failed = dict(config=osp.basename(config)[:-3], backbone=ref or '?',
                      size=size and list(size))
        if r.returncode < 0:  # killed by a signal, most often SIGKILL from the kernel's OOM killer
            return dict(failed, error=f'process killed (signal {-r.returncode}), out of memory?')
        last = r.stdout.strip().splitlines()[-1:] or ['?']
        return dict(failed, error=last[0][:200])
    return json.loads(lines[-1][len('RESULT '):])


def _size(r):
    return 'x'.join(map(str, r['size'])) if r.get('size') else ''


def _ratio(ref, ours):
    return '-' if ref is None or ours is None else f'{ref / ours:.2f}'


def table(rows):
    """Markdown: time / memory per config, and the reference backbones' time over ours in the same
    detector / segmentor at the same size (> 1: ours is faster)."""
    sized = any(r.get('size') for r in rows)
    head = ('| config | ' + ('size | ' if sized else '') + 'backbone | params (M) | batch | train '
            'step (s) | '
            'inference (s) | train peak (MB) | Swin-T / this: train, infer | '
            'PVT-S / this: train, infer |')
    out = [head, '|' + '---|' * (10 if sized else 9)]
    refs = {(recipe_name(r['config']), r['backbone'], _size(r)): r for r in rows
            if r.get('backbone') in REFERENCES and 'error' not in r}
    for r in rows:
        size = f'{_size(r)} | ' if sized else ''
        if 'error' in r:
            out.append(f"| {r['config']} | {size}{r['backbone']} | error: {r['error']} |||||||")
            continue
        fam = recipe_name(r['config'])
        ratios = []
        for ref in REFERENCES:
            b = refs.get((fam, ref, _size(r)))
            if b is None or r['backbone'] in REFERENCES:
                ratios.append('')
            else:
                cell = (f"{_ratio(b['train_s'], r['train_s'])} / "
                        f"{_ratio(b['infer_s'], r['infer_s'])}")
                if r.get('infer_backbone_s') and b.get('infer_backbone_s'):
                    cell += f" (backbone {_ratio(b['infer_backbone_s'], r['infer_backbone_s'])})"
                ratios.append(cell)
        is_ref = r['backbone'] in REFERENCES
        name = recipe_name(r['config']).format(r['backbone'].lower()) if is_ref \
            else r['config']
        trained = r['train_s'] is not None  # inference-only rows (--no-train) have no batch
        train, mem, batch = (r['train_s'], r['train_mem_mb'], r['batch']) if trained else ('-', '-',
                                                                                           '-')
        infer = r['infer_s'] if not r.get('infer_backbone_s') else \
            f"{r['infer_s']} (backbone {r['infer_backbone_s']})"
        out.append(f"| {name} | {size}{r['backbone']} | {r['params_m']} | {batch} | {train} | "
                   f"{infer} | {mem} | {ratios[0]} | {ratios[1]} |")
    return '\n'.join(out)


def write_out(out, rows, md):
    """OUT.json (the rows) and OUT.md (the table), when ``--out`` is given."""
    if not out:
        return
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    with open(out + '.json', 'w') as f:
        json.dump(rows, f, indent=1)
    with open(out + '.md', 'w') as f:
        f.write(md + '\n')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('configs', nargs='*', help='config files')
    p.add_argument('--matrix', action='store_true', help='the smallest variant of every matrix '
                   'cell')
    p.add_argument('--references', action='store_true',
                   help="also each model family with mmdet's Swin-T and PVT-S backbones")
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    p.add_argument('--amp', action='store_true', help='autocast (fp16 on CUDA with '
                   'AmpOptimWrapper, bf16 on CPU)')
    p.add_argument('--batch', type=int, help='images per step (default: the config\'s per-GPU '
                   'batch)')
    p.add_argument('--warmup', type=int, default=1, help='untimed training steps first')
    p.add_argument('--size', type=lambda v: tuple(int(x) for x in (v.split('x') * 2)[:2]),
                   nargs='+',
                   help='H or HxW, one or more: train and test at these input sizes instead of the '
                        'config\'s scale (every model at every size)')
    p.add_argument('--no-train', action='store_true', help='time inference only')
    p.add_argument('--compile', action='store_true',
                   help='torch.compile (inductor) the backbone; the warm-up calls compile it')
    p.add_argument('--infer-reps', type=int, default=1,
                   help='inference time = the median of this many calls; > 1 also times the '
                        'backbone alone on the test image (default 1)')
    p.add_argument('--infer-together', action='store_true',
                   help='inference only, every model built in this one process with the same head '
                        'work and timed in turn (--infer-reps repetitions, default 5): the fairest '
                        'inference comparison on a noisy machine; no memory figures')
    p.add_argument('--same-head-work', action='store_true',
                   help='detectors: no proposal or detection dropped by score threshold or NMS at '
                        'test time, so the heads do the same work behind every backbone')
    p.add_argument('--with-references', action='store_true',
                   help="also run each given config's detector / segmentor with mmdet's "
                        "Swin-T and PVT-S")
    p.add_argument('--profile', action='store_true',
                   help='profile one warm training step by model part instead of timing')
    p.add_argument('--out', help='write OUT.json and OUT.md')
    p.add_argument('--table', help='only print the table of a saved OUT.json')
    p.add_argument('--one', help=argparse.SUPPRESS)
    p.add_argument('--reference', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return 0
    if args.one and args.profile:
        res = profile_step(args.one, args.reference, args.device, args.batch,
                           args.size[0] if args.size else None, max(args.warmup, 1))
        print('RESULT ' + json.dumps(res), flush=True)
        return 0
    if args.one:
        res = measure_one(args.one, args.reference, args.device, args.amp, args.batch, args.warmup,
                          args.size[0] if args.size else None, args.compile, not args.no_train,
                          args.infer_reps, args.same_head_work)
        print('RESULT ' + json.dumps(res), flush=True)
        return 0
    jobs = [(c, None) for c in args.configs]
    if args.matrix:
        jobs += [(c, None) for c in matrix_configs()]
    if args.references:
        jobs += reference_jobs()
    if args.with_references:  # one reference row per detector / segmentor recipe
        seen = set()
        for c in args.configs:
            if recipe_name(osp.basename(c)) not in seen:
                seen.add(recipe_name(osp.basename(c)))
                jobs += [(c, ref) for ref in REFERENCES]
    if not jobs:
        p.error('give config files, --matrix or --references')
    if args.infer_together:
        from tools.workshop.benchmarking import infer_together
        rows = []
        for size in (args.size or [None]):
            # --infer-reps' default of 1 means 5 here (the help text says so)
            rows += infer_together(jobs, args.device, size,
                                   5 if args.infer_reps == 1 else args.infer_reps)
        md = table(rows)
        print(md)
        write_out(args.out, rows, md)
        return 0
    runs = [(size, config, ref) for size in (args.size or [None]) for config, ref in jobs]
    rows = []
    for i, (size, config, ref) in enumerate(runs, 1):
        t0 = time.time()
        r = run_job(config, ref, args, size)
        rows.append(r)
        what = osp.basename(config)[:-3] + (f' [{ref}]' if ref else '')
        what += f' at {size[0]}x{size[1]}' if size else ''
        if 'error' in r:
            print(f'[{i}/{len(runs)}] {what}: ERROR {r["error"]}', flush=True)
        elif args.profile:
            print(f'[{i}/{len(runs)}] {what}: forward {r["forward_s"]:.2f} s, backward '
                  f'{r["backward_s"]:.2f} s, saved {r["saved_mb"]:.0f} MB '
                  f'({time.time() - t0:.0f} s)',
                  flush=True)
        else:
            train = ('' if r['train_s'] is None else
                     f'train step {r["train_s"]:.2f} s (peak +{r["train_mem_mb"]:.0f} MB), ')
            print(f'[{i}/{len(runs)}] {what}: {train}inference {r["infer_s"]:.2f} s '
                  f'({time.time() - t0:.0f} s)', flush=True)
    ok = [r for r in rows if 'error' not in r]
    md = summary_table(ok) if args.profile else table(rows)
    print(md)
    write_out(args.out, rows, md)
    return 1 if any('error' in r for r in rows) else 0


if __name__ == '__main__':
    sys.exit(main())
