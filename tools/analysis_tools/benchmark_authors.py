"""Our backbones against the authors' own model code: same classifier, same weights, one run.

    pip install timm einops fvcore          # what the authors' model files import
    git clone https://github.com/LeapLabTHU/InLine PATH/InLine
    git clone https://github.com/qhfan/MALA PATH/MALA
    python tools/analysis_tools/benchmark_authors.py --inline-repo PATH/InLine --mala-repo PATH/MALA
    python tools/analysis_tools/benchmark_authors.py --inline-repo PATH/InLine --profile \\
        --families inline_swin --out OUT

For each family whose repository is given, the authors' ImageNet classifier is built from their
file with their constructor (``tools.workshop.authors_code``; nothing of theirs is copied into
this project) and ours from ``configs/classification/``; the authors' weights are loaded into ours
through the family's key layout, as a downloaded file would be, and the two models' logits are
compared before anything is timed (a mismatch stops the run). Both get stochastic depth 0 (the same
work in every step, so the comparison is deterministic).

Measured on a random batch (``--batch`` x 3 x ``--size`` x ``--size``):

* inference: ``eval()`` + ``torch.no_grad()`` forward;
* training step: ``train()`` forward, cross-entropy on random labels, backward, AdamW step,
  gradients dropped;
* memory: the peak bytes a training step allocates beyond what existed before it (CPU: the
  profiler's memory events; CUDA: the allocator's peak); ``--rss`` adds the growth of the peak
  resident memory over the first training step, each model in a fresh process (what the
  allocator's events miss, e.g. oneDNN's scratch buffers, included).

Times are the median of ``--reps`` repetitions after one warm-up of each, ours and theirs
alternating so that both see the same machine state. Time ratios are the authors' time over ours
(> 1: ours is faster); memory ratios are ours over the authors' (< 1: ours is smaller).
``--profile`` adds one profiled training step of each: forward / backward milliseconds by part
(attention, FFN, norms, embedding, head, the rest) and the step's operator self time by kind
(GEMMs, convolutions, layout copies, ...). Timings are one run on one machine; the CPU is printed
with them.
"""
import argparse
import json
import os
import os.path as osp
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from tools.workshop.benchmarking import cpu_name, peak_rss_kb


class Runner:
    """One model's inference and training step on a fixed batch."""

    def __init__(self, model, ours, x, y, device):
        from tools.workshop.authors_code import logits
        self.model, self.ours, self.x, self.y = model, ours, x, y
        self.device = device
        self.optim = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
        self.logits = lambda m: logits(m, self.x, ours)

    def sync(self):
        if self.device.type == 'cuda':
            torch.cuda.synchronize()

    def loss(self, model):
        return F.cross_entropy(self.logits(model), self.y)

    def infer(self):
        self.model.eval()
        with torch.no_grad():
            self.logits(self.model)
        self.sync()

    def train_step(self):
        self.model.train()
        self.loss(self.model).backward()
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        self.sync()


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(family, arch, repo, args, device) -> dict:
    from tools.workshop.authors_code import build_pair, logits
    from tools.workshop.benchmarking import peak_memory
    ours, theirs = build_pair(family, arch, repo, drop_path=0.0, seed=args.seed)
    ours.to(device)
    theirs.to(device)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=g).to(device)
    y = torch.randint(0, 1000, (args.batch,), generator=g).to(device)
    with torch.no_grad():
        diff = (logits(ours, x, True) - logits(theirs, x, False)).abs().max().item()
    if diff > args.atol:
        raise SystemExit(f'{family}-{arch}: our logits differ from the authors\' by {diff:.3g} '
                         f'(> --atol {args.atol:g}) on the same weights; not timing')
    params = [sum(p.numel() for p in m.parameters()) for m in (ours, theirs)]
    run = {'ours': Runner(ours, True, x, y, device), 'authors': Runner(theirs, False, x, y, device)}
    out = dict(family=family, arch=arch, batch=args.batch, size=args.size,
               logits_max_abs_diff=diff, params_ours=params[0], params_authors=params[1])
    for what in ('infer', 'train_step'):
        for r in run.values():  # one untimed warm-up of each
            getattr(r, what)()
        times = {k: [] for k in run}
        for i in range(args.reps):
            order = list(run) if i % 2 == 0 else list(run)[::-1]
            for k in order:
                times[k].append(timed(getattr(run[k], what)))
        med = {k: statistics.median(times[k]) for k in run}
        for k in run:
            out[f'{what}_s_{k}'] = med[k]
        out[f'{what}_ratio'] = round(med['authors'] / med['ours'], 3)
    peak = {k: peak_memory(r.train_step) for k, r in run.items()}
    for k in run:
        out[f'train_peak_mb_{k}'] = round(peak[k] / 2 ** 20, 3)
    out['memory_ratio'] = round(peak['ours'] / peak['authors'], 3) if peak['authors'] else None
    if args.profile:
        from tools.workshop.profiling import profile_parts
        for k, r in run.items():
            out[f'profile_{k}'] = profile_parts(r.model, r.loss, r.optim, cores=k == 'ours')
    return out


