"""Our classifiers against the authors' own code: same weights, one run (docs/benchmarks.md 12).

    pip install timm einops fvcore          # what the authors' model files import
    git clone https://github.com/LeapLabTHU/InLine PATH/InLine
    git clone https://github.com/qhfan/MALA PATH/MALA
    python tools/analysis_tools/benchmark_authors.py --inline-repo PATH/InLine --mala-repo PATH/MALA
    python tools/analysis_tools/benchmark_authors.py --inline-repo PATH/InLine --profile \\
        --families inline_swin --out OUT

The authors' weights are loaded into ours through the family's key layout and the logits compared
before anything is timed. Inference, training step (AdamW) and its peak allocation, medians of
--reps alternating; time ratios authors' / ours, memory ratios ours / authors'.
"""
import argparse
import os.path as osp
import statistics
import sys

import torch
import torch.nn.functional as F

from tools.workshop.benchmarking import (
    in_fresh_process,
    once,
    peak_memory,
    peak_rss_kb,
    result,
    rounds,
    save,
    synced,
    where,
)


class Runner:
    """One model's inference and training step on a fixed batch."""

    def __init__(self, model, ours, x, y, device):
        from tools.workshop.authors_code import logits
        self.model, self.x, self.y = model, x, y
        self.optim = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
        self.logits = lambda m: logits(m, self.x, ours)
        self.infer, self.train_step = synced(self._infer, device), synced(self._step, device)

    def loss(self, model):
        return F.cross_entropy(self.logits(model), self.y)

    def _infer(self):
        self.model.eval()
        with torch.no_grad():
            self.logits(self.model)

    def _step(self):
        self.model.train()
        self.loss(self.model).backward()
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)


def _runners(family, arch, repo, args, device):
    """(ours, theirs) with the same weights, and the batch, on ``device``."""
    from tools.workshop.authors_code import build_pair
    ours, theirs = build_pair(family, arch, repo, drop_path=0.0, seed=args.seed)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=g).to(device)
    y = torch.randint(0, 1000, (args.batch,), generator=g).to(device)
    return ours.to(device), theirs.to(device), x, y


def measure(family, arch, repo, args, device) -> dict:
    from tools.workshop.authors_code import logits
    ours, theirs, x, y = _runners(family, arch, repo, args, device)
    with torch.no_grad():
        diff = (logits(ours, x, True) - logits(theirs, x, False)).abs().max().item()
    if diff > args.atol:
        raise SystemExit(f'{family}-{arch}: our logits differ from the authors\' by {diff:.3g} '
                         f'(> --atol {args.atol:g}) on the same weights; not timing')
    run = {'ours': Runner(ours, True, x, y, device), 'authors': Runner(theirs, False, x, y, device)}
    out = dict(family=family, arch=arch, batch=args.batch, size=args.size,
               logits_max_abs_diff=diff, params_ours=sum(p.numel() for p in ours.parameters()),
               params_authors=sum(p.numel() for p in theirs.parameters()))
    for what in ('infer', 'train_step'):
        for r in run.values():  # one untimed warm-up of each
            getattr(r, what)()
        times = rounds({k: getattr(r, what) for k, r in run.items()}, args.reps, once, True)
        med = {k: statistics.median(ts) for k, ts in times.items()}
        out.update({f'{what}_s_{k}': med[k] for k in run})
        out[f'{what}_ratio'] = round(med['authors'] / med['ours'], 3)
    peak = {k: peak_memory(r.train_step) for k, r in run.items()}
    out.update({f'train_peak_mb_{k}': round(peak[k] / 2 ** 20, 3) for k in run})
    out['memory_ratio'] = round(peak['ours'] / peak['authors'], 3) if peak['authors'] else None
    if args.profile:
        from tools.workshop.profiling import profile_parts
        for k, r in run.items():
            out[f'profile_{k}'] = profile_parts(r.model, r.loss, r.optim, cores=k == 'ours')
    return out


