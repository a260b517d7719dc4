"""The GPU check: what needs a CUDA GPU, on a bare GPU node (python, torch, no network).

On a machine with network, once (the wheels land in ``wheels/gpu_check/``, which git ignores)::

    python tools/analysis_tools/gpu_check.py fetch                        # pure-Python wheels
    python tools/analysis_tools/gpu_check.py fetch --python-version 3.12  # + numpy, pyyaml, opencv

Copy the checkout (with ``wheels/``) to the GPU node, then, with the node's own python::

    python3 tools/analysis_tools/gpu_check.py run --out docs/benchmarks/gpu_check/report \\
        [--inline-repo PATH/InLine] [--mala-repo PATH/MALA]

It needs python >= 3.10 and torch >= 2.1 (triton where torch.compile should be checked). What else
it imports (mmengine, mmcv-lite, ...: ``requirements/gpu_check.txt``) it takes from the node where
the node has it, else from the wheels, which it unpacks into a temporary folder put first on
``sys.path`` for this process only and deleted at the end: nothing is installed into the node's
environment. mmlinattn itself is imported from this checkout. It writes OUT.md and OUT.json:

a. every attention core of ``mmlinattn.core.ops.CORES``, forward and backward, in fp32 (TF32 off)
   and in fp16 and bf16 under autocast, against the float64 oracle (the core's explicit matrix);
b. every tiny backbone's training step under autocast, fp16 with a GradScaler and bf16: finite, and
   the gradient within a stated tolerance of the fp32 step's;
c. each core's time and peak memory against SDPA (flash) and the two-GEMM floor Q (K^T V);
d. each tiny backbone's forward + backward time and peak memory at a classification size and a
   detection size, in fp32 and bf16, beside the authors' model code (``--inline-repo``,
   ``--mala-repo``: clones of their repositories, whose files import timm and einops) and timm's
   Swin-T where timm is installed;
e. ``torch.compile`` of each tiny backbone: it compiles, matches eager, and its time;
f. the detector and segmentor training steps of ``benchmark_step.py``, only where mmdet, mmseg and
   mmcv's compiled ops (with CUDA kernels) import; the report says why they were skipped otherwise.

``--device cpu --small`` runs the same parts on the CPU at small sizes (the test suite does this in
a virtual environment holding only torch, so the CPU finds what the node lacks); timings there are
regression figures, not GPU ones. Exit status: 0 when every correctness check holds, 1 when one
fails (the report names it), 2 when the device is not there.
"""
import argparse
import contextlib
import hashlib
import json
import os
import os.path as osp
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..', '..')))  # for tools.workshop

ROOT = osp.abspath(osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))
WHEELS = osp.join(ROOT, 'wheels', 'gpu_check')
REQUIREMENTS = osp.join(ROOT, 'requirements', 'gpu_check.txt')
COMPLETE = '.complete'  # written by fetch once every download succeeded (the list's sha256 first)

#: correctness tolerances (largest error relative to the reference's largest value)
CORE_TOL = {'fp32': 1e-4, 'fp16': 5e-3, 'bf16': 1e-2}
#: the AMP step's gradient against fp32's: ||g - g32|| / ||g32|| over all parameters
GRAD_TOL = {'fp16': 2e-2, 'bf16': 1e-1}
#: torch.compile against eager (fp32, TF32 off)
COMPILE_TOL = 1e-3
FAMILIES = (('InLinePVT', 'tiny'), ('InLineSwin', 'tiny'), ('MAViT', 'tiny'))
#: backbone -> (family of tools.workshop.authors_code, the option naming the authors' clone)
AUTHORS = {'InLinePVT': ('inline_pvt', 'inline_repo'), 'InLineSwin': ('inline_swin', 'inline_repo'),
           'MAViT': ('mavit', 'mala_repo')}
SIZES = {  # part -> (full size on a GPU, --small)
    'core_n': (1024, 196),
    'bench_tokens': ([1024, 4096, 16384, 65536], [256, 1024]),
    'step': ((2, 224), (2, 64)),
    'bench': ([(64, 224), (2, 1024)], [(2, 64)]),
    'compile': ((8, 224), (1, 64)),
}


# --------------------------------------------------------------------------------------------------
# wheels: fetch (networked machine) and unpack (node)
# --------------------------------------------------------------------------------------------------
def read_requirements(path=REQUIREMENTS):
    """(pure, binary) requirement strings of requirements/gpu_check.txt."""
    pure, binary = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith('# binary:'):
                binary.append(line.split(':', 1)[1].strip())
            elif line and not line.startswith('#'):
                pure.append(line)
    return pure, binary


