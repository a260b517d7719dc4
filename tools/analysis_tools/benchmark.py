"""Our backbones against mmdet's Swin-T and PVT-S, batch 1, one run each (docs/benchmarks.md):

    python tools/analysis_tools/benchmark.py [backbones] [--sizes 224 512 1024 512x2048]
        [--compile] [--no-memory] [--device cuda] [--out docs/benchmarks]  # sections 2 and 5
    python tools/analysis_tools/benchmark.py inference [--sizes 512 1024] [--neck-sizes 800x1333]
        [--paths eager compile onnx bf16] [--repeats 5] [--out OUT]       # section 6
    python tools/analysis_tools/benchmark.py amp [--batch 2] [--size 224] [--out FILE.json]  # 10

``backbones`` (the default): fp32 forward latency (best of up to 10 calls) and peak memory across
input sizes, with the ratios Swin-T / InLine-Swin-T, PVT-S / InLine-PVT-S and PVT-S / MAViT-T;
``--compile`` adds the models compiled (inductor). ``inference``: the backbones of the Mask R-CNN
configs, alone and with the FPN, on eager, compile, ONNX Runtime and bf16 paths, interleaved
rounds, ratios to Swin-T. ``amp``: what autograd saves and the resident peak of a tiny backbone's
training step, fp32 against CPU bf16 autocast, each in a fresh process.
"""
import argparse
import os
import os.path as osp
import statistics
import sys
import tempfile
import time

os.environ.setdefault('KINETO_LOG_LEVEL', '5')  # the profiler's start/stop chatter

import torch  # noqa: E402

from mmlinattn.analysis.benchmarking import (  # noqa: E402
    ROOT,
    build_reference,
    cpu_info,
    in_fresh_process,
    once,
    peak_memory,
    plot,
    result,
    rounds,
    save,
    status_kb,
    swap_backbone,
    synced,
    timeit,
    where,
)

NAMES = ('InLine-Swin-T', 'Swin-T (mmdet)', 'InLine-PVT-S', 'PVT-S (mmdet)', 'MAViT-T')
RATIOS = (('Swin-T (mmdet)', 'InLine-Swin-T', 8), ('PVT-S (mmdet)', 'InLine-PVT-S', 8),
          ('PVT-S (mmdet)', 'MAViT-T', 9))
CONFIGS = {  # inference: name -> (config, reference backbone swapped in or None)
    'MAViT-T': ('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py', None),
    'InLine-PVT-S': ('configs/inline_pvt/mask-rcnn_inline-pvt-s_fpn_1x_coco.py', None),
    'InLine-Swin-T': ('configs/inline_swin/mask-rcnn_inline-swin-t_fpn_1x_coco.py', None),
    'Swin-T (mmdet)': ('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py', 'Swin-T'),
    'PVT-S (mmdet)': ('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py', 'PVT-S'),
}
BASELINE = 'Swin-T (mmdet)'
PATHS = ('eager', 'compile', 'onnx', 'bf16')
CPU_FLAGS = ('avx2', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'avx512_fp16', 'amx_tile', 'amx_bf16')
BACKBONES = ('InLinePVT', 'InLineSwin', 'MAViT')
CORE_NODES = ('InlineAttentionFunctionBackward', 'MalaAttentionFunctionBackward')


def _hw(s):
    h, _, w = s.partition('x')
    return int(h), int(w or h)


# ------------------------------------------------------------------------------------- backbones
def ratios(t):
    """The table's last columns from one size's times (nan where a model was not run)."""
    return ' '.join(f'{t[a] / t[b] if a in t and b in t else float("nan"):{w}.2f}'
                    for a, b, w in RATIOS)


