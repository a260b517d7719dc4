"""Everything that needs a CUDA GPU, in one command and one markdown file (``make gpu-report``).

    python tools/analysis_tools/gpu_report.py --out docs/benchmarks/gpu_report
    python tools/analysis_tools/gpu_report.py --plan   # print the plan and its time estimate only

On one CUDA GPU it runs, in this order, and writes OUT.md (and the raw numbers to OUT.json):

1. the tests that skip without a GPU (:data:`GPU_TESTS`: the ``--amp`` training steps against fp32);
2. the attention ops in fp16 and bf16 against fp32 (largest error relative to the output's largest
   value) and their time against SDPA flash attention in fp16, at 1k-64k tokens (B=1, h=4, d=32, as
   the CPU table of docs/benchmarks.md);
3. for every T and S config of the matrix (one per detector / segmentor: the 1x schedule where a 3x
   one trains the same model) and for mmdet's Swin-T and PVT-S in Mask R-CNN and UperNet: the peak
   training memory and iterations/s at the config's real resolution and batch, with ``--amp`` and
   without (``benchmark_step.py --device cuda``, one process per measurement).

It keeps to a time budget (``--budget-min``, 20 by default): part 3 runs its jobs in priority order
(references and T first) and lists those it had no time for. Without CUDA it says so and exits 2.
"""
import argparse
import json
import os
import os.path as osp
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import List, Optional

from mmlinattn.core.ops import CORES
from mmlinattn.workshop.benchmarking import (
    BACKBONE_IN_NAME,
    CONFIG_DIRS,
    REFERENCES,
    ROOT,
    cuda_attention_table,
    measure_one,
)

# the tests that need a GPU (each skips without one); tests/test_gpu_report.py checks that every
# test file that skips without CUDA is listed here
GPU_TESTS = ['tests/test_amp.py']
TOKENS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
FAMILIES = CONFIG_DIRS  # the config folders, one per family of the family table
REFERENCE_KINDS = ('mask-rcnn', 'upernet')  # mmdet's Swin-T / PVT-S next to these
REFERENCE_NAMES = tuple(REFERENCES)  # mmdet's Swin-T and PVT-S
# rough wall time of one worker process on a GPU (start-up, build, warm-up and timed steps, fp32 and
# AMP), seconds; a job is not started when less than 1.5x this is left of the budget, and is stopped
# at 4x this
EST_JOB_S = {'T': 25, 'S': 30}
EST_FIXED_S = 240  # the GPU tests and the attention table


@dataclass
class Job:
    """One config of part 3 (with a reference backbone swapped in or not), measured in fp32 and with
    ``--amp`` in one process."""
    config: str
    ref: Optional[str]
    arch: str  # 'T' or 'S' (references: 'T')

    @property
    def label(self) -> str:
        name = osp.basename(self.config)[:-3]
        if self.ref:
            name = BACKBONE_IN_NAME.sub(self.ref.lower(), name)
        return name


def model_kind(name: str) -> str:
    """'mask-rcnn', 'cascade-mask-rcnn', 'retinanet', 'fpn' (Semantic FPN) or 'upernet'."""
    return osp.basename(name).split('_')[0]


def plan(root: str = ROOT, archs: str = 'ts') -> List[Job]:
    """The jobs of part 3 in priority order: the references, then the T configs, then the S configs.
    One config per family, arch and detector / segmentor: the 1x
    schedule where a multi-scale 3x config trains the same model (benchmark_step measures both at
    the same scale)."""
    chosen = {}
    for family in FAMILIES:
        folder = osp.join(root, 'configs', family)
        for name in sorted(os.listdir(folder), key=lambda n: ('ms-3x' in n, n)):
            m = BACKBONE_IN_NAME.search(name)
            if not (m and name.endswith('.py') and m.group(2) in archs):
                continue
            chosen.setdefault((family, m.group(2), model_kind(name)),
                              osp.join('configs', family, name))
    by_arch = {a: [c for (f, ar, k), c in chosen.items() if ar == a] for a in archs}
    refs = []
    for kind in REFERENCE_KINDS:  # the first family's T config of that kind carries the references
        for family in FAMILIES:
            cfg = chosen.get((family, 't', kind))
            if cfg:
                refs += [(cfg, r) for r in REFERENCE_NAMES]
                break
    jobs = [Job(c, r, 'T') for c, r in refs]
    for a in archs:
        jobs += [Job(c, None, a.upper()) for c in by_arch[a]]
    return jobs