def _params(r) -> str:
    ours, theirs = r['params_ours'] / 1e6, r['params_authors'] / 1e6
    return f'{ours:.2f}' if r['params_ours'] == r['params_authors'] else \
        f'{ours:.2f} (authors: {theirs:.2f})'


def _fmt(x) -> str:
    return '-' if x is None else f'{x:.2f}'


def rss_one(args, repos) -> int:
    """(in a fresh process) one training step of one model; prints its peak RSS growth in MB."""
    from tools.workshop.authors_code import SOURCES, build_pair
    family, which = args.rss_one
    ours, theirs = build_pair(family, args.arch, repos[SOURCES[family][0]], 0.0, args.seed)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=g)
    y = torch.randint(0, 1000, (args.batch,), generator=g)
    r = Runner(ours, True, x, y, torch.device('cpu')) if which == 'ours' else \
        Runner(theirs, False, x, y, torch.device('cpu'))
    base = peak_rss_kb()
    r.train_step()
    print(f'RSS {(peak_rss_kb() - base) / 1024:.1f}')
    return 0


def rss_pair(family, argv) -> dict:
    """Peak RSS growth (MB) of the first training step of ours and of the authors' model, each
    in a fresh process."""
    import subprocess
    keep = [a for a in argv if a not in ('--profile', '--rss')]
    out = {}
    for which in ('ours', 'authors'):
        cmd = [sys.executable, osp.abspath(__file__), *keep, '--rss-one', family, which]
        res = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith('RSS ')]
        if res.returncode or not lines:
            raise SystemExit(f'{family} ({which}): the RSS run failed:\n{res.stderr[-2000:]}')
        out[f'rss_mb_{which}'] = float(lines[-1].split()[1])
    out['rss_ratio'] = round(out['rss_mb_ours'] / out['rss_mb_authors'], 3) \
        if out['rss_mb_authors'] else None
    return out


def table(results) -> str:
    rows = ['| model | params (M), both | inference s: authors / ours (ratio) | training step s: '
            'authors / ours (ratio) | step peak MB: authors / ours (ratio ours/authors) |',
            '|---|---|---|---|---|']
    for r in results:
        rows.append(
            f"| {r['family']}-{r['arch']} | {_params(r)} | "
            f"{r['infer_s_authors']:.3f} / {r['infer_s_ours']:.3f} (**{r['infer_ratio']:.2f}x**) | "
            f"{r['train_step_s_authors']:.3f} / {r['train_step_s_ours']:.3f} "
            f"(**{r['train_step_ratio']:.2f}x**) | {r['train_peak_mb_authors']:.0f} / "
            f"{r['train_peak_mb_ours']:.0f} (**{_fmt(r['memory_ratio'])}**) |")
    if any('rss_ratio' in r for r in results):
        rows += ['', '| model | first-step peak RSS growth MB: authors / ours '
                 '(ratio ours/authors) |', '|---|---|']
        rows += [f"| {r['family']}-{r['arch']} | {r['rss_mb_authors']:.0f} / "
                 f"{r['rss_mb_ours']:.0f} (**{_fmt(r['rss_ratio'])}**) |"
                 for r in results if 'rss_ratio' in r]
    return '\n'.join(rows)


def _part(path: str) -> str:
    parts = path.split('/')
    if parts[-1] == 'local' or parts[-1].startswith('core:'):
        return 'attn: ' + parts[-1]
    return parts[0]


