"""CPU inference speed of the backbones on four paths - eager fp32, ``torch.compile``, ONNX Runtime
fp32 and bf16 autocast - each time as a ratio to Swin-T's on the same path and input size.

    python tools/analysis_tools/benchmark_inference.py --out docs/benchmarks/inference
    python tools/analysis_tools/benchmark_inference.py --sizes 512 1024 --neck-sizes 800x1333 \
        --paths eager compile onnx bf16 --repeats 5

Models: MAViT-T, InLine-PVT-S and InLine-Swin-T against mmdet's Swin-T and PVT-S, built from the
Mask R-CNN configs (the references: the MAViT-T config with mmdet's backbone swapped in, as
``benchmark_step.py`` does), random weights, batch 1, eval mode, the thread count torch uses.
``--sizes`` times the backbones alone; ``--neck-sizes`` (H x W, default the detectors' 800x1333)
times backbone + FPN, the detector's ``extract_feat``.

Paths: ``eager`` (fp32, ``inference_mode``), ``compile`` (``torch.compile``, inductor, one
compilation per model and size, not timed; ``no_grad``), ``onnx`` (exported with
``tools/deployment/export_onnx.py`` at that static size, then ONNX Runtime's CPU provider with the
same thread count; the export is not timed), ``bf16`` (eager under ``torch.autocast('cpu',
torch.bfloat16)``; only on CPUs with bf16 instructions, else skipped and said so). Within a path and
size, the models run interleaved in every round; each time is the best and the median of
``--repeats`` rounds after one untimed call. The CPU's model name and its relevant instruction-set
flags are printed and saved with the numbers.
"""
import argparse
import json
import os
import os.path as osp
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from tools.workshop.benchmarking import swap_backbone
from tools.workshop.deploy import Exportable, build_model, example_input, export, ort_session

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
MODELS = {  # name: (config, reference backbone swapped in or None)
    'MAViT-T': ('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py', None),
    'InLine-PVT-S': ('configs/inline_pvt/mask-rcnn_inline-pvt-s_fpn_1x_coco.py', None),
    'InLine-Swin-T': ('configs/inline_swin/mask-rcnn_inline-swin-t_fpn_1x_coco.py', None),
    'Swin-T (mmdet)': ('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py', 'Swin-T'),
    'PVT-S (mmdet)': ('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py', 'PVT-S'),
}
BASELINE = 'Swin-T (mmdet)'
PATHS = ('eager', 'compile', 'onnx', 'bf16')
CPU_FLAGS = ('avx2', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'avx512_fp16', 'amx_tile', 'amx_bf16')