def estimate_s(jobs: List[Job]) -> int:
    return EST_FIXED_S + sum(EST_JOB_S[j.arch] for j in jobs)


# --------------------------------------------------------------------------------------------------
# the measurements (CUDA)
# --------------------------------------------------------------------------------------------------
def run_gpu_tests(log) -> dict:
    cmd = [sys.executable, '-m', 'pytest', '-q', '-rA', '-p', 'no:cacheprovider'] + GPU_TESTS
    log('GPU tests: ' + ' '.join(cmd[1:]))
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return parse_pytest(r.stdout, r.returncode)


def parse_pytest(stdout: str, returncode: int) -> dict:
    """Counts and the names of failing tests from ``pytest -q -rA`` output."""
    counts = {}
    summary = [ln for ln in stdout.splitlines()
               if re.search(r'\d+ (passed|failed|skipped|error)', ln)]
    for n, what in re.findall(r'(\d+) (passed|failed|skipped|errors?)',
                              summary[-1] if summary else ''):
        counts[what.rstrip('s') if what.startswith('error') else what] = int(n)
    failed = re.findall(r'^(?:FAILED|ERROR) (\S+)', stdout, flags=re.M)
    return dict(returncode=returncode, counts=counts, failed=failed)


def worker(config: str, ref: Optional[str], warmup: int = 3) -> None:
    """In its own process: one config measured in fp32, then with AMP (``benchmark_step``'s training
    step and inference on CUDA), one ``RESULT {json}`` line each."""
    import gc

    import torch

    for amp in (False, True):
        try:
            res = measure_one(config, ref, 'cuda', amp, None, warmup)
        except torch.cuda.OutOfMemoryError as e:
            res = dict(error=f'out of memory: {str(e).splitlines()[0][:120]}')
        except Exception as e:  # noqa: BLE001 - one config of a report over many, in its own
            # process: any failure is written into its row (type and message), the others go on
            res = dict(error=f'{type(e).__name__}: {str(e).splitlines()[0][:120]}')
        print('RESULT ' + json.dumps(dict(res, amp=amp)), flush=True)
        gc.collect()
        torch.cuda.empty_cache()


def run_job(job: Job, timeout_s: float) -> dict:
    """Run :func:`worker` for ``job`` in a fresh process: ``{'fp32': result, 'amp': result}``, each
    a benchmark_step result or ``{'error': ...}``."""
    cmd = [sys.executable, osp.abspath(__file__), '--worker', job.config]
    if job.ref:
        cmd += ['--reference', job.ref]
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        out, code = r.stdout, r.returncode
    except subprocess.TimeoutExpired as e:  # its output comes as bytes, whatever text= says
        out, code = (e.stdout or b'').decode(errors='replace'), None
    return parse_worker(out, code, timeout_s)


def parse_worker(stdout: str, returncode: Optional[int], timeout_s: float = 0) -> dict:
    got = {}
    for line in stdout.splitlines():
        if line.startswith('RESULT '):
            res = json.loads(line[len('RESULT '):])
            got['amp' if res.pop('amp') else 'fp32'] = res
    why = (f'stopped after {timeout_s:.0f} s' if returncode is None else
           f'process killed (signal {-returncode})' if returncode < 0 else
           f'process exited {returncode} without a result')
    return {k: got.get(k, dict(error=why)) for k in ('fp32', 'amp')}