def backbones(args):
    from mmlinattn.core.models import InLinePVT, InLineSwin, MAViT
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        print(f'--device {args.device}: this torch sees no CUDA device', file=sys.stderr)
        return 2
    zoo = dict(zip(NAMES, (lambda: InLineSwin(arch='tiny'), lambda: build_reference('Swin-T'),
                           lambda: InLinePVT(arch='small'), lambda: build_reference('PVT-S'),
                           lambda: MAViT(arch='tiny'))))
    torch.manual_seed(0)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    models = {n: zoo[n]().to(device=device, memory_format=fmt) for n in args.models}
    for m in models.values():
        m.eval()  # (mmdet's backbones' train() returns None, so no chaining)
    print(f'{where(device)}; batch 1, fp32, forward only\n')
    header = f'{"size":>10} | ' + ' | '.join(f'{n:>15}' for n in models)
    print(header + ' |  Swin/InL  PVT/InL  PVT/MAViT\n' + '-' * (len(header) + 32))
    rows = []
    for hw in map(_hw, args.sizes):
        x = torch.randn(1, 3, *hw).to(device=device, memory_format=fmt)
        t, mem, tc = {}, {}, {}
        for name, m in models.items():
            with torch.inference_mode():
                t[name] = timeit(synced(lambda: m(x), device), min_time=0.5, max_reps=10)
                if not args.no_memory:
                    mem[name] = peak_memory(synced(lambda: m(x), device)) / 2 ** 20
            if args.compile:
                # no_grad, not inference_mode: dynamo's guards on mmdet's PVT (a tensor made from a
                # numpy array) fail inside inference_mode in torch 2.14
                torch._dynamo.reset()
                mc = torch.compile(m, dynamic=False)
                try:
                    with torch.no_grad():
                        tc[name] = timeit(synced(lambda: mc(x), device), min_time=0.5,
                                          max_reps=10)
                except Exception as e:  # torch.compile raises any type: printed, the rest go on
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
    stem = osp.join(args.out, 'benchmark_backbones')
    save(stem, dict(where=where(device), threads=torch.get_num_threads(), rows=rows))
    mpx = [r['size'][0] * r['size'][1] / 1e6 for r in rows]
    try:
        plot(stem + '.png', [(n, 'o-', [(x, r['time_s'][n] * 1e3) for x, r in zip(mpx, rows)],
                              [(x, r['peak_mb'][n]) for x, r in zip(mpx, rows) if r['peak_mb']])
                             for n in models], 'megapixels (H x W)', 'backbone latency, batch 1')
        print(f'\nplot: {stem}.png')
    except ImportError:  # a bare GPU node (make gpu-check)
        print('matplotlib not installed: no plot')


# ------------------------------------------------------------------------------------- inference
def runner(path, wrapper, x, workdir, tag):
    """A no-argument callable running ``wrapper`` on ``x`` on ``path`` (set-up, compilation and
    export done here, untimed)."""
    if path == 'onnx':
        from mmlinattn.analysis.deploy import export, ort_session
        file = osp.join(workdir, f'{tag}.onnx')
        export(wrapper, tuple(x.shape[2:]), file)
        sess, feed = ort_session(file), {'input': x.numpy()}
        return lambda: sess.run(None, feed)
    if path not in PATHS:
        raise ValueError(f'unknown path {path!r}; choose from {PATHS}')
    # compile: no_grad, as dynamo's guards on mmdet's PVT fail inside inference_mode (torch 2.14)
    fn = torch.compile(wrapper, dynamic=False) if path == 'compile' else wrapper
    mode = torch.no_grad if path == 'compile' else torch.inference_mode

    def run():
        with mode(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=path == 'bf16'):
            return fn(x)
    return run


def measure_paths(names, part, hw, path, repeats, workdir, log=print):
    """Times of every model on one path at one size, interleaved; one dict per model."""
    from mmlinattn.analysis.deploy import Exportable, build_model, example_input
    from mmlinattn.training.cli import load_config
    x, runs, out = example_input(hw), {}, {}
    if path == 'compile':
        torch._dynamo.reset()
    for name in names:
        t0 = time.time()
        try:
            cfg = load_config(osp.join(ROOT, CONFIGS[name][0]))
            if CONFIGS[name][1]:
                swap_backbone(cfg, CONFIGS[name][1])
            run = runner(path, Exportable(build_model(cfg), part), x, workdir,
                         f'{part}_{hw[0]}x{hw[1]}_{name[:6]}')
            run()  # untimed: compiles / warms up
            runs[name] = run
        except Exception as e:  # an export / compile path raises any type: logged, the rest go on
            out[name] = dict(error=f'{type(e).__name__}: {str(e).splitlines()[0][:200]}')
            log(f'  {name}: {out[name]["error"]}')
        else:
            log(f'  {name}: ready ({time.time() - t0:.0f} s)')
    for name, ts in rounds(runs, repeats, once).items():
        out[name] = dict(times_s=[round(t, 5) for t in ts], best_s=min(ts),
                         median_s=statistics.median(ts))
    return out


