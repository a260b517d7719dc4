"""`make gpu-check`: the suite's own oracle tests on CUDA and the benchmarks with ``--device cuda``,
into one report (docs/development.md, "The GPU check").

    python3 tests/gpu_suite.py [--out docs/benchmarks/gpu_check]

1. ``pytest -m gpu`` over :data:`TESTS`: the CUDA cases of the oracle tests (tests/helpers.py,
   ``on_devices``): the attention cores against float64, forward and backward, in float64 and under
   fp16 / bf16 autocast; the tiny backbones' training step in bf16 / fp16 / TF32 against fp32; the
   AmpOptimWrapper step of a detector and two segmentors where mmdet, mmseg and mmcv's ops import;
2. ``benchmark_attention.py --device cuda``: the cores at the shapes the backbones give them
   (``--stages``) and over a token sweep, beside the floor Q (K^T V) and SDPA;
3. ``benchmark.py --device cuda``: each backbone's forward time and memory by input size (beside
   mmdet's Swin-T and PVT-S where mmdet's models import).

OUT/report.md holds each step's output under the device's name (OUT/junit.xml: pytest's). Exit
status: 0 when every step passed, 1 when one failed, 2 without CUDA (one line says so). Each step
runs in a child process with the checkout first on its path (nothing needs installing there).
"""
import argparse
import os
import os.path as osp
import platform
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TESTS = ['tests/test_cores.py', 'tests/test_core_grads.py', 'tests/test_ops.py',
         'tests/test_backbones.py', 'tests/test_amp.py']
OURS = ['InLine-Swin-T', 'InLine-PVT-S', 'MAViT-T']


def device_or_why():
    """(this python's GPU and torch in words, None), or (None, why it cannot run the check)."""
    try:
        import torch
    except ImportError as err:
        return None, f'{sys.executable} cannot import torch ({err})'
    if not torch.cuda.is_available():
        return None, (f'no CUDA device visible to torch {torch.__version__} of {sys.executable}: '
                      'run it on a GPU node')
    return (f'{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA '
            f'{torch.version.cuda}'), None


def step(title, cmd, env):
    """Run ``cmd`` in the checkout, its output to the terminal as it comes: (report section, ok)."""
    print('\n+ ' + ' '.join(cmd), flush=True)
    start, lines = time.perf_counter(), []
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                          stderr=subprocess.STDOUT) as proc:
        for line in proc.stdout:
            print(line, end='', flush=True)
            lines.append(line)
    rc, seconds = proc.returncode, time.perf_counter() - start
    # pytest's 5 (no test collected: no cuda case ran) is a failure too
    verdict = 'passed' if rc == 0 else f'FAILED (exit status {rc})'
    shown = ' '.join(cmd[1:]).replace(ROOT + os.sep, '')
    return (f'## {title}: {verdict}, {seconds:.0f} s\n\n`python {shown}`\n\n```text\n'
            f'{"".join(lines).rstrip()}\n```\n', rc == 0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--out', default=osp.join(ROOT, 'docs', 'benchmarks', 'gpu_check'),
                   help='folder of report.md, junit.xml and the benchmarks\' JSON')
    args = p.parse_args(argv)
    device, why = device_or_why()
    if why:
        print(f'make gpu-check: {why}', file=sys.stderr)
        return 2
    out = osp.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [x for x in [os.environ.get('PYTHONPATH')] if x]))
    py = sys.executable
    mmdet = subprocess.run([py, '-c', 'import mmdet.models'], cwd=ROOT, env=env,
                           capture_output=True).returncode == 0
    bench = [py, 'tools/analysis_tools/benchmark.py', 'backbones', '--device', 'cuda',
             '--out', out] + ([] if mmdet else ['--models'] + OURS)
    steps = [
        ('The oracle tests on cuda (pytest -m gpu)',
         [py, '-m', 'pytest', '-m', 'gpu', '-rA', '--tb=short', '-p', 'no:cacheprovider',
          f'--junitxml={out}/junit.xml'] + TESTS),
        ('Attention cores at the backbones\' stage shapes',
         [py, 'tools/analysis_tools/benchmark_attention.py', '--device', 'cuda', '--stages',
          '--repeats', '3', '--out', out]),
        ('Attention cores over a token sweep',
         [py, 'tools/analysis_tools/benchmark_attention.py', '--device', 'cuda', '--repeats', '3',
          '--out', out]),
        ('Backbones by input size' + ('' if mmdet else ' (ours: mmdet\'s models do not import '
                                      'here)'), bench)]
    sections, failed = [], []
    for title, cmd in steps:
        text, ok = step(title, cmd, env)
        sections.append(text)
        failed += [] if ok else [title]
    head = (f'# The GPU check: {device}\n\n{time.strftime("%Y-%m-%d %H:%M")}, python '
            f'{platform.python_version()}; `make gpu-check` (tests/gpu_suite.py). '
            + (f'FAILED: {"; ".join(failed)}.' if failed else 'Every step passed.') + '\n')
    with open(osp.join(out, 'report.md'), 'w') as f:
        f.write('\n'.join([head] + sections))
    print(f'\n{"FAIL" if failed else "PASS"}: {osp.join(out, "report.md")}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