# --------------------------------------------------------------------------------------------------
# the markdown
# --------------------------------------------------------------------------------------------------
def format_tests(res: Optional[dict]) -> str:
    if res is None:
        return 'not run'
    counts = ', '.join(f'{n} {k}' for k, n in sorted(res['counts'].items())) or 'no summary line'
    out = f'`pytest {" ".join(GPU_TESTS)}`: {counts} (exit code {res["returncode"]})'
    if res['failed']:
        out += '\n\nFailed: ' + ', '.join(f'`{t}`' for t in res['failed'])
    return out


def format_attention(rows: List[dict]) -> str:
    """One line per N; the columns repeat for every linear-time core measured (the table's
    cores)."""
    cores = [k[:-len('_fp32_ms')] for k in rows[0] if k.endswith('_fp32_ms')] if rows else []
    titles = {name: CORES[name].title if name in CORES else name for name in cores}
    head = ('| tokens | '
            + ''.join(f'{titles[c]} fp16 err | {titles[c]} bf16 err | ' for c in cores)
            + 'flash fp16 ms | ' + ''.join(f'{titles[c]} fp16 ms | ' for c in cores)
            + ''.join(f'{titles[c]} fp32 ms | ' for c in cores)
            + ''.join(f'{titles[c]} / flash | ' for c in cores)).rstrip()
    out = [head, '|' + '---|' * (2 + 5 * len(cores))]
    for r in rows:
        flash = r.get('flash_fp16_ms')
        cells = [str(r['tokens'])]
        cells += [f"{r[f'{c}_{dt}_err']:.1e}" for c in cores for dt in ('float16', 'bfloat16')]
        cells.append('n/a' if flash is None else format(flash, '.3f'))
        cells += [f"{r[f'{c}_fp16_ms']:.3f}" for c in cores]
        cells += [f"{r[f'{c}_fp32_ms']:.3f}" for c in cores]
        cells += ['-' if flash is None else f"{r[f'{c}_fp16_ms'] / flash:.2f}" for c in cores]
        out.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(out)


def format_training(jobs: List[Job], results: List[Optional[dict]]) -> str:
    """One line per config: fp32 and AMP peak training memory and iterations/s side by side."""
    head = ('| config | backbone | batch | train input | fp32 peak MB | fp32 it/s | AMP peak MB | '
            'AMP it/s | AMP / fp32 memory | AMP speed-up |')
    out = [head, '|' + '---|' * 10]
    for job, got in zip(jobs, results):
        got = got or {}
        fp32, amp = got.get('fp32'), got.get('amp')
        meta = next((r for r in (fp32, amp) if r and 'error' not in r), None)
        backbone = job.ref or (meta['backbone'] if meta else '?')
        batch = meta['batch'] if meta else '-'
        hw = 'x'.join(map(str, meta['train_hw'])) if meta else '-'
        cells = []
        for r in (fp32, amp):
            if r is None:
                cells += ['not run (time budget)', '']
            elif 'error' in r:
                cells += [f"error: {r['error'][:60]}", '']
            else:
                cells += [f"{r['train_mem_mb']:.0f}", f"{1.0 / r['train_s']:.2f}"]
        ok = all(r and 'error' not in r for r in (fp32, amp))
        mem = f"{amp['train_mem_mb'] / fp32['train_mem_mb']:.2f}" if ok else '-'
        speed = f"{fp32['train_s'] / amp['train_s']:.2f}" if ok else '-'
        out.append(f'| {job.label} | {backbone} | {batch} | {hw} | ' + ' | '.join(cells)
                   + f' | {mem} | {speed} |')
    return '\n'.join(out)