def fetch(args) -> int:
    """pip download of the listed wheels into ``--dest`` (no dependencies: the list is whole)."""
    pure, binary = read_requirements()
    os.makedirs(args.dest, exist_ok=True)
    for old in os.listdir(args.dest):  # no wheel of an earlier list stays beside the new ones
        if old.endswith('.whl') or old == COMPLETE:
            os.remove(osp.join(args.dest, old))
    base = [sys.executable, '-m', 'pip', 'download', '--disable-pip-version-check', '--no-deps',
            '--only-binary=:all:', '-d', args.dest] + (['-q'] if args.quiet else [])
    # pure-Python wheels only (py3-none-any), whichever python runs this: tomli, say, also has
    # compiled wheels that a node's other python could not use
    runs = [base + ['--python-version', '3.10', '--implementation', 'py', '--platform', 'any',
                    '--abi', 'none'] + pure]
    versions = args.python_version or [f'{sys.version_info[0]}.{sys.version_info[1]}']
    machine = args.machine or platform.machine()
    for ver in versions:
        plats = [f'manylinux_2_{n}_{machine}' for n in (28, 27, 24, 17)] + \
            [f'manylinux2014_{machine}', f'manylinux1_{machine}']
        runs.append(base + ['--python-version', ver, '--implementation', 'cp']
                    + [a for p in plats for a in ('--platform', p)] + binary)
    for cmd in runs:
        print('+', ' '.join(cmd), flush=True)
        if subprocess.call(cmd) != 0:
            print(f'gpu_check.py fetch: error: pip download failed (above); {args.dest} may be '
                  'incomplete', file=sys.stderr)
            return 1
    wheels = [f for f in os.listdir(args.dest) if f.endswith('.whl')]
    total = sum(osp.getsize(osp.join(args.dest, f)) for f in wheels)
    with open(REQUIREMENTS, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(osp.join(args.dest, COMPLETE), 'w') as f:  # tools/install.sh compares the digest
        f.write(f'sha256 {digest}\n' + '\n'.join(sorted(wheels)) + '\n')
    print(f'{len(wheels)} wheels, {total / 2 ** 20:.1f} MiB in {args.dest}')
    return 0


_WHEEL = re.compile(r'^(?P<name>[^-]+)-(?P<ver>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)'
                    r'-(?P<plat>[^-]+)\.whl$')


#: the glibc each legacy manylinux tag promises (PEP 600 names the others manylinux_X_Y)
_MANYLINUX = {'manylinux1': (2, 5), 'manylinux2010': (2, 12), 'manylinux2014': (2, 17)}


def this_glibc():
    """(major, minor) of this machine's glibc, or None (not glibc, e.g. musl)."""
    name, version = platform.libc_ver()
    try:
        return tuple(int(x) for x in version.split('.')[:2]) if name == 'glibc' else None
    except ValueError:
        return None


def _platform_fits(tag: str, machine: str, glibc) -> bool:
    if tag == 'any':
        return True
    if not sys.platform.startswith('linux') or not tag.endswith('_' + machine):
        return False
    head = tag[:-len(machine) - 1]
    m = re.fullmatch(r'manylinux_(\d+)_(\d+)', head)
    need = (int(m[1]), int(m[2])) if m else _MANYLINUX.get(head)
    return need is not None and glibc is not None and tuple(glibc) >= need


def wheel_fits(filename: str, version=None, machine=None, glibc=()) -> bool:
    """Whether this python can run the wheel ``filename`` (its tags, read from the name): the
    python and ABI tags, and for a linux wheel the machine and the glibc its manylinux tag needs
    (``glibc``: (major, minor); by default this machine's)."""
    m = _WHEEL.match(filename)
    if not m:
        return False
    major, minor = version or sys.version_info[:2]
    machine = machine or platform.machine()
    glibc = this_glibc() if glibc == () else glibc
    cp = f'cp{major}{minor}'
    abis = m['abi'].split('.')
    # cpXY-abi3: any CPython 3.Z with Z >= Y; cpXY-cpXY: that one; py3-none: every python 3
    older = {f'cp{major}{z}' for z in range(minor + 1)} if 'abi3' in abis else set()
    if not any(p in ('py3', f'py{major}', cp) or p in older for p in m['py'].split('.')):
        return False
    if not any(a in ('none', 'abi3', cp) for a in abis):
        return False
    return any(_platform_fits(p, machine, glibc) for p in m['plat'].split('.'))


def wheel_modules(path: str):
    """The top-level modules a wheel installs (read from its file list)."""
    tops = set()
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            top = name.split('/', 1)[0]
            if top.endswith(('.dist-info', '.data', '.libs')) or top.startswith('.'):
                continue
            tops.add(top.split('.', 1)[0] if '/' not in name else top)
    return sorted(tops)


def _importable(module: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def unpack_missing(wheels: str, target: str):
    """Unpack into ``target`` every wheel in ``wheels`` that fits this python and provides a module
    this python cannot import; returns the unpacked wheels' name-version."""
    if not osp.isdir(wheels):
        return []
    taken, seen = [], set()
    for fname in sorted(os.listdir(wheels)):
        if not fname.endswith('.whl'):
            continue
        dist = fname.split('-', 1)[0].lower().replace('_', '-')
        if dist in seen:
            continue
        if not wheel_fits(fname):  # not for this python, machine or glibc
            continue
        path = osp.join(wheels, fname)
        mods = wheel_modules(path)
        if mods and all(_importable(m) for m in mods):  # the node has it
            seen.add(dist)
            continue
        with zipfile.ZipFile(path) as z:
            z.extractall(target)
        for data in os.listdir(target):  # a wheel's .data/purelib|platlib belongs at the root
            if data.endswith('.data'):
                for sub in ('purelib', 'platlib'):
                    src = osp.join(target, data, sub)
                    if osp.isdir(src):
                        for item in os.listdir(src):
                            shutil.move(osp.join(src, item), osp.join(target, item))
                shutil.rmtree(osp.join(target, data))
        taken.append('-'.join(fname.split('-', 2)[:2]))  # name-version
        seen.add(dist)
    return taken


# --------------------------------------------------------------------------------------------------
# measuring
# --------------------------------------------------------------------------------------------------
def _sync(device):
    import torch
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def timed_ms(fn, device, reps=5, warmup=1) -> float:
    """Median wall time of ``fn()`` in ms (CUDA: synchronised around each call)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def peak_mib(fn, device):
    """Peak CUDA memory ``fn()`` allocates above what was allocated before it (None on the CPU,
    whose allocator keeps no such count)."""
    import torch
    if device.type != 'cuda':
        fn()
        return None
    _sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20


def _why(err: BaseException, limit: int = 200) -> str:
    """One line naming an exception, for the report."""
    return f'{type(err).__name__}: {err}'.splitlines()[0][:limit]


def rel_err(got, want) -> float:
    scale = want.abs().max().item() or 1.0
    return (got.double() - want.double()).abs().max().item() / scale


def autocast(device, name):
    import torch
    if name == 'fp32':
        return contextlib.nullcontext()
    dtype = torch.float16 if name == 'fp16' else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


def autocast_missing(device, name):
    """Why this torch cannot autocast to ``name`` on ``device`` (torch 2.1's CPU autocast takes
    bfloat16 only), or None."""
    try:
        with autocast(device, name):
            pass
    except RuntimeError as err:
        return f'this torch has no {name} autocast on {device.type}: {_why(err, 120)}'
    return None


def no_tf32():
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


# --------------------------------------------------------------------------------------------------
# the parts
# --------------------------------------------------------------------------------------------------
def part_cores(device, small, log):
    """a. Every core, forward and backward, fp32 / fp16 / bf16 against float64."""
    import torch

    from mmlinattn.core.ops import CORES
    n = SIZES['core_n'][small]
    rows = []
    for name, core in CORES.items():
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2, 4, n, 32, generator=g, dtype=torch.float64) for _ in range(3))
        grad = torch.randn(2, 4, n, 32, generator=g, dtype=torch.float64)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = core.attention_matrix(*leaves[:2]) @ leaves[2]
        want = [out.detach()] + list(torch.autograd.grad(out, leaves, grad))
        for prec in ('fp32', 'fp16', 'bf16'):
            xs = [t.float().to(device).requires_grad_() for t in (q, k, v)]
            row = dict(core=name, precision=prec, tokens=n)
            missing = autocast_missing(device, prec)
            if missing:
                rows.append(dict(row, ok=True, skipped=missing))
                log(f'a. {name:8s} {prec}: skipped ({missing})')
                continue
            try:
                with autocast(device, prec):
                    low = [x.to(torch.float16 if prec == 'fp16' else torch.bfloat16)
                           if prec != 'fp32' else x for x in xs]  # what a projection gives
                    y = core(*low)
                got = [y.detach()] + list(torch.autograd.grad(y.float(), xs,
                                                              grad.float().to(device)))
                errs = [rel_err(a.cpu(), b) for a, b in zip(got, want)]
                row.update(out_err=errs[0], grad_err=max(errs[1:]), dtype=str(y.dtype)[6:],
                           finite=all(bool(torch.isfinite(t).all()) for t in got))
                row['ok'] = row['finite'] and max(errs) <= CORE_TOL[prec]
            except Exception as err:  # the report names it
                row.update(ok=False, error=_why(err, 200))
            rows.append(row)
            log(f'a. {name:8s} {prec}: ' + (f"out {row['out_err']:.2e}, grad {row['grad_err']:.2e}"
                                            if 'error' not in row else row['error']))
    return rows


def build_backbone(kind, arch, device):
    import torch

    from mmlinattn.core.registry import MODELS
    torch.manual_seed(0)
    return MODELS.build(dict(type=kind, arch=arch, drop_path_rate=0.0,
                             out_indices=(0, 1, 2, 3))).to(device)


def _loss(outs):
    return sum(o.float().pow(2).mean() for o in outs)


def _grad_scaler(device):
    import torch
    amp = getattr(torch, 'amp', None)
    if amp is not None and hasattr(amp, 'GradScaler'):
        try:
            return amp.GradScaler(device.type)
        except (TypeError, RuntimeError, AssertionError):
            pass
    if device.type == 'cuda':
        return torch.cuda.amp.GradScaler()
    return None


def part_amp_steps(device, small, log):
    """b. Each tiny backbone's training step in fp32, fp16 (GradScaler) and bf16."""
    import torch
    batch, size = SIZES['step'][small]
    rows = []
    for kind, arch in FAMILIES:
        x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1)).to(device)

        def grads(prec, model):
            params = [p for p in model.parameters() if p.requires_grad]
            model.zero_grad(set_to_none=True)
            scaler = _grad_scaler(device) if prec == 'fp16' else None
            with autocast(device, prec):
                loss = _loss(model(x))
            if scaler is not None:
                scaler.scale(loss).backward()
                inv = 1.0 / scaler.get_scale()
            else:
                loss.backward()
                inv = 1.0
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).float()
                              .flatten() for p in params]) * inv
            return loss.detach().float(), flat, scaler is not None

        try:
            model = build_backbone(kind, arch, device).train()
            ref_loss, ref, _ = grads('fp32', model)
        except Exception as err:  # no reference: both rows say why
            for prec in ('fp16', 'bf16'):
                rows.append(dict(backbone=f'{kind}-{arch}', precision=prec, batch=batch,
                                 size=size, ok=False, error=f'the fp32 step: {_why(err)}'))
            log(f'b. {kind}: the fp32 step failed: {_why(err)}')
            continue
        for prec in ('fp16', 'bf16'):
            row = dict(backbone=f'{kind}-{arch}', precision=prec, batch=batch, size=size)
            missing = autocast_missing(device, prec)
            if missing:
                rows.append(dict(row, ok=True, skipped=missing))
                log(f'b. {kind} {prec}: skipped ({missing})')
                continue
            try:
                loss, g, scaled = grads(prec, model)
                finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(g).all())
                err = ((g - ref).norm() / ref.norm()).item()
                row.update(finite=finite, grad_err=err, loss_err=abs((loss - ref_loss).item())
                           / abs(ref_loss.item()), grad_scaler=scaled,
                           ok=finite and err <= GRAD_TOL[prec])
            except Exception as err:
                row.update(ok=False, error=_why(err, 200))
            rows.append(row)
            log(f'b. {kind} {prec}: ' + (f"finite {row['finite']}, grad {row['grad_err']:.2e}"
                                        if 'error' not in row else row['error']))
    return rows