def paths_table(rows, paths) -> str:
    """Markdown: per part, size and model, each path's best time and best / median ratios to
    Swin-T's on the same path and size (< 1: faster than Swin-T)."""
    cell = {(r['part'], tuple(r['size']), r['model'], r['path']): r for r in rows}
    out = ['| part | size | model | ' + ' | '.join(
        f'{p}: best ms (x Swin-T best / median)' for p in paths) + ' |',
        '|' + '---|' * (3 + len(paths))]
    for part, size, model in dict.fromkeys(k[:3] for k in cell):
        cells = []
        for p in paths:
            r = cell.get((part, size, model, p))
            ratio = (f"{r['ratio_best']:.2f} / {r['ratio_median']:.2f}"
                     if r and 'ratio_best' in r else '-')
            cells.append('-' if r is None else 'failed' if 'error' in r else
                         f"{r['best_s'] * 1e3:.0f} ({ratio})")
        what = 'backbone' if part == 'backbone' else 'backbone + FPN'
        out.append(f'| {what} | {size[0]}x{size[1]} | {model} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(out)


def inference(args):
    cpu = cpu_info()
    info = dict(model_name=cpu['model_name'], flags=[f for f in CPU_FLAGS if f in cpu['flags']],
                cores=cpu['cores'], threads=torch.get_num_threads())
    bf16 = bool({'avx512_bf16', 'amx_bf16'} & cpu['flags'])
    paths = [q for q in args.paths if q != 'bf16' or bf16]
    header = (f"CPU: {info['model_name']} ({info['cores']} cores, {info['threads']} threads; "
              f"flags: {' '.join(info['flags']) or 'none of ' + ', '.join(CPU_FLAGS)}); torch "
              f"{torch.__version__}")
    try:
        import onnxruntime
        header += f', onnxruntime {onnxruntime.__version__}'
    except ImportError:
        paths = [q for q in paths if q != 'onnx']
        header += ', no onnxruntime (pip install -r requirements/deploy.txt): onnx path skipped'
    if 'bf16' in args.paths and not bf16:
        header += '; bf16 skipped: no avx512_bf16 / amx_bf16 on this CPU'
    print(header, flush=True)
    jobs = [('backbone', _hw(s)) for s in args.sizes] + [('neck', _hw(s)) for s in args.neck_sizes]
    rows, t_start = [], time.time()
    with tempfile.TemporaryDirectory() as workdir:
        for (part, hw), path in ((job, path) for job in jobs for path in paths):
            print(f'[{time.time() - t_start:.0f} s] {part} {hw[0]}x{hw[1]} {path}', flush=True)
            res = measure_paths(args.models, part, hw, path, args.repeats, workdir)
            rows += [dict(part=part, size=list(hw), path=path, model=n, **res[n])
                     for n in args.models]
            print('    best: ' + ', '.join(f'{n} {res[n]["best_s"] * 1e3:.0f} ms'
                                           for n in args.models if 'best_s' in res[n]), flush=True)
    base = {(r['part'], tuple(r['size']), r['path']): r for r in rows
            if r['model'] == BASELINE and 'best_s' in r}
    for r in rows:  # the best and median over the baseline's in the same part, size and path
        b = base.get((r['part'], tuple(r['size']), r['path']))
        if b is not None and 'best_s' in r:
            r.update(ratio_best=r['best_s'] / b['best_s'],
                     ratio_median=r['median_s'] / b['median_s'])
    md = paths_table(rows, paths)
    print(md)
    save(args.out, dict(cpu=info, torch=torch.__version__, repeats=args.repeats, paths=paths,
                        header=header, rows=rows), header + '\n\n' + md)
    print(f'wrote {args.out}.json and {args.out}.md ({time.time() - t_start:.0f} s)')


# ------------------------------------------------------------------------------------------- amp
def _core_saved_bytes(loss):
    """Bytes of the tensors the cores' Functions save (each tensor once), by walking the graph."""
    seen_nodes, seen, total, stack = set(), set(), 0, [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen_nodes:
            continue
        seen_nodes.add(node)
        for t in node.saved_tensors if type(node).__name__ in CORE_NODES else ():
            key = None if t is None else (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
            if key is not None and key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
        stack.extend(f for f, _ in node.next_functions)
    return total


def _cast_of_parameter(t):
    """``t`` is (a view of) a cast of a leaf parameter (autocast's weight copy)."""
    fn = (t if t._base is None else t._base).grad_fn
    return (fn is not None and type(fn).__name__ == 'ToCopyBackward0'
            and type(fn.next_functions[0][0]).__name__ == 'AccumulateGrad')


def amp_step(backbone, precision, batch, size):
    """One (backbone, precision) in this process: a dict of MB figures."""
    import ctypes
    import gc

    import mmlinattn.core.models.backbones as bb
    torch.manual_seed(0)
    model = getattr(bb, backbone)(arch='tiny', drop_path_rate=0.0)
    model.init_weights()
    model.train()
    x = torch.randn(batch, 3, size, size)
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded.add(x.untyped_storage().data_ptr())

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
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=precision == 'bf16'):
                outs = model(x)
            loss = sum(o.float().mean() for o in outs)
        cores = _core_saved_bytes(loss) if account else 0
        loss.backward()
        model.zero_grad(set_to_none=True)
        return sum(saved.values()), sum(weights.values()), cores

    step()  # warm-up: lazy initialisations, the allocator's first growth
    gc.collect()
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except OSError:  # not glibc
        pass
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # resets VmHWM to the current resident size
    before = status_kb('VmRSS')
    saved, weights, cores = step(account=True)
    peak, mb = status_kb('VmHWM') - before, 2 ** 20
    return dict(backbone=backbone, precision=precision, batch=batch, size=size,
                saved_mb=round(saved / mb, 1), weights_mb=round(weights / mb, 1),
                activations_mb=round((saved - weights) / mb, 1), cores_mb=round(cores / mb, 1),
                peak_mb=round(peak * 1024 / mb, 1), threads=torch.get_num_threads(), where=where())


def amp(args):
    if args.one:
        return result(amp_step(*args.one, args.batch, args.size))
    print(where())
    rows = []
    for name in args.backbones:
        for precision in ('fp32', 'bf16'):
            r, proc = in_fresh_process(osp.abspath(__file__), [
                'amp', '--one', name, precision, '--batch', args.batch, '--size', args.size],
                MALLOC_MMAP_THRESHOLD_=os.environ.get('MALLOC_MMAP_THRESHOLD_', '65536'))
            if r is None:
                sys.exit(f'{name} {precision}: the measuring process failed:\n'
                         + proc.stdout[-2000:])
            rows.append(r)
            print(f'{name:10s} {precision}: saved {r["saved_mb"]:7.1f} MB (weight copies '
                  f'{r["weights_mb"]:5.1f}, cores {r["cores_mb"]:6.1f}), '
                  f'peak +{r["peak_mb"]:7.1f} MB', flush=True)
    print(f'\n| backbone (batch {args.batch}, {args.size}x{args.size}) | activations saved, fp32 '
          '/ bf16 MB | of which the cores | + bf16 weight copies | peak step memory, fp32 / bf16 '
          'MB |\n|---|---|---|---|---|')
    for fp, bf in zip(rows[::2], rows[1::2]):
        a32, a16 = fp['activations_mb'], bf['activations_mb']
        print(f'| {fp["backbone"]} tiny | {a32} / {a16} ({a16 / a32:.2f}x) | '
              f'{fp["cores_mb"]} / {bf["cores_mb"]} | {bf["weights_mb"]} | '
              f'{fp["peak_mb"]} / {bf["peak_mb"]} ({bf["peak_mb"] / fp["peak_mb"]:.2f}x) |')
    if args.out:
        save(osp.splitext(args.out)[0], rows)


COMMANDS = dict(backbones=backbones, inference=inference, amp=amp)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*COMMANDS, '-h', '--help'):
        argv.insert(0, 'backbones')
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest='command', required=True)
    b = sub.add_parser('backbones', help='latency and peak memory across sizes (default)')
    b.add_argument('--sizes', nargs='+', default=['224', '512', '768', '1024', '512x2048'],
                   help='H or HxW')
    b.add_argument('--models', nargs='+', default=list(NAMES), choices=NAMES)
    b.add_argument('--channels-last', action='store_true', help='channels_last inputs/weights')
    b.add_argument('--no-memory', action='store_true', help='skip the (slower) memory pass')
    b.add_argument('--compile', action='store_true', help='also time the torch.compile-d models')
    b.add_argument('--device', default='cpu', help='cpu or cuda (default: cpu)')
    b.add_argument('--out', default='work_dirs/benchmark')
    i = sub.add_parser('inference', help='eager, compile, ONNX Runtime, bf16; ratios to Swin-T')
    i.add_argument('--sizes', nargs='*', default=['512', '1024'], help='backbone alone, H or HxW')
    i.add_argument('--neck-sizes', nargs='*', default=['800x1333'], help='backbone + FPN, HxW')
    i.add_argument('--paths', nargs='+', default=list(PATHS), choices=PATHS)
    i.add_argument('--models', nargs='+', default=list(CONFIGS), choices=list(CONFIGS))
    i.add_argument('--repeats', type=int, default=5, help='timed rounds (best and median)')
    i.add_argument('--out', default='work_dirs/benchmark_inference', help='OUT.json and OUT.md')
    a = sub.add_parser('amp', help='training step memory, fp32 against CPU bf16 autocast')
    a.add_argument('--batch', type=int, default=2)
    a.add_argument('--size', type=int, default=224)
    a.add_argument('--backbones', nargs='+', default=list(BACKBONES), choices=BACKBONES)
    a.add_argument('--out', help='write the results as JSON')
    a.add_argument('--one', nargs=2, metavar=('BACKBONE', 'PRECISION'), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    return COMMANDS[args.command](args)


if __name__ == '__main__':
    sys.exit(main())