def rss_pair(family, argv) -> dict:
    """Peak RSS growth (MB) of the first training step of ours and of the authors' model, each
    in a fresh process (``--rss-one``)."""
    keep = [a for a in argv if a not in ('--profile', '--rss')]
    out = {}
    for which in ('ours', 'authors'):
        mb, proc = in_fresh_process(osp.abspath(__file__), [*keep, '--rss-one', family, which])
        if mb is None:
            raise SystemExit(f'{family} ({which}): the RSS run failed:\n{proc.stdout[-2000:]}')
        out[f'rss_mb_{which}'] = mb
    out['rss_ratio'] = (round(out['rss_mb_ours'] / out['rss_mb_authors'], 3)
                        if out['rss_mb_authors'] else None)
    return out


def _fmt(x) -> str:
    return '-' if x is None else f'{x:.2f}'


def table(results) -> str:
    rows = ['| model | params (M), both | inference s: authors / ours (ratio) | training step s: '
            'authors / ours (ratio) | step peak MB: authors / ours (ratio ours/authors) |',
            '|---|---|---|---|---|']
    for r in results:
        ours, theirs = r['params_ours'] / 1e6, r['params_authors'] / 1e6
        params = f'{ours:.2f}' + ('' if ours == theirs else f' (authors: {theirs:.2f})')
        rows.append(
            f"| {r['family']}-{r['arch']} | {params} | "
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


def profile_table(results) -> str:
    """Forward + backward ms by part, and self ms by operator kind, authors beside ours."""
    out = []
    for r in results:
        name, pa, po = f"{r['family']}-{r['arch']}", r['profile_authors'], r['profile_ours']
        parts = {}
        for k, pr in (('authors', pa), ('ours', po)):
            for row in pr['rows']:
                leaf = row['path'].split('/')
                part = ('attn: ' + leaf[-1] if leaf[-1] == 'local' or leaf[-1].startswith('core:')
                        else leaf[0])
                parts.setdefault(part, {'authors': 0., 'ours': 0.})[k] += row['fwd_ms'] + \
                    row['bwd_ms']
        out += [f'**{name}**, one training step by part (forward + backward ms; ours\' core and '
                'local residual are inside its attention row and also shown alone):', '',
                '| part | authors | ours | authors - ours |', '|---|---|---|---|']
        for p in sorted(parts, key=lambda p: -parts[p]['authors']):
            a, o = parts[p]['authors'], parts[p]['ours']
            out.append(f'| {p} | - | {o:.0f} | |' if p.startswith('attn: ') else
                       f'| {p} | {a:.0f} | {o:.0f} | {a - o:+.0f} |')
        a, o = (1e3 * (pr['forward_s'] + pr['backward_s'] + pr['optimizer_s']) for pr in (pa, po))
        out += [f'| **step (wall, incl. optimizer)** | {a:.0f} | {o:.0f} | {a - o:+.0f} |', '',
                f'**{name}**, the same step by operator kind (self ms, forward + backward + '
                'optimizer):', '', '| operators | authors | ours | authors - ours |',
                '|---|---|---|---|']
        ka, ko = pa['op_kinds'], po['op_kinds']
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
    if args.rss_one:  # (in a fresh process) one training step of one model: its peak RSS growth
        family, which = args.rss_one
        ours, theirs, x, y = _runners(family, args.arch, repos[SOURCES[family][0]], args, 'cpu')
        r = Runner(ours, True, x, y, 'cpu') if which == 'ours' else \
            Runner(theirs, False, x, y, 'cpu')
        base = peak_rss_kb()
        r.train_step()
        return result(round((peak_rss_kb() - base) / 1024, 1)) or 0
    device = torch.device(args.device)
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
    md = (f'{where(device)}; batch {args.batch} at {args.size}x{args.size}, fp32, median of '
          f'{args.reps}; one run\n\n' + table(results))
    if args.profile:
        md += '\n\n' + profile_table(results)
    print('\n' + md)
    if args.out:
        save(osp.join(args.out, 'results'), dict(where=where(device), results=results), md)
    return 0


if __name__ == '__main__':
    sys.exit(main())