def report(machine: str, tests: Optional[dict], attention: List[dict], jobs: List[Job],
           results: List[Optional[dict]], minutes: float) -> str:
    return '\n\n'.join([
        '# GPU report', machine,
        '## 1. Tests that need a GPU', format_tests(tests),
        '## 2. Attention in fp16 / bf16 (B=1, h=4, d=32)',
        'Error: largest |half - fp32| over the largest |fp32| output value. Times: median of 10 '
        'CUDA-event timings after a warm-up; flash = `scaled_dot_product_attention` restricted to '
        'the flash kernel.',
        format_attention(attention) if attention else 'not run',
        '## 3. Training memory and speed at the configs\' real resolution',
        'One training step (forward, backward, the config\'s optimizer) after 3 warm-up steps, '
        'per-GPU batch of the config; peak memory allocated by torch during that step; AMP = '
        '`--amp` (AmpOptimWrapper, fp16, dynamic loss scale).',
        format_training(jobs, results),
        f'Wall time: {minutes:.1f} min.'])


def machine_line() -> str:
    import torch
    p = torch.cuda.get_device_properties(0)
    return (f'{p.name}, {p.total_memory / 2 ** 30:.0f} GiB; torch {torch.__version__}, CUDA '
            f'{torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}')


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out', default='work_dirs/gpu_report', help='writes OUT.md and OUT.json')
    p.add_argument('--budget-min', type=float, default=20.0, help='stop starting jobs past this')
    p.add_argument('--archs', default='ts', help='arch letters of the configs (t, s)')
    p.add_argument('--tokens', type=int, nargs='+', default=TOKENS)
    p.add_argument('--plan', action='store_true',
                   help='print the plan and its estimate, run nothing')
    p.add_argument('--worker', help=argparse.SUPPRESS)
    p.add_argument('--reference', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.reference)
        return 0
    jobs = plan(ROOT, args.archs)
    est = estimate_s(jobs)
    if args.plan:
        for j in jobs:
            print(f'{j.arch} {j.label}')
        print(f'{len(jobs)} configs, each in fp32 and with AMP; estimated {est / 60:.0f} min with '
              f'the tests and the attention table (budget {args.budget_min:g} min)')
        return 0
    import torch
    if not torch.cuda.is_available():
        print('gpu_report: error: no CUDA GPU here (torch.cuda.is_available() is False); this '
              'report runs only on a CUDA machine. `--plan` shows what it would run.',
              file=sys.stderr)
        return 2
    t0 = time.time()

    def log(msg):
        print(f'[{(time.time() - t0) / 60:5.1f} min] {msg}', flush=True)
    tests = run_gpu_tests(log)
    log(format_tests(tests))
    attention = cuda_attention_table(args.tokens, log)
    results: List[Optional[dict]] = []
    for i, job in enumerate(jobs, 1):
        left = args.budget_min * 60 - (time.time() - t0)
        if left < EST_JOB_S[job.arch] * 1.5:
            log(f'time budget: {len(jobs) - i + 1} configs not run')
            results += [None] * (len(jobs) - i + 1)
            break
        got = run_job(job, timeout_s=min(left, EST_JOB_S[job.arch] * 4))
        results.append(got)
        log(f'[{i}/{len(jobs)}] {job.label}: ' + '; '.join(
            f"{k} " + (f"error {r['error']}" if 'error' in r else
                       f"{1 / r['train_s']:.2f} it/s, peak {r['train_mem_mb']:.0f} MB")
            for k, r in got.items()))
    md = report(machine_line(), tests, attention, jobs, results, (time.time() - t0) / 60)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out + '.md', 'w') as f:
        f.write(md + '\n')
    with open(args.out + '.json', 'w') as f:
        json.dump(dict(machine=machine_line(), tests=tests, attention=attention,
                       jobs=[asdict(j) for j in jobs], results=results), f, indent=1)
    print(md)
    log(f'wrote {args.out}.md and {args.out}.json')
    failed = bool(tests['failed']) or tests['returncode'] not in (0, 5)
    return 1 if failed or any(r and 'error' in v for r in results if r for v in r.values()) else 0


if __name__ == '__main__':
    sys.exit(main())