def floor(q, k, v):
    """The two products no linear-time attention avoids: Q (K^T V)."""
    import torch
    return torch.matmul(q, torch.matmul(k.transpose(-2, -1), v))


def part_core_speed(device, small, log):
    """c. Each core's time and peak memory against SDPA flash and the two-GEMM floor."""
    import torch
    import torch.nn.functional as F

    from mmlinattn.core.ops import CORES
    try:  # torch >= 2.3
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash_only():
            return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # torch 2.1, 2.2
        def flash_only():
            return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                                  enable_mem_efficient=False)
    rows = []
    for n in SIZES['bench_tokens'][small]:
        g = torch.Generator().manual_seed(0)
        base = [torch.randn(1, 4, n, 32, generator=g).to(device) for _ in range(3)]
        half = [t.to(torch.bfloat16) for t in base]
        grad = torch.randn(1, 4, n, 32, generator=g).to(device)
        row = dict(tokens=n, heads=4, head_dim=32)

        def fwd_bwd(fn, xs, gout):
            leaves = [t.detach().requires_grad_() for t in xs]
            out = fn(*leaves)
            out.backward(gout.to(out.dtype))

        cases = {'floor_fp32': (floor, base), 'floor_bf16': (floor, half)}
        for name, core in CORES.items():
            if name != 'softmax' or device.type != 'cuda' or n <= 16384:
                cases[name] = (core, half)  # a model under autocast hands the core bf16
        if device.type == 'cuda':
            def sdpa(q, k, v):
                with flash_only():
                    return F.scaled_dot_product_attention(q, k, v)
            cases['sdpa_flash'] = (sdpa, half)
        for name, (fn, xs) in cases.items():
            try:
                with torch.no_grad():
                    row[f'{name}_fwd_ms'] = timed_ms(lambda: fn(*xs), device)
                row[f'{name}_train_ms'] = timed_ms(lambda: fwd_bwd(fn, xs, grad), device)
                row[f'{name}_train_mib'] = peak_mib(lambda: fwd_bwd(fn, xs, grad), device)
            except Exception as err:
                row[f'{name}_error'] = _why(err, 160)
        for name in CORES:
            if f'{name}_train_ms' in row and 'floor_fp32_train_ms' in row:
                row[f'{name}_vs_floor'] = row[f'{name}_train_ms'] / row['floor_fp32_train_ms']
                if 'sdpa_flash_train_ms' in row:
                    row[f'{name}_vs_flash'] = row[f'{name}_train_ms'] / row['sdpa_flash_train_ms']
        rows.append(row)
        log(f'c. N={n}: ' + ', '.join(f'{k[:-9]} {v:.3g} ms' for k, v in row.items()
                                      if k.endswith('_train_ms')))
    return rows