def profile_table(results) -> str:
    """Forward + backward ms by part, and self ms by operator kind, authors beside ours."""
    out = []
    for r in results:
        name = f"{r['family']}-{r['arch']}"
        parts = {}
        for k in ('authors', 'ours'):
            for row in r[f'profile_{k}']['rows']:
                p = parts.setdefault(_part(row['path']), {'authors': 0., 'ours': 0.})
                p[k] += row['fwd_ms'] + row['bwd_ms']
        out += [f'**{name}**, one training step by part (forward + backward ms; ours\' core and '
                'local residual are inside its attention row and also shown alone):', '',
                '| part | authors | ours | authors - ours |', '|---|---|---|---|']
        for p in sorted(parts, key=lambda p: -parts[p]['authors']):
            a, o = parts[p]['authors'], parts[p]['ours']
            if p.startswith('attn: '):
                out.append(f'| {p} | - | {o:.0f} | |')
            else:
                out.append(f'| {p} | {a:.0f} | {o:.0f} | {a - o:+.0f} |')
        for k in ('authors', 'ours'):
            pr = r[f'profile_{k}']
            parts.setdefault('step', {})[k] = 1e3 * (pr['forward_s'] + pr['backward_s'] +
                                                     pr['optimizer_s'])
        a, o = parts['step']['authors'], parts['step']['ours']
        out += [f'| **step (wall, incl. optimizer)** | {a:.0f} | {o:.0f} | {a - o:+.0f} |', '',
                f'**{name}**, the same step by operator kind (self ms, forward + backward + '
                'optimizer):', '', '| operators | authors | ours | authors - ours |',
                '|---|---|---|---|']
        ka, ko = r['profile_authors']['op_kinds'], r['profile_ours']['op_kinds']
        for kind in sorted(set(ka) | set(ko), key=lambda k: -ka.get(k, 0.)):
            a, o = ka.get(kind, 0.), ko.get(kind, 0.)
            out.append(f'| {kind} | {a:.0f} | {o:.0f} | {a - o:+.0f} |')
        out.append('')
    return '\n'.join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--inline-repo', help='a clone of LeapLabTHU/InLine (InLine-Swin, InLine-PVT)')
    p.add_argument('--mala-repo', help='a clone of qhfan/MALA (MAViT)')
    p.add_argument('--families', nargs='+', help='default: every family whose repository is given')
    p.add_argument('--arch', default='tiny')
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--reps', type=int, default=5)
    p.add_argument('--threads', type=int, help='torch CPU threads (default: torch\'s own)')
    p.add_argument('--device', default='cpu')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--atol', type=float, default=1e-4,
                   help='largest logit difference accepted before timing (default 1e-4)')
    p.add_argument('--profile', action='store_true', help='one profiled training step of each')
    p.add_argument('--rss', action='store_true',
                   help="also the growth of the process's peak resident memory over the first "
                        'training step, each model in a fresh process (allocations outside '
                        "torch's allocator included)")
    p.add_argument('--rss-one', nargs=2, metavar=('FAMILY', 'WHICH'), help=argparse.SUPPRESS)
    p.add_argument('--out', help='folder for results.json and results.md')
    args = p.parse_args(argv)
    from tools.workshop.authors_code import SOURCES, AuthorsCodeError
    repos = {'LeapLabTHU/InLine': args.inline_repo, 'qhfan/MALA': args.mala_repo}
    families = args.families or [f for f, (r, _, _) in SOURCES.items() if repos[r]]
    if not families:
        p.error('give --inline-repo and / or --mala-repo: local clones of the authors\' code')
    for f in families:
        if f not in SOURCES:
            p.error(f'--families: unknown {f!r}; choose from {sorted(SOURCES)}')
        if not repos[SOURCES[f][0]]:
            opt = '--inline-repo' if SOURCES[f][0].endswith('InLine') else '--mala-repo'
            p.error(f'{f} needs {opt} (a clone of {SOURCES[f][0]})')
        if args.arch not in SOURCES[f][2]:
            p.error(f'--arch: {f} has no released arch {args.arch!r}; choose from '
                    f'{sorted(SOURCES[f][2])}')
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.rss_one:
        return rss_one(args, repos)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == 'cuda' else \
        f'{cpu_name()}, {torch.get_num_threads()} threads'
    results = []
    for f in families:
        try:
            results.append(measure(f, args.arch, repos[SOURCES[f][0]], args, device))
        except AuthorsCodeError as err:
            raise SystemExit(str(err))
        r = results[-1]
        if args.rss:
            r.update(rss_pair(f, argv if argv is not None else sys.argv[1:]))
        print(f"{f}-{args.arch}: logits differ by {r['logits_max_abs_diff']:.2g}; inference "
              f"{r['infer_ratio']:.2f}x, training step {r['train_step_ratio']:.2f}x, memory "
              f"{_fmt(r['memory_ratio'])} (time: authors' / ours; memory: ours / authors')",
              flush=True)
    head = (f'{where}; torch {torch.__version__}; batch {args.batch} at {args.size}x{args.size}, '
            f'fp32, median of {args.reps}; one run')
    md = head + '\n\n' + table(results)
    if args.profile:
        md += '\n\n' + profile_table(results)
    print('\n' + md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(osp.join(args.out, 'results.json'), 'w') as fh:
            json.dump(dict(where=where, torch=torch.__version__, results=results), fh, indent=1)
        with open(osp.join(args.out, 'results.md'), 'w') as fh:
            fh.write(md + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