def cpu_info() -> dict:
    """The CPU's model name (lscpu) and which of :data:`CPU_FLAGS` it has."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        out = subprocess.run(['lscpu'], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            key, _, value = line.partition(':')
            if key.strip() == 'Model name':
                name = value.strip()
            elif key.strip() == 'Flags':
                flags = set(value.split())
    except (OSError, subprocess.CalledProcessError):
        pass
    if not flags and osp.exists('/proc/cpuinfo'):
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    flags = set(line.partition(':')[2].split())
                    break
    return dict(model_name=name, flags=[f for f in CPU_FLAGS if f in flags],
                cores=os.cpu_count(), threads=torch.get_num_threads())


def has_bf16(info: dict) -> bool:
    return bool({'avx512_bf16', 'amx_bf16'} & set(info['flags']))


def parse_hw(s: str):
    h, _, w = s.partition('x')
    return int(h), int(w or h)


def build(name: str, part: str) -> Exportable:
    from mmlinattn.training.cli import load_config
    config, ref = MODELS[name]
    cfg = load_config(osp.join(ROOT, config))
    if ref:
        swap_backbone(cfg, ref)
    return Exportable(build_model(cfg), part)


def runner(path: str, wrapper: Exportable, x: torch.Tensor, workdir: str, tag: str):
    """A no-argument callable running ``wrapper`` on ``x`` on ``path`` (set-up, compilation and
    export done here, untimed)."""
    if path == 'eager':
        def run():
            with torch.inference_mode():
                return wrapper(x)
    elif path == 'bf16':
        def run():
            with torch.inference_mode(), torch.autocast('cpu', dtype=torch.bfloat16):
                return wrapper(x)
    elif path == 'compile':
        compiled = torch.compile(wrapper, dynamic=False)

        # no_grad: dynamo's guards on mmdet's PVT fail inside inference_mode (torch 2.14)
        def run():
            with torch.no_grad():
                return compiled(x)
    elif path == 'onnx':
        file = osp.join(workdir, f'{tag}.onnx')
        export(wrapper, tuple(x.shape[2:]), file)
        sess, feed = ort_session(file), {'input': x.numpy()}

        def run():
            return sess.run(None, feed)
    else:
        raise ValueError(f'unknown path {path!r}; choose from {PATHS}')
    return run


def measure(names, part, hw, path, repeats, workdir, log=print):
    """Times of every model on one path at one size, interleaved; one dict per model."""
    x = example_input(hw)
    runs, out = {}, {}
    if path == 'compile':
        torch._dynamo.reset()
    for name in names:
        t0 = time.time()
        try:
            run = runner(path, build(name, part), x, workdir, f'{part}_{hw[0]}x{hw[1]}_{name[:6]}')
            run()  # untimed: compiles / warms up
            runs[name] = run
        except Exception as e:  # a comparison of several models: each failure
            # (an export / compile path raises any type) logged with its type, the rest go on
            out[name] = dict(error=f'{type(e).__name__}: {str(e).splitlines()[0][:200]}')
            log(f'  {name}: {out[name]["error"]}')
        else:
            log(f'  {name}: ready ({time.time() - t0:.0f} s)')
    times = {n: [] for n in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    for name, ts in times.items():
        out[name] = dict(times_s=[round(t, 5) for t in ts], best_s=min(ts),
                         median_s=statistics.median(ts))
    return out


def add_ratios(rows):
    """Each row's best and median over the baseline's (Swin-T) in the same part, size and path."""
    base = {(r['part'], tuple(r['size']), r['path']): r for r in rows
            if r['model'] == BASELINE and 'best_s' in r}
    for r in rows:
        b = base.get((r['part'], tuple(r['size']), r['path']))
        if b is not None and 'best_s' in r:
            r['ratio_best'] = r['best_s'] / b['best_s']
            r['ratio_median'] = r['median_s'] / b['median_s']
    return rows


def table(rows, paths) -> str:
    """Markdown: one line per part, size and model; per path the best time and the best / median
    ratios to Swin-T (< 1: faster than Swin-T)."""
    head = '| part | size | model | ' + ' | '.join(
        f'{p}: best ms (x Swin-T best / median)' for p in paths) + ' |'
    out = [head, '|' + '---|' * (3 + len(paths))]
    keys = []
    for r in rows:
        k = (r['part'], tuple(r['size']), r['model'])
        if k not in keys:
            keys.append(k)
    cell = {(r['part'], tuple(r['size']), r['model'], r['path']): r for r in rows}
    for part, size, model in keys:
        cells = []
        for p in paths:
            r = cell.get((part, size, model, p))
            if r is None:
                cells.append('-')
            elif 'error' in r:
                cells.append('failed')
            elif 'skipped' in r:
                cells.append('n/a')
            else:
                ratio = (f"{r['ratio_best']:.2f} / {r['ratio_median']:.2f}"
                         if 'ratio_best' in r else '-')
                cells.append(f"{r['best_s'] * 1e3:.0f} ({ratio})")
        what = 'backbone' if part == 'backbone' else 'backbone + FPN'
        out.append(f'| {what} | {size[0]}x{size[1]} | {model} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--sizes', nargs='*', default=['512', '1024'], help='backbone alone, H or HxW')
    p.add_argument('--neck-sizes', nargs='*', default=['800x1333'], help='backbone + FPN, HxW')
    p.add_argument('--paths', nargs='+', default=list(PATHS), choices=PATHS)
    p.add_argument('--models', nargs='+', default=list(MODELS), choices=list(MODELS))
    p.add_argument('--repeats', type=int, default=5, help='timed rounds (best and median reported)')
    p.add_argument('--out', default='work_dirs/benchmark_inference',
                   help='writes OUT.json and OUT.md')
    args = p.parse_args(argv)
    info = cpu_info()
    paths = [q for q in args.paths if q != 'bf16' or has_bf16(info)]
    header = (f"CPU: {info['model_name']} ({info['cores']} cores, {info['threads']} threads; "
              f"flags: {' '.join(info['flags']) or 'none of ' + ', '.join(CPU_FLAGS)}); torch "
              f"{torch.__version__}")
    try:
        import onnxruntime
        header += f', onnxruntime {onnxruntime.__version__}'
    except ImportError:
        paths = [q for q in paths if q != 'onnx']
        header += ', no onnxruntime (pip install -r requirements/deploy.txt): onnx path skipped'
    if 'bf16' in args.paths and not has_bf16(info):
        header += '; bf16 skipped: no avx512_bf16 / amx_bf16 on this CPU'
    print(header, flush=True)
    jobs = ([('backbone', parse_hw(s)) for s in args.sizes]
            + [('neck', parse_hw(s)) for s in args.neck_sizes])
    rows, t_start = [], time.time()
    with tempfile.TemporaryDirectory() as workdir:
        for part, hw in jobs:
            for path in paths:
                print(f'[{time.time() - t_start:.0f} s] {part} {hw[0]}x{hw[1]} {path}', flush=True)
                res = measure(args.models, part, hw, path, args.repeats, workdir)
                for name in args.models:
                    rows.append(dict(part=part, size=list(hw), path=path, model=name, **res[name]))
                line = ', '.join(f'{n} {res[n]["best_s"] * 1e3:.0f} ms' for n in args.models
                                 if 'best_s' in res[n])
                print(f'    best: {line}', flush=True)
    add_ratios(rows)
    md = table(rows, paths)
    print(md)
    os.makedirs(osp.dirname(osp.abspath(args.out)) or '.', exist_ok=True)
    with open(args.out + '.json', 'w') as f:
        json.dump(dict(cpu=info, torch=torch.__version__, repeats=args.repeats, paths=paths,
                       header=header, rows=rows), f, indent=1)
    with open(args.out + '.md', 'w') as f:
        f.write(header + '\n\n' + md + '\n')
    print(f'wrote {args.out}.json and {args.out}.md ({time.time() - t_start:.0f} s)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