def load_authors(kind, args):
    """The authors' tiny classifier from their clone (their constructor and arguments, stochastic
    depth 0 as ours), or (None, why not)."""
    from tools.workshop.authors_code import build_authors
    family, repo_opt = AUTHORS[kind]
    repo = getattr(args, repo_opt)
    if not repo:
        return None, f'--{repo_opt.replace("_", "-")} not given'
    import torch

    class Features(torch.nn.Module):
        """Their classifier without its head (``forward_features``), as ours is a backbone."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model.forward_features(x)
    try:
        model = build_authors(family, 'tiny', repo, drop_path=0.0)
        return (Features(model) if hasattr(model, 'forward_features') else model), None
    except Exception as err:  # timm / einops missing, another commit of their code, ...
        return None, _why(err, 200)


def load_timm_swin(size):
    try:
        import timm
    except ImportError:
        return None, 'timm is not installed'
    try:
        return timm.create_model('swin_tiny_patch4_window7_224', img_size=size), None
    except Exception as err:
        return None, f'timm swin_tiny: {_why(err)}'


def part_backbone_speed(device, small, args, log):
    """d. Forward + backward time and peak memory of each tiny backbone, ours beside the
    authors' code and timm's Swin-T, fp32 and bf16."""
    import torch
    rows = []
    for batch, size in SIZES['bench'][small]:
        x = torch.randn(batch, 3, size, size).to(device)
        models = {}
        for kind, arch in FAMILIES:
            models[f'{kind}-{arch}'] = (lambda k=kind, a=arch: build_backbone(k, a, device),
                                        'ours')
            # their classifiers may be built for 224 x 224 only: a failure at another size is
            # the row's error, not the check's
            models[f'{kind}-{arch} (authors)'] = (lambda k=kind: load_authors(k, args), 'authors')
        models['Swin-T (timm)'] = (lambda: load_timm_swin(size), 'timm')
        for label, (make, who) in models.items():
            row = dict(model=label, who=who, batch=batch, size=size)
            try:
                made = make()
                model, why = (made, None) if who == 'ours' else made
                if model is None:
                    row['skipped'] = why
                    rows.append(row)
                    log(f'd. {label} {batch}x{size}: skipped ({why})')
                    continue
                model = model.to(device).train()
                made = None
                for prec in ('fp32', 'bf16'):
                    def step(model=model, prec=prec):
                        model.zero_grad(set_to_none=True)
                        with autocast(device, prec):
                            out = model(x)
                        _loss(out if isinstance(out, (tuple, list)) else [out]).backward()
                    row[f'{prec}_ms'] = timed_ms(step, device, reps=3)
                    model.zero_grad(set_to_none=True)  # the peak counts the gradients too
                    row[f'{prec}_mib'] = peak_mib(step, device)
                if row['fp32_mib']:
                    row['bf16_mem_ratio'] = row['bf16_mib'] / row['fp32_mib']
                model = step = None  # freed before the next model is built
            except Exception as err:
                row['error'] = _why(err, 200)
            if device.type == 'cuda':
                torch.cuda.empty_cache()
            rows.append(row)
            log(f'd. {label} {batch}x{size}: ' + (row.get('error') or
                                                  f"fp32 {row['fp32_ms']:.1f} ms, "
                                                  f"bf16 {row['bf16_ms']:.1f} ms"))
    for row in rows:  # ours against the authors' at the same size
        theirs = next((r for r in rows if r['model'] == row['model'] + ' (authors)'
                       and r['size'] == row['size'] and 'bf16_ms' in r), None)
        if theirs and 'bf16_ms' in row and 'error' not in row and 'error' not in theirs:
            row['speedup_vs_authors'] = theirs['fp32_ms'] / row['fp32_ms']
            row['bf16_speedup_vs_authors'] = theirs['bf16_ms'] / row['bf16_ms']
    return rows


def part_compile(device, small, backend, log):
    """e. torch.compile of each tiny backbone (``backend``): compiles, matches eager, its time."""
    import torch
    batch, size = SIZES['compile'][small]
    rows = []
    why = None
    if device.type == 'cuda' and backend == 'inductor' and not _importable('triton'):
        why = 'inductor needs triton on a GPU, and this python has none'
    else:
        try:  # a torch whose dynamo does not run on this python says so here
            torch.compile(lambda t: t + 1, backend='eager')(torch.ones(1))
        except Exception as err:
            why = f'torch.compile does not run here: {_why(err)}'
    if why:
        log(f'e. skipped: {why}')
        return [dict(backbone=f'{k}-{a}', batch=batch, size=size, backend=backend, ok=True,
                     skipped=why[:200]) for k, a in FAMILIES]
    for kind, arch in FAMILIES:
        row = dict(backbone=f'{kind}-{arch}', batch=batch, size=size, backend=backend)
        try:
            import torch._dynamo
            torch._dynamo.reset()
            model = build_backbone(kind, arch, device).eval()
            x = torch.randn(batch, 3, size, size).to(device)
            with torch.no_grad():
                want = model(x)
                compiled = torch.compile(model, backend=backend)
                t = time.perf_counter()
                got = compiled(x)
                _sync(device)
                row['compile_s'] = time.perf_counter() - t
                row['err'] = max(rel_err(a, b) for a, b in zip(got, want))
                row['eager_ms'] = timed_ms(lambda: model(x), device)
                row['compiled_ms'] = timed_ms(lambda: compiled(x), device)
            row['ok'] = row['err'] <= COMPILE_TOL
        except Exception as err:
            row.update(ok=False, error=_why(err, 200))
        rows.append(row)
        log(f'e. {kind}: ' + (row.get('error') or f"compile {row['compile_s']:.1f} s, "
                                                  f"err {row['err']:.1e}, eager "
                                                  f"{row['eager_ms']:.1f} ms, compiled "
                                                  f"{row['compiled_ms']:.1f} ms"))
    return rows


def mmcv_cuda_ops():
    """None when mmcv's compiled ops with CUDA kernels, mmdet and mmseg import; else why not."""
    try:
        import torch
        from mmcv.ops import nms
        boxes = torch.tensor([[0., 0., 1., 1.]], device='cuda')
        nms(boxes, torch.ones(1, device='cuda'), 0.5)
    except Exception as err:
        return f'mmcv\'s compiled CUDA ops are not there ({_why(err, 160)})'
    for pkg in ('mmdet', 'mmseg'):
        if not _importable(pkg):
            return f'{pkg} is not installed'
    return None


#: part f: benchmark_step.py's training step of these configs, fp32 and --amp, one process each
DETECTOR_CONFIGS = ('configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py',
                    'configs/inline_swin/mask-rcnn_inline-swin-t_fpn_1x_coco.py',
                    'configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py',
                    'configs/mavit/upernet_mavit-t_160k_ade20k-512x512.py')
#: part f also runs the tests that skip without a GPU (the --amp training steps against fp32)
GPU_TESTS = ('tests/test_amp.py',)


def part_detectors(device, small, log):
    """f. benchmark_step.py's detector and segmentor steps, and the GPU tests, where they can
    run: mmdet, mmseg and mmcv's compiled ops with CUDA kernels."""
    if device.type != 'cuda':
        why = 'the CPU dry run (--device cpu) measures no detector'
        log(f'f. skipped: {why}')
        return dict(skipped=why, rows=[])
    why = mmcv_cuda_ops()
    if why:
        log(f'f. skipped: {why}')
        return dict(skipped=why, rows=[])
    rows = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with tempfile.TemporaryDirectory() as tmp:
        for config in DETECTOR_CONFIGS:
            for amp in (False, True):
                out = osp.join(tmp, f'{len(rows)}')
                cmd = [sys.executable, osp.join(ROOT, 'tools', 'analysis_tools',
                                                'benchmark_step.py'),
                       osp.join(ROOT, config), '--device', 'cuda', '--out', out] + \
                    (['--amp'] if amp else [])
                row = dict(config=config, amp=amp)
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                                          env=env)
                    row['rc'] = proc.returncode
                    if proc.returncode == 0 and osp.exists(out + '.json'):
                        with open(out + '.json') as f:
                            row['result'] = json.load(f)
                    else:
                        row['tail'] = (proc.stdout + proc.stderr)[-600:]
                except subprocess.TimeoutExpired:
                    row.update(rc=None, tail='timed out after 300 s')
                rows.append(row)
                log(f'f. {config} amp={amp}: exit {row["rc"]}')
        try:
            tests = subprocess.run([sys.executable, '-m', 'pytest', '-q', *GPU_TESTS], cwd=ROOT,
                                   capture_output=True, text=True, env=env, timeout=600)
            rows.append(dict(config=' '.join(GPU_TESTS), amp=None, rc=tests.returncode,
                             tail=tests.stdout[-600:]))
        except subprocess.TimeoutExpired:
            rows.append(dict(config=' '.join(GPU_TESTS), amp=None, rc=None,
                             tail='timed out after 600 s'))
    return dict(skipped=None, rows=rows)


# --------------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------------
def _f(x, spec='.3g'):
    return '-' if x is None else format(x, spec) if isinstance(x, float) else str(x)


def targets(parts):
    """The GPU targets of the check, each as (target, measured, met or None when not measured)."""
    rows = []
    cores = parts.get('cores') or []
    for prec in ('fp32', 'bf16'):
        limit = CORE_TOL[prec]
        errs = [max(r['out_err'], r['grad_err']) for r in cores
                if r['precision'] == prec and 'out_err' in r]
        worst = max(errs) if errs else None
        rows.append((f'every core in {prec} within {limit:g} of float64', worst,
                     None if worst is None else worst <= limit))
    steps = [r for r in parts.get('amp_steps') or [] if not r.get('skipped')]
    rows.append(('AMP training finite for every backbone, fp16 and bf16',
                 f"{sum(bool(r.get('finite')) for r in steps)} / {len(steps)}",
                 bool(steps) and all(r.get('finite') for r in steps)))
    big = [r for r in parts.get('core_speed') or [] if r['tokens'] >= 4096]
    ratios = [r[k] for r in big for k in r if k.endswith('_vs_floor') and 'softmax' not in k]
    rows.append(('linear cores at most 1.5x the two-GEMM floor at >= 4k tokens',
                 max(ratios) if ratios else None, max(ratios) <= 1.5 if ratios else None))
    vs = [r['speedup_vs_authors'] for r in parts.get('backbone_speed') or []
          if 'speedup_vs_authors' in r]
    rows.append(('each backbone\'s training step at least 1.0x the authors\' code',
                 min(vs) if vs else None, min(vs) >= 1.0 if vs else None))
    mem = [r['bf16_mem_ratio'] for r in parts.get('backbone_speed') or []
           if r.get('who') == 'ours' and r.get('bf16_mem_ratio')]
    rows.append(('bf16 peak training memory at most 0.6x fp32', max(mem) if mem else None,
                 max(mem) <= 0.6 if mem else None))
    return rows


def _verdict(row) -> str:
    if row.get('skipped'):
        return f"skipped: {row['skipped']}"
    return 'yes' if row['ok'] else row.get('error', 'NO')


def markdown(report) -> str:
    env, parts = report['environment'], report['parts']
    lines = [f"# GPU check: {env['device_name']}", '',
             f"torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, python "
             f"{env['python']}, {env['when']}; {_f(report['seconds'], '.0f')} s in all. "
             f"From the wheels: {', '.join(env['unpacked']) or 'nothing (the node had all)'}.", '',
             f"**{'PASS' if report['ok'] else 'FAIL'}**: " + (
                 'every correctness check holds.' if report['ok'] else
                 'failed: ' + '; '.join(report['failures'])), '']
    if env['device'] == 'cpu':
        lines += ['CPU dry run: timings are regression figures of this CPU, not GPU ones.', '']
    lines += ['## Targets', '', '| target | measured (worst) | met |', '|---|---|---|']
    for what, value, met in targets(parts):
        lines.append(f"| {what} | {_f(value)} | {'-' if met is None else 'yes' if met else 'NO'} |")
    lines.append('')
    lines += ['## a. Attention cores against float64 (forward and backward)', '',
              "Largest error relative to the float64 output's (gradients': each input's) "
              f"largest value; limits {CORE_TOL}.", '',
              '| core | precision | tokens | output | gradients | ok |',
              '|---|---|---|---|---|---|']
    for r in parts['cores']:
        lines.append(f"| {r['core']} | {r['precision']} | {r['tokens']} | {_f(r.get('out_err'))} | "
                     f"{_f(r.get('grad_err'))} | {_verdict(r)} |")
    lines += ['', '## b. Backbone training step under autocast against fp32', '',
              f"||g - g_fp32|| / ||g_fp32|| over every parameter; limits {GRAD_TOL}.", '',
              '| backbone | precision | input | finite | gradient error | loss error | ok |',
              '|---|---|---|---|---|---|---|']
    for r in parts['amp_steps']:
        lines.append(f"| {r['backbone']} | {r['precision']} | {r['batch']}x{r['size']}^2 | "
                     f"{r.get('finite', '-')} | {_f(r.get('grad_err'))} | {_f(r.get('loss_err'))} "
                     f"| {_verdict(r)} |")
    lines += ['', '## c. Core time and memory (forward + backward, 1 x 4 heads x N x 32)', '',
              'Cores take bf16 inputs (what a model under autocast hands them) and compute in '
              'fp32; the floor is Q (K^T V) in fp32 and in bf16; SDPA is flash attention in bf16. '
              'ms (peak MiB above the inputs). TF32 is off in every part (torch\'s default for '
              'matmuls; cuDNN\'s default is on), so fp32 times are plain fp32.', '']
    names = sorted({k[:-9] for r in parts['core_speed'] for k in r if k.endswith('_train_ms')})
    lines += ['| tokens | ' + ' | '.join(names) + ' |', '|---|' + '---|' * len(names)]
    for r in parts['core_speed']:
        cells = []
        for n in names:
            ms, mib = r.get(f'{n}_train_ms'), r.get(f'{n}_train_mib')
            cells.append('-' if ms is None else f'{ms:.3g}' + (f' ({mib:.0f})' if mib else ''))
        lines.append(f"| {r['tokens']} | " + ' | '.join(cells) + ' |')
    errors = [f"N={r['tokens']} {k[:-6]}: {v}" for r in parts['core_speed'] for k, v in r.items()
              if k.endswith('_error')]
    if errors:
        lines += ['', 'Not measured: ' + '; '.join(errors) + '.']
    ratio = [k for k in sorted({k for r in parts['core_speed'] for k in r})
             if k.endswith(('_vs_floor', '_vs_flash'))]
    if ratio:
        lines += ['', '| tokens | ' + ' | '.join(ratio) + ' |', '|---|' + '---|' * len(ratio)]
        for r in parts['core_speed']:
            lines.append(f"| {r['tokens']} | " + ' | '.join(_f(r.get(k)) for k in ratio) + ' |')
    lines += ['', '## d. Backbones, forward + backward (loss: mean square of the outputs)', '',
              'The authors\' models run their classifiers\' forward_features (the final '
              'classifier left out; MALA\'s keeps its 1x1 projection to 2048 channels), ours the '
              'backbone.',
              '', '| model | input | fp32 ms | bf16 ms | fp32 MiB | bf16 MiB | bf16/fp32 memory | '
              'ours vs authors (fp32, bf16) |', '|---|---|---|---|---|---|---|---|']
    for r in parts['backbone_speed']:
        if 'bf16_mib' not in r or 'error' in r:
            lines.append(f"| {r['model']} | {r['batch']}x{r['size']}^2 | "
                         f"{r.get('skipped') or r.get('error')} | | | | | |")
            continue
        vs = (f"{r['speedup_vs_authors']:.2f}x, {r['bf16_speedup_vs_authors']:.2f}x"
              if 'speedup_vs_authors' in r else '')
        lines.append(f"| {r['model']} | {r['batch']}x{r['size']}^2 | {_f(r['fp32_ms'], '.1f')} | "
                     f"{_f(r['bf16_ms'], '.1f')} | {_f(r['fp32_mib'], '.0f')} | "
                     f"{_f(r['bf16_mib'], '.0f')} | {_f(r.get('bf16_mem_ratio'), '.2f')} | {vs} |")
    backends = sorted({r.get('backend', '') for r in parts['compile']})
    lines += ['', f"## e. torch.compile (inference, fp32, backend {', '.join(backends)})", '',
              f'Largest error relative to eager\'s largest output value; limit {COMPILE_TOL}.', '',
              '| backbone | input | first call s | error | eager ms | compiled ms | ok |',
              '|---|---|---|---|---|---|---|']
    for r in parts['compile']:
        lines.append(f"| {r['backbone']} | {r['batch']}x{r['size']}^2 | "
                     f"{_f(r.get('compile_s'), '.1f')} | {_f(r.get('err'), '.1e')} | "
                     f"{_f(r.get('eager_ms'), '.1f')} | {_f(r.get('compiled_ms'), '.1f')} | "
                     f"{_verdict(r)} |")
    det = parts['detectors']
    lines += ['', '## f. Detector and segmentor steps (benchmark_step.py)', '']
    if det['skipped']:
        lines.append(f"Skipped: {det['skipped']}.")
    for r in det['rows']:
        lines += [f"`{r['config']}` amp={r['amp']}: exit {r['rc']}", '', '```',
                  json.dumps(r['result'], indent=1)[:1500] if 'result' in r else r['tail'], '```']
    return '\n'.join(lines) + '\n'


def environment(device, unpacked):
    import torch
    triton = None
    with contextlib.suppress(Exception):
        import triton as _triton
        triton = _triton.__version__
    return dict(device=device.type,
                device_name=(torch.cuda.get_device_name(device) if device.type == 'cuda'
                             else f'CPU ({platform.processor() or platform.machine()}, '
                                  f'{torch.get_num_threads()} threads)'),
                torch=torch.__version__, cuda=torch.version.cuda, triton=triton,
                python=platform.python_version(), unpacked=unpacked,
                when=time.strftime('%Y-%m-%d %H:%M'))


def run(args) -> int:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix='mmlinattn-gpu-check-') as target:
        unpacked = unpack_missing(args.wheels, target)  # before torch, which looks for numpy
        sys.path[:0] = [target, ROOT]
        import torch
        device = torch.device(args.device)
        if device.type == 'cuda' and not torch.cuda.is_available():
            print('gpu_check.py: error: no CUDA device visible to this torch '
                  f'({torch.__version__}); --device cpu runs the CPU dry run', file=sys.stderr)
            return 2
        try:
            import mmlinattn.core  # noqa: F401  (registers the backbones)
        except ImportError as err:
            print(f'gpu_check.py: error: mmlinattn does not import here ({err}); the wheels of '
                  f'requirements/gpu_check.txt belong in {args.wheels} '
                  '(gpu_check.py fetch on a machine with network)', file=sys.stderr)
            return 1
        no_tf32()
        def log(msg):
            print(msg, flush=True)
        parts = {}
        steps = [('cores', lambda: part_cores(device, args.small, log)),
                 ('amp_steps', lambda: part_amp_steps(device, args.small, log)),
                 ('core_speed', lambda: part_core_speed(device, args.small, log)),
                 ('backbone_speed', lambda: part_backbone_speed(device, args.small, args, log)),
                 ('compile', lambda: part_compile(device, args.small, args.compile_backend, log)
                  if not args.no_compile else []),
                 ('detectors', lambda: part_detectors(device, args.small, log))]
        failures = []
        for name, fn in steps:
            try:
                parts[name] = fn()
            except Exception:  # the other parts still run
                failures.append(f'part {name} crashed: {traceback.format_exc().splitlines()[-1]}')
                parts[name] = [] if name != 'detectors' else dict(skipped='crashed', rows=[])
        failures += [f"detectors: {r['config']} amp={r['amp']} exit {r['rc']}"
                     for r in parts['detectors']['rows'] if r['rc'] != 0]
        for name in ('cores', 'amp_steps', 'compile'):
            failures += [f"{name}: {r.get('core') or r.get('backbone')} "
                         f"{r.get('precision', '')} {r.get('error', 'over its limit')}".strip()
                         for r in parts[name] if not r['ok']]
        report = dict(environment=environment(device, unpacked), parts=parts,
                      failures=failures, ok=not failures,
                      seconds=time.perf_counter() - start)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out + '.json', 'w') as f:
        json.dump(report, f, indent=1)
    with open(args.out + '.md', 'w') as f:
        f.write(markdown(report))
    print(f"{'PASS' if report['ok'] else 'FAIL'}: wrote {args.out}.md and {args.out}.json "
          f"({report['seconds']:.0f} s)")
    return 0 if report['ok'] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest='command', required=True)
    f = sub.add_parser('fetch', help='download the wheels (a machine with network)')
    f.add_argument('--dest', default=WHEELS)
    f.add_argument('--python-version', action='append',
                   help='X.Y of the node\'s python, for the compiled wheels (default: this one; '
                        'repeat for several)')
    f.add_argument('--machine', help='the node\'s machine (default: this one\'s, e.g. x86_64)')
    f.add_argument('--quiet', action='store_true', help='pip download -q')
    r = sub.add_parser('run', help='run the check (the GPU node)')
    r.add_argument('--out', default=osp.join(ROOT, 'docs', 'benchmarks', 'gpu_check', 'report'),
                   help='OUT.md and OUT.json are written')
    r.add_argument('--device', default='cuda')
    r.add_argument('--wheels', default=WHEELS)
    r.add_argument('--small', action='store_true', help='small sizes (the CPU dry run)')
    r.add_argument('--no-compile', action='store_true', help='skip part e')
    r.add_argument('--compile-backend', default='inductor',
                   help='torch.compile backend of part e (the CPU dry run in the test suite takes '
                        'aot_eager: dynamo and AOT autograd trace the same graphs, without '
                        'inductor\'s C++ code generation, minutes per backbone on 2 cores)')
    r.add_argument('--inline-repo', help='a clone of LeapLabTHU/InLine (their model files)')
    r.add_argument('--mala-repo', help='a clone of qhfan/MALA')
    args = p.parse_args(argv)
    return fetch(args) if args.command == 'fetch' else run(args)


if __name__ == '__main__':
    sys.exit(main())
