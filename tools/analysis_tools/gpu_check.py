"""The GPU check: what needs a CUDA GPU, on a bare GPU node (python, torch, no network).

On a machine with network, once (the wheels land in ``wheels/gpu_check/``, which git ignores)::

    python tools/analysis_tools/gpu_check.py fetch

Copy the checkout (with ``wheels/gpu_check/``: pure-Python wheels, a few MB) to the GPU node, then,
with the node's own python::

    python3 tools/analysis_tools/gpu_check.py run --out docs/benchmarks/gpu_check/report \\
        [--inline-repo PATH/InLine] [--mala-repo PATH/MALA] [--detectors]

It needs python >= 3.10, torch >= 2.1 and the node's own numpy, PyYAML, opencv and pillow (GPU
images hold them; the check imports each in a child process first and names the one that fails, with
its error). What else it imports (mmengine, mmcv-lite, ...: ``requirements/gpu_check.txt``) it takes
from the node where the node has it, else from the wheels, which it unpacks into a folder beside
them (``wheels/.unpacked-*``; the temp dir where the checkout is read-only) put first on
``sys.path`` for this process only and deleted at the end: nothing is installed into the node's
environment. mmlinattn itself is imported from this checkout. It writes OUT.md and OUT.json:

a. every attention core of ``mmlinattn.core.ops.CORES``, forward and backward, in fp32 (TF32 off)
   and in fp16 and bf16 under autocast, against the float64 oracle (the core's explicit matrix);
b. every tiny backbone's training step under autocast, fp16 with a GradScaler and bf16: finite, and
   the gradient within a stated tolerance of the fp32 step's;
c. each core at the shapes the tiny backbones hand it (every stage, found by running the model: 224
   x 224 at batch 64 and 1333 x 800, padded to 1344 x 800, at batch 2) and over a 1k-64k token
   sweep, forward + backward in fp32 (TF32 off), fp32 with TF32 and bf16, beside the two-GEMM
   floor Q (K^T V) and SDPA at the same shapes; each core's fp32 and bf16 output against float64
   at every shape; the no-autograd path in chunks of ``CHUNK_TOKENS`` and in one piece
   (``set_chunk_tokens``), with the device's default named;
d. each tiny backbone's last stage (no output norm) forward + backward beside the authors'
   ``forward_features`` (``--inline-repo``, ``--mala-repo``: clones of their repositories, whose
   files import timm and einops; fvcore, which has no wheel, is stood in for) and timm's Swin-T,
   fp32 and bf16;
e. ``torch.compile`` of each tiny backbone: it compiles, matches eager, and its time - after one
   probe compile with the same backend on the same device; where the backend cannot run here
   (torch < 2.3, no C compiler, no Python.h, no triton on CUDA, the probe failing) part e is
   skipped with the reason;
f. (``--detectors``) the detector and segmentor training steps of ``benchmark_step.py``, one
   config per task in fp32 and with ``--amp``, each in its own process group, and the GPU tests
   (pytest, where installed); only where mmdet, mmseg and mmcv's compiled CUDA ops import.

Parts a-e are sized to end within 5 minutes on one H100 (the planned budget is printed first; parts
c, d and e stop at theirs and say so). ``--device cpu --quick`` runs the same parts on the CPU at
small sizes (the test suite does this in a virtual environment holding only torch, numpy, PyYAML,
opencv and pillow); timings there are regression figures, not GPU ones. Every time is the median and
the minimum of enough repeats (CUDA events on CUDA). The report has each part's wall time and peak
memory (CUDA's peak allocation on CUDA, the process's peak RSS elsewhere).

Exit status: 0 when every correctness check holds (a part that cannot run here is skipped, with
the reason), 1 when one fails (the report names it), 2 when the command is refused or the node
lacks what the check needs (one line says what).
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
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
import types
import zipfile

sys.path.insert(0, osp.abspath(osp.join(osp.dirname(__file__), '..', '..')))  # for tools.workshop

ROOT = osp.abspath(osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))
WHEELS = osp.join(ROOT, 'wheels', 'gpu_check')
REQUIREMENTS = osp.join(ROOT, 'requirements', 'gpu_check.txt')
COMPLETE = '.complete'  # written by fetch once every download succeeded (the list's sha256 first)
#: what a device lease may carry of wheels/gpu_check/ (its limit is 64 MiB for the whole tree)
CARRY_LIMIT_MIB = 8
#: wheels that never belong in the carried folder: the node's own (compiled, large)
NODE_OWN = ('numpy', 'opencv', 'torch', 'pillow', 'pyyaml', 'triton', 'nvidia')
#: module -> the distribution a node provides it with (imported in a child process first)
NODE_MODULES = {'numpy': 'numpy', 'yaml': 'PyYAML', 'cv2': 'opencv-python-headless',
                'PIL': 'pillow'}
#: modules the wheels bring where the node lacks them
WHEEL_MODULES = ('mmengine', 'mmcv')
DEVICE_CHOICES = 'cpu, cuda or cuda:N'

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
#: part -> (full size on a GPU, --quick); sizes are (batch, (H, W))
SIZES = {
    'core_n': (1024, 196),
    # c: the backbones' core calls at these inputs; 1333 x 800 padded to 32 as mmdet does
    'core_inputs': ([(64, (224, 224)), (2, (800, 1344))], [(2, (64, 64))]),
    # c: the token sweep, (tokens, batch, heads, head dim): batch x heads x tokens = 2^20
    'sweep': ([(n, 2 ** 20 // n // 8, 8, 64) for n in (1024, 4096, 16384, 65536)],
              [(512, 2, 2, 32)]),
    'step': ((2, 224), (2, 64)),
    'bench': ([(64, (224, 224)), (2, (800, 1344))], [(2, (32, 32))]),
    'compile': ((8, 224), (1, 64)),
}
#: c: no fp32 SDPA nor softmax core above this many tokens (quadratic: minutes at 64k)
QUADRATIC_FP32_MAX = 16384
#: planned seconds of parts a-e on one H100 (c, d and e stop at theirs)
BUDGET_S = {'cores': 15, 'amp_steps': 20, 'core_speed': 110, 'backbone_speed': 60, 'compile': 90}
#: part letters -> names
PARTS = {'a': 'cores', 'b': 'amp_steps', 'c': 'core_speed', 'd': 'backbone_speed', 'e': 'compile',
         'f': 'detectors'}


def tool_error(msg: str, code: int = 2) -> int:
    """One line on stderr (``gpu_check.py: error: ...``); returns the exit status."""
    print(f'gpu_check.py: error: {msg}', file=sys.stderr, flush=True)
    return code


# --------------------------------------------------------------------------------------------------
# wheels: fetch (networked machine) and unpack (node)
# --------------------------------------------------------------------------------------------------
def read_requirements(path=REQUIREMENTS):
    """The requirement strings of requirements/gpu_check.txt (pure-Python wheels)."""
    with open(path) as f:
        return [s for s in (line.strip() for line in f) if s and not s.startswith('#')]


def carry_problems(folder: str):
    """What is wrong with ``folder`` as the wheels a device lease carries: over
    :data:`CARRY_LIMIT_MIB`, a compiled wheel, one of the node's own (numpy, opencv, torch, ...)."""
    problems = []
    wheels = sorted(f for f in os.listdir(folder) if f.endswith('.whl'))
    total = sum(osp.getsize(osp.join(folder, f)) for f in wheels)
    if total > CARRY_LIMIT_MIB * 2 ** 20:
        problems.append(f'{total / 2 ** 20:.1f} MiB of wheels, over the {CARRY_LIMIT_MIB} MiB a '
                        'lease carries')
    for f in wheels:
        dist = f.split('-', 1)[0].lower().replace('_', '-')
        if dist.startswith(NODE_OWN):
            problems.append(f'{f}: the node\'s own package, not carried')
        elif not f.endswith('-none-any.whl'):
            problems.append(f'{f}: a compiled wheel (only pure-Python ones are carried)')
    return problems


def fetch(args) -> int:
    """pip download of the listed wheels (no dependencies: the list is whole) into a folder beside
    ``--dest``, swapped in only when every download succeeded: an unreachable index leaves the
    wheels already there (and their ``.complete``) as they were."""
    dest = osp.abspath(args.dest)
    parent = osp.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    new = tempfile.mkdtemp(prefix='.fetch-', dir=parent)
    try:
        cmd = [sys.executable, '-m', 'pip', 'download', '--disable-pip-version-check', '--no-deps',
               '--only-binary=:all:', '-d', new, '--python-version', '3.10',
               '--implementation', 'py', '--platform', 'any', '--abi', 'none']
        cmd += (['-q'] if args.quiet else []) + \
            (['--index-url', args.index_url] if args.index_url else []) + read_requirements()
        if not args.quiet:
            print('+', ' '.join(cmd), flush=True)
        if subprocess.call(cmd) != 0:
            kept = osp.isfile(osp.join(dest, COMPLETE))
            return tool_error(f'pip download failed (above); {dest} is unchanged' +
                              (' (its earlier wheels are kept)' if kept else ''), 1)
        problems = carry_problems(new)
        if problems:
            return tool_error(f'requirements/gpu_check.txt gives wheels a lease cannot carry: '
                              f'{"; ".join(problems)}; {dest} is unchanged', 1)
        wheels = sorted(f for f in os.listdir(new) if f.endswith('.whl'))
        with open(REQUIREMENTS, 'rb') as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        with open(osp.join(new, COMPLETE), 'w') as f:  # tools/install.sh compares the digest
            f.write(f'sha256 {digest}\n' + '\n'.join(wheels) + '\n')
        os.makedirs(dest, exist_ok=True)
        for old in os.listdir(dest):  # no wheel of an earlier list stays beside the new ones
            if old.endswith('.whl') or old == COMPLETE:
                os.remove(osp.join(dest, old))
        for name in wheels + [COMPLETE]:  # .complete last: it says the set is whole
            os.replace(osp.join(new, name), osp.join(dest, name))
    finally:
        shutil.rmtree(new, ignore_errors=True)
    total = sum(osp.getsize(osp.join(dest, f)) for f in wheels)
    print(f'{len(wheels)} wheels, {total / 2 ** 20:.1f} MiB in {dest}')
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


def unpack_dir(wheels: str):
    """Where the wheels are unpacked: a new folder beside them (where the check runs, so a noexec
    temp dir does not matter), else in the temp dir (a read-only checkout)."""
    for where in (osp.dirname(osp.abspath(wheels)), None):
        try:
            if where is not None:
                os.makedirs(where, exist_ok=True)
            return tempfile.TemporaryDirectory(prefix='.unpacked-' if where else
                                               'mmlinattn-gpu-check-', dir=where)
        except OSError:
            continue
    raise OSError('no writable folder to unpack the wheels into (neither beside them nor TMPDIR)')


_IMPORT_PROBE = '''
import importlib, json, sys
res = {}
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
        res[m] = None
    except BaseException as e:
        res[m] = [type(e).__name__, (str(e).splitlines() or [''])[0][:300],
                  getattr(e, 'name', None)]
print(json.dumps(res))
'''


def import_problems(modules, path=()):
    """{module: why it does not import} for each of ``modules`` that fails a real import in a child
    process with ``path`` first on its ``sys.path`` (a module that is there but fails - cv2
    without libGL - is named with its error)."""
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(list(path) + [p for p in [env.get('PYTHONPATH')] if p])
    try:
        proc = subprocess.run([sys.executable, '-c', _IMPORT_PROBE, *modules], env=env,
                              capture_output=True, text=True, timeout=300)
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        tail = ' '.join((proc.stderr if 'proc' in locals() else '').split()[-30:])
        return {m: f'importing {", ".join(modules)} in a child python crashed or hung ({tail})'
                for m in modules}
    problems = {}
    for m, why in found.items():
        if why is None:
            continue
        kind, msg, missing = why
        if kind == 'ModuleNotFoundError' and missing and missing.split('.')[0] == m:
            problems[m] = None  # not there at all
        else:
            problems[m] = f'{kind}: {msg}'
    return problems


def explain_import_problems(problems, wheels):
    """One line per module that does not import: what and what to do. Where one of the node's
    own modules fails, only those are named (mmcv imports cv2, mmengine numpy: theirs follow)."""
    if any(m in NODE_MODULES for m in problems):
        problems = {m: why for m, why in problems.items() if m in NODE_MODULES}
    lines = []
    for m, why in problems.items():
        if m in NODE_MODULES:
            dist = NODE_MODULES[m]
            lines.append(
                f'this python ({sys.executable}) has no {m}; the check uses the node\'s own '
                f'{dist} (not carried as a wheel): install it there' if why is None else
                f'{m} is installed but does not import ({why}); the check uses the node\'s own '
                f'{dist}: repair it there'
                + (' (opencv-python needs libGL: opencv-python-headless does not)'
                   if m == 'cv2' else ''))
        elif why is None:
            lines.append(f'{m} is neither on this python nor among the wheels in {wheels}: they '
                         'belong there (gpu_check.py fetch on a machine with network, then copy '
                         'wheels/gpu_check/ along)')
        else:
            lines.append(f'{m} does not import ({why})')
    return lines


# --------------------------------------------------------------------------------------------------
# measuring
# --------------------------------------------------------------------------------------------------
def _sync(device):
    import torch
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


#: repeats of one timing: at least MIN_REPS, more up to MAX_REPS while under the target seconds
#: in all (TIMING: 0.1 s; the quick dry run sets 0.02)
MIN_REPS, MAX_REPS = 7, 50
TIMING = dict(target_s=0.1)


def timed(fn, device, min_reps=MIN_REPS, max_reps=MAX_REPS, target_s=None) -> dict:
    """``fn()``'s time in ms over repeats: ``ms`` the median, ``min_ms`` the minimum, ``reps`` how
    many (after one warm-up call, whose time sizes the repeats to about ``target_s`` in all).
    CUDA: CUDA events around each call; else perf_counter around each call."""
    import torch
    target_s = TIMING['target_s'] if target_s is None else target_s
    _sync(device)
    t = time.perf_counter()
    fn()  # warm-up; its time sizes the repeats
    _sync(device)
    first = time.perf_counter() - t
    reps = max(min_reps, min(max_reps, int(target_s / max(first, 1e-6))))
    times = []
    if device.type == 'cuda':
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(reps)]
        for a, b in pairs:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize(device)
        times = [a.elapsed_time(b) for a, b in pairs]
    else:
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return dict(ms=statistics.median(times), min_ms=min(times), reps=reps)


def timed_ms(fn, device, **kw) -> float:
    """The median of :func:`timed`."""
    return timed(fn, device, **kw)['ms']


def peak_mib(fn, device):
    """Peak CUDA memory ``fn()`` allocates above what was allocated before it (None on the CPU,
    whose allocator keeps no such count: ``fn`` is not called)."""
    import torch
    if device.type != 'cuda':
        return None
    _sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20


def rss_peak_mib() -> float:
    """This process's peak resident memory so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2 ** 20 if sys.platform == 'darwin' else 2 ** 10)


@contextlib.contextmanager
def part_stats(device, into: dict):
    """Wall time and peak memory of one part into ``into``: CUDA's peak allocation over the part
    where CUDA, else the process's peak RSS (since the process started: it never goes down)."""
    import torch
    cuda = device.type == 'cuda'
    if cuda:
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
    t = time.perf_counter()
    try:
        yield
    finally:
        if cuda:
            _sync(device)
        into['seconds'] = time.perf_counter() - t
        if cuda:
            into.update(peak_mib=torch.cuda.max_memory_allocated(device) / 2 ** 20,
                        peak_of='CUDA max_memory_allocated over the part')
        else:
            into.update(peak_mib=rss_peak_mib(), peak_of='process peak RSS so far (ru_maxrss)')


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


@contextlib.contextmanager
def tf32(on: bool):
    """TF32 matmuls and convolutions on or off inside (CUDA; nothing elsewhere)."""
    import torch
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


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


def build_backbone(kind, arch, device, **options):
    """Our tiny backbone (stochastic depth 0), the four stage maps unless ``options`` say else."""
    import torch

    from mmlinattn.core.registry import MODELS
    torch.manual_seed(0)
    cfg = dict(type=kind, arch=arch, drop_path_rate=0.0, out_indices=(0, 1, 2, 3))
    return MODELS.build(dict(cfg, **options)).to(device)


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


def sdpa_fn(device, dtype):
    """torch's SDPA over (..., h, N, d) inputs: flash attention alone for bf16 on CUDA, torch's
    own choice elsewhere (fp32 on CUDA: memory-efficient attention)."""
    import torch
    import torch.nn.functional as F
    ctx = contextlib.nullcontext
    if device.type == 'cuda' and dtype == torch.bfloat16:
        try:  # torch >= 2.3
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def ctx():
                return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        except ImportError:  # torch 2.1, 2.2
            def ctx():
                return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                                      enable_mem_efficient=False)

    def sdpa(q, k, v):
        q4, k4, v4 = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))  # windows: into the batch
        with ctx():
            out = F.scaled_dot_product_attention(q4, k4, v4)
        return out.reshape(*q.shape[:-1], v.shape[-1])
    return sdpa


def core_calls(kind, arch, device, hw):
    """The distinct core calls of one forward of our tiny backbone ``kind`` at an ``hw`` input,
    batch 1, found by running it (so the tokens, heads and head dim are the model's own): a list of
    dicts - core, the q / k / v shapes, stage (1-4, from the channels h x d among the model's
    ``embed_dims``), calls (blocks making it) and the first call's settings and context (RoPE
    tables, attention bias)."""
    import torch

    from mmlinattn.core.ops.cores import Core
    model = build_backbone(kind, arch, device).eval()
    dims = list(getattr(model, 'embed_dims', []) or [])
    found = {}
    run = Core.run

    def recording(self, q, k, v, bound, rope=None, attn_bias=None, dropout_p=0.):
        key = (self.name, tuple(q.shape), tuple(k.shape), tuple(v.shape))
        if key not in found:
            h, d = q.shape[-3], q.shape[-1]
            found[key] = dict(core=self.name, q=list(q.shape), k=list(k.shape), v=list(v.shape),
                              heads=h, head_dim=d, tokens=q.shape[-2], kv_tokens=k.shape[-2],
                              stage=dims.index(h * d) + 1 if h * d in dims else None, calls=0,
                              bound=dict(bound), rope=rope, attn_bias=attn_bias)
        found[key]['calls'] += 1
        return run(self, q, k, v, bound, rope=rope, attn_bias=attn_bias, dropout_p=dropout_p)
    Core.run = recording
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, *hw, device=device))
    finally:
        Core.run = run
    return sorted(found.values(), key=lambda c: (c['stage'] or 0, c['core']))


def _cast(obj, dtype):
    """Tensors in ``obj`` (a tensor, a tuple / list of them, None) cast to ``dtype``."""
    if isinstance(obj, (tuple, list)):
        return type(obj)(_cast(o, dtype) for o in obj)
    return obj.to(dtype) if hasattr(obj, 'to') and obj.is_floating_point() else obj


def chunk_api():
    """(chunk_tokens(device) or None, set_chunk_tokens or None, CHUNK_TOKENS) of the cores'
    no-autograd path (``mmlinattn.core.ops.attention``; the functions came with the chunk length
    by device)."""
    from mmlinattn.core.ops import attention
    return (getattr(attention, 'chunk_tokens', None), getattr(attention, 'set_chunk_tokens', None),
            getattr(attention, 'CHUNK_TOKENS', None))


@contextlib.contextmanager
def chunk_tokens(device, n):
    """The cores' no-autograd chunk length on ``device`` set to ``n`` inside (None: one piece),
    through ``set_chunk_tokens``; before it existed, ``CHUNK_TOKENS`` itself (every device)."""
    from mmlinattn.core.ops import attention
    _, setter, _ = chunk_api()
    if setter is not None:
        old = setter(device.type, n)
        try:
            yield
        finally:
            setter(device.type, old)
        return
    saved = attention.CHUNK_TOKENS
    attention.CHUNK_TOKENS = 1 << 40 if n is None else n
    try:
        yield
    finally:
        attention.CHUNK_TOKENS = saved


def precisions(device):
    """c's precisions: fp32 with TF32 off, fp32 with TF32 on (CUDA only), bf16 inputs."""
    return ('fp32', 'tf32', 'bf16') if device.type == 'cuda' else ('fp32', 'bf16')


def bench_core(device, label, name, batch, call, deadline=None, only=None):
    """One core at one shape (``call``: as :func:`core_calls` gives, the batch set to ``batch``):
    forward + backward time of the core, the two-GEMM floor and SDPA in each precision, and the
    core's output against float64 (``only``: these precisions and cases alone, e.g.
    ``{'bf16', 'core'}``). Returns (speed rows, accuracy rows)."""
    import torch

    from mmlinattn.core.ops import CORES
    core = CORES[name]
    shapes = [[batch] + list(call[x][1:]) for x in ('q', 'k', 'v')]
    n = max(call['tokens'], call['kv_tokens'])
    g = torch.Generator(device).manual_seed(0)
    base = [torch.randn(*s, generator=g, device=device) for s in shapes]
    gout = torch.randn(*shapes[0][:-1], shapes[2][-1], generator=g, device=device)
    speed, accuracy = [], []
    shape = dict(label, core=name, batch=batch, heads=call['heads'], head_dim=call['head_dim'],
                 tokens=call['tokens'], kv_tokens=call['kv_tokens'])

    def run_core(dtype):
        ctx = dict(rope=_cast(call['rope'], torch.float64) if dtype == torch.float64 else
                   call['rope'], attn_bias=_cast(call['attn_bias'], dtype))
        return lambda q, k, v: core.run(q, k, v, call['bound'], **ctx)

    def fwd_bwd(fn, xs):
        leaves = [t.detach().requires_grad_() for t in xs]
        out = fn(*leaves)
        out.backward(gout.to(out.dtype))

    over = False
    for prec in precisions(device):
        if only and prec not in only:
            continue
        dtype = torch.bfloat16 if prec == 'bf16' else torch.float32
        xs = [t.to(dtype) for t in base]
        row = dict(shape, precision=prec)
        cases = {'core': run_core(dtype), 'floor': floor, 'sdpa': sdpa_fn(device, dtype)}
        cases = {k: v for k, v in cases.items() if not only or k in only}
        with tf32(prec == 'tf32'):
            for case, fn in cases.items():
                if deadline is not None and time.perf_counter() > deadline:
                    row[f'{case}_error'] = 'skipped: over part c\'s budget'
                    over = True
                    continue
                quadratic = case == 'sdpa' or name == 'softmax' and case == 'core'
                if quadratic and prec != 'bf16' and n > QUADRATIC_FP32_MAX:
                    row[f'{case}_error'] = (f'skipped: quadratic in fp32 above '
                                            f'{QUADRATIC_FP32_MAX} tokens')
                    continue
                try:
                    t = timed(lambda fn=fn: fwd_bwd(fn, xs), device)
                    row.update({f'{case}_ms': t['ms'], f'{case}_min_ms': t['min_ms'],
                                f'{case}_reps': t['reps']})
                    if device.type == 'cuda':
                        row[f'{case}_mib'] = peak_mib(lambda fn=fn: fwd_bwd(fn, xs), device)
                except Exception as err:
                    row[f'{case}_error'] = _why(err, 160)
            for case in ('floor', 'sdpa'):
                if 'core_ms' in row and f'{case}_ms' in row:
                    row[f'vs_{case}'] = row['core_ms'] / row[f'{case}_ms']
            # the no-autograd path in chunks of CHUNK_TOKENS and in one piece (and which of the
            # two this device runs by default)
            getter, _, chunk = chunk_api()
            if prec == 'bf16' and chunk and n > chunk and name != 'softmax' and not over:
                fwd = run_core(dtype)
                try:
                    with torch.no_grad():
                        with chunk_tokens(device, chunk):
                            row['fwd_chunked_ms'] = timed(lambda: fwd(*xs), device)['ms']
                        with chunk_tokens(device, None):
                            row['fwd_unchunked_ms'] = timed(lambda: fwd(*xs), device)['ms']
                    row['chunk_tokens'] = chunk
                    default = getter(device) if getter else chunk
                    row['chunk_default'] = 'one piece' if default is None else default
                except Exception as err:
                    row['chunk_error'] = _why(err, 160)
            # accuracy: the core's output against the same core in float64 on the same inputs
            # (for bf16: the bf16-rounded inputs), no-autograd path; the quadratic softmax core up
            # to 4096 tokens, one image of the batch
            if prec != 'tf32' and (name != 'softmax' or n <= 4096) and not over:
                one = [t[:1] for t in xs]
                acc = dict(shape, precision=prec, limit=CORE_TOL[prec])
                try:
                    with torch.no_grad():
                        want = run_core(torch.float64)(*[t.double() for t in one])
                        got = run_core(dtype)(*one)
                    acc['err'] = rel_err(got, want)
                    acc['ok'] = bool(torch.isfinite(got).all()) and acc['err'] <= acc['limit']
                except Exception as err:
                    acc.update(ok=False, error=_why(err, 160))
                accuracy.append(acc)
        speed.append(row)
    return speed, accuracy


def part_core_speed(device, small, log, budget_s=None):
    """c. Each core at the shapes our tiny backbones give it and over a token sweep, forward +
    backward in fp32 / TF32 / bf16, beside the two-GEMM floor and SDPA; its accuracy against
    float64 at each shape. Stops timing at ``budget_s`` (the rows say so)."""
    from mmlinattn.core.ops import CORES
    deadline = time.perf_counter() + budget_s if budget_s else None
    groups, speed, accuracy, errors = [], [], [], []
    for kind, arch in FAMILIES:
        for batch, hw in SIZES['core_inputs'][small]:
            label = dict(source=f'{kind}-{arch}', input=f'{batch}x{hw[0]}x{hw[1]}')
            try:
                for call in core_calls(kind, arch, device, hw):
                    groups.append((dict(label, stage=call['stage'], calls=call['calls']),
                                   call['core'], batch, call))
            except Exception as err:  # the report names it
                errors.append(dict(label, error=_why(err)))
                log(f"c. {kind} {label['input']}: {_why(err)}")
    for n, b, h, d in SIZES['sweep'][small]:
        for name, core in CORES.items():
            call = dict(q=[b, h, n, d], k=[b, h, n, d], v=[b, h, n, d], heads=h, head_dim=d,
                        tokens=n, kv_tokens=n, bound=core.bind(scale=d ** -0.5), rope=None,
                        attn_bias=None)
            groups.append((dict(source='sweep', input=f'{b}x{h}x{n}x{d}', stage=None,
                                calls=None), name, b, call))
    for label, name, batch, call in groups:
        rows, acc = bench_core(device, label, name, batch, call, deadline)
        speed += rows
        accuracy += acc
        log(f"c. {label['source']} {label['input']} stage {label['stage']} {name} "
            f"(B {batch}, h {call['heads']}, N {call['tokens']}, d {call['head_dim']}): " +
            ', '.join(f"{r['precision']} {_f(r.get('core_ms'))} ms ({_f(r.get('vs_floor'))}x "
                      'floor)' for r in rows))
    return dict(rows=speed, accuracy=accuracy, errors=errors,
                over_budget=any('budget' in str(v) for r in speed for v in r.values()))


@contextlib.contextmanager
def fvcore_stand_in():
    """A stand-in for fvcore while the authors' file is imported, where fvcore is not installed
    (it has no wheel; their files import its FLOP counter, which the model code never calls): a
    module ``fvcore`` (and ``fvcore.nn``) whose every name is a function that raises. Taken out of
    ``sys.modules`` again afterwards."""
    if _importable('fvcore'):
        yield
        return

    def stand_in(name):
        def missing(*args, **kwargs):
            raise RuntimeError(f'fvcore.{name}: fvcore is not installed (gpu_check.py stood in '
                               'for it to import the authors\' model file)')
        return missing
    mods = {}
    for name in ('fvcore', 'fvcore.nn'):
        mod = types.ModuleType(name)
        mod.__getattr__ = lambda attr: stand_in(attr)  # PEP 562: `from fvcore.nn import X`
        mod.__path__ = []  # a package, so that `import fvcore.nn` finds the child here
        mods[name] = mod
    mods['fvcore'].nn = mods['fvcore.nn']
    sys.modules.update(mods)
    try:
        yield
    finally:
        for name, mod in mods.items():
            if sys.modules.get(name) is mod:
                del sys.modules[name]


class _Features:
    """A classifier seen through its ``forward_features`` (the authors' and timm's), as ours is a
    backbone (built as a torch Module subclass on first use: torch is imported late)."""

    @staticmethod
    def wrap(model):
        import torch

        class Features(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, x):
                return self.model.forward_features(x)
        return Features(model) if hasattr(model, 'forward_features') else model


def authors_repo_problem(kind_or_family, repo):
    """Why ``repo`` is not a clone holding the authors' model file for this family, or None."""
    from tools.workshop.authors_code import SOURCES
    family = AUTHORS[kind_or_family][0] if kind_or_family in AUTHORS else kind_or_family
    rel = SOURCES[family][1]
    if not osp.isfile(osp.join(repo, rel)):
        return f'{repo} has no {rel}'
    return None


def load_authors(kind, args):
    """The authors' tiny classifier from their clone (their constructor and arguments, stochastic
    depth 0 as ours) through its ``forward_features``, or (None, why not)."""
    from tools.workshop.authors_code import build_authors
    family, repo_opt = AUTHORS[kind]
    repo = getattr(args, repo_opt)
    if not repo:
        return None, f'--{repo_opt.replace("_", "-")} not given'
    for req in ('timm', 'einops'):  # what their files import (fvcore is stood in for)
        if not _importable(req):
            return None, f'{req} not installed'
    try:
        with fvcore_stand_in():
            model = build_authors(family, 'tiny', repo, drop_path=0.0)
        return _Features.wrap(model), None
    except Exception as err:  # another commit of their code, ...
        return None, _why(err, 200)


def load_timm_swin(hw):
    if not _importable('timm'):
        return None, 'timm not installed'
    try:
        import timm
        return _Features.wrap(timm.create_model('swin_tiny_patch4_window7_224', img_size=hw)), None
    except Exception as err:
        return None, f'timm swin_tiny: {_why(err)}'


def part_backbone_speed(device, small, args, log, budget_s=None):
    """d. Forward + backward time and peak memory of each tiny backbone's last stage (no output
    norm: the work of the authors' ``forward_features``), beside the authors' code and timm's
    Swin-T (at the classification size: their classifiers are built for 224 x 224), fp32 and
    bf16."""
    import torch
    deadline = time.perf_counter() + budget_s if budget_s else None
    rows = []
    for batch, hw in SIZES['bench'][small]:
        x = torch.randn(batch, 3, *hw).to(device)
        classification = hw == SIZES['bench'][small][0][1]
        models = {}
        for kind, arch in FAMILIES:
            models[f'{kind}-{arch}'] = (
                lambda k=kind, a=arch: build_backbone(k, a, device, out_indices=(3,),
                                                      out_norm=False), 'ours')
            if classification:
                models[f'{kind}-{arch} (authors)'] = (lambda k=kind: load_authors(k, args),
                                                      'authors')
        if classification:
            models['Swin-T (timm)'] = (lambda: load_timm_swin(hw), 'timm')
        for label, (make, who) in models.items():
            row = dict(model=label, who=who, batch=batch, size=f'{hw[0]}x{hw[1]}')
            if deadline is not None and time.perf_counter() > deadline:
                row['skipped'] = 'over part d\'s budget'
                rows.append(row)
                continue
            try:
                made = make()
                model, why = (made, None) if who == 'ours' else made
                if model is None:
                    row['skipped'] = why
                    rows.append(row)
                    log(f"d. {label} {batch}x{row['size']}: skipped ({why})")
                    continue
                model = model.to(device).train()
                made = None
                for prec in ('fp32', 'bf16'):
                    def step(model=model, prec=prec):
                        model.zero_grad(set_to_none=True)
                        with autocast(device, prec):
                            out = model(x)
                        _loss(out if isinstance(out, (tuple, list)) else [out]).backward()
                    # a bf16 step on a CPU without bf16 units takes seconds: 3 repeats there
                    t = timed(step, device, min_reps=3 if small else 5, max_reps=20,
                              target_s=10 * TIMING['target_s'])
                    row.update({f'{prec}_ms': t['ms'], f'{prec}_min_ms': t['min_ms'],
                                f'{prec}_reps': t['reps']})
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
            log(f"d. {label} {batch}x{row['size']}: " + (
                row.get('error') or f"fp32 {row['fp32_ms']:.1f} ms, bf16 {row['bf16_ms']:.1f} ms"))
    for row in rows:  # ours against the authors' at the same size
        theirs = next((r for r in rows if r['model'] == row['model'] + ' (authors)'
                       and r['size'] == row['size'] and 'bf16_ms' in r), None)
        if theirs and 'bf16_ms' in row and 'error' not in row and 'error' not in theirs:
            row['speedup_vs_authors'] = theirs['fp32_ms'] / row['fp32_ms']
            row['bf16_speedup_vs_authors'] = theirs['bf16_ms'] / row['bf16_ms']
    return rows


def _c_compiler():
    for name in (os.environ.get('CC'), 'cc', 'gcc', 'clang'):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def probe_compile(device, backend):
    """One tiny ``torch.compile`` with ``backend`` on ``device`` (a matmul and a GELU), checked
    against eager; raises where the backend cannot run here."""
    import torch
    import torch._dynamo

    def fn(x, w):
        return torch.nn.functional.gelu(x @ w).sum(-1)
    g = torch.Generator().manual_seed(0)
    x, w = (torch.randn(*s, generator=g).to(device) for s in ((16, 32), (32, 32)))
    torch._dynamo.reset()
    try:
        got = torch.compile(fn, backend=backend)(x, w)
        _sync(device)
    finally:
        torch._dynamo.reset()
    if not torch.allclose(got, fn(x, w), rtol=1e-3, atol=1e-3):
        raise RuntimeError('the probe\'s compiled output differs from eager')


def compile_unavailable(device, backend):
    """Why ``torch.compile(backend=backend)`` cannot run on ``device`` here, or None: torch < 2.3
    (whose dynamo fails on our backbones), inductor without a C compiler, Python.h or (CUDA)
    triton, and last the probe compile itself."""
    import torch
    if not hasattr(getattr(torch, 'compiler', None), 'is_compiling'):
        return (f'torch {torch.__version__}: dynamo before torch 2.3 cannot trace these backbones '
                '(torch >= 2.3 compiles them)')
    if backend == 'inductor':
        if device.type == 'cuda' and not _importable('triton'):
            return 'inductor needs triton on a GPU, and this python has none'
        if not _c_compiler():
            return 'inductor needs a C compiler (cc, gcc or clang on PATH, or CC), and none is here'
        include = sysconfig.get_paths().get('include') or ''
        if not osp.isfile(osp.join(include, 'Python.h')):
            return (f'inductor builds Python extensions and needs Python.h, which is not in '
                    f'{include or "this python"} (the python3-dev package)')
    try:
        probe_compile(device, backend)
    except Exception as err:
        return f'the probe torch.compile(backend={backend!r}) on {device.type} failed: {_why(err)}'
    return None


def part_compile(device, small, backend, log, budget_s=None):
    """e. torch.compile of each tiny backbone (``backend``): compiles, matches eager, its time;
    skipped with the reason where the backend cannot run here (:func:`compile_unavailable`); a
    backbone not begun within ``budget_s`` is skipped, saying so."""
    import torch
    deadline = time.perf_counter() + budget_s if budget_s else None
    batch, size = SIZES['compile'][small]
    why = compile_unavailable(device, backend)
    if why:
        log(f'e. skipped: {why}')
        return [dict(backbone=f'{k}-{a}', batch=batch, size=size, backend=backend, ok=True,
                     skipped=why[:300]) for k, a in FAMILIES]
    rows = []
    for kind, arch in FAMILIES:
        row = dict(backbone=f'{kind}-{arch}', batch=batch, size=size, backend=backend)
        if deadline is not None and time.perf_counter() > deadline:
            rows.append(dict(row, ok=True, skipped='over part e\'s budget'))
            log(f'e. {kind}: skipped (over part e\'s budget)')
            continue
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
                row['eager_ms'] = timed_ms(lambda: model(x), device, min_reps=5, max_reps=20)
                row['compiled_ms'] = timed_ms(lambda: compiled(x), device, min_reps=5,
                                              max_reps=20)
            row['ok'] = row['err'] <= COMPILE_TOL
        except Exception as err:
            row.update(ok=False, error=_why(err, 200))
        rows.append(row)
        log(f'e. {kind}: ' + (row.get('error') or f"compile {row['compile_s']:.1f} s, "
                                                  f"err {row['err']:.1e}, eager "
                                                  f"{row['eager_ms']:.1f} ms, compiled "
                                                  f"{row['compiled_ms']:.1f} ms"))
    return rows


def run_child(cmd, timeout, **kw):
    """``cmd`` in its own process group (a new session); on timeout the whole group is killed, so
    no grandchild stays on the GPU. Returns (returncode or None on timeout, output, seconds)."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kw)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.perf_counter() - t
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, (out or '') + f'\ntimed out after {timeout} s (process group killed)', \
            time.perf_counter() - t
    finally:
        with contextlib.suppress(ProcessLookupError):  # what the child left behind, if anything
            os.killpg(proc.pid, signal.SIGKILL)


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


#: part f: benchmark_step.py's training step of one config per task, fp32 and --amp (fp16 on
#: CUDA: benchmark_step.py has no bf16 switch), one process each
DETECTOR_CONFIGS = ('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py',
                    'configs/mavit/upernet_mavit-t_160k_ade20k-512x512.py')
#: part f also runs the tests that skip without a GPU (the --amp training steps against fp32)
GPU_TESTS = ('tests/test_amp.py',)
CHILD_TIMEOUT_S = 300


def part_detectors(device, small, log, enabled=True):
    """f. benchmark_step.py's detector and segmentor steps, and the GPU tests, where they can
    run: with ``--detectors``, on CUDA, with mmdet, mmseg and mmcv's compiled CUDA ops."""
    if not enabled:
        why = 'not asked for (--detectors runs it)'
    elif device.type != 'cuda':
        why = 'the CPU dry run (--device cpu) measures no detector'
    else:
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
                rc, output, seconds = run_child(cmd, CHILD_TIMEOUT_S, env=env)
                row = dict(config=config, amp='fp16' if amp else 'fp32', rc=rc, seconds=seconds)
                if rc == 0 and osp.exists(out + '.json'):
                    with open(out + '.json') as f:
                        row['result'] = json.load(f)
                else:
                    row['tail'] = output[-600:]
                rows.append(row)
                log(f'f. {config} {row["amp"]}: exit {rc}, {seconds:.0f} s')
        if _importable('pytest'):
            rc, output, seconds = run_child([sys.executable, '-m', 'pytest', '-q', *GPU_TESTS],
                                            2 * CHILD_TIMEOUT_S, cwd=ROOT, env=env)
            rows.append(dict(config=' '.join(GPU_TESTS), amp=None, rc=rc, seconds=seconds,
                             tail=output[-600:]))
        else:
            rows.append(dict(config=' '.join(GPU_TESTS), amp=None, rc=0, seconds=0.0,
                             skipped='pytest is not installed'))
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
        errs += [r['err'] for r in (parts.get('core_speed') or {}).get('accuracy', [])
                 if r['precision'] == prec and 'err' in r]
        worst = max(errs) if errs else None
        rows.append((f'every core in {prec} within {limit:g} of float64', worst,
                     None if worst is None else worst <= limit))
    steps = [r for r in parts.get('amp_steps') or [] if not r.get('skipped')]
    rows.append(('AMP training finite for every backbone, fp16 and bf16',
                 f"{sum(bool(r.get('finite')) for r in steps)} / {len(steps)}",
                 all(r.get('finite') for r in steps) if steps else None))
    speed = (parts.get('core_speed') or {}).get('rows', [])
    ratios = [r['vs_floor'] for r in speed if r['tokens'] >= 4096 and r['core'] != 'softmax'
              and r['precision'] == 'bf16' and 'vs_floor' in r]
    rows.append(('linear cores (bf16 inputs) at most 1.5x the bf16 two-GEMM floor at >= 4k tokens',
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


def _ms(row, key):
    """'median (min)' of a timing, or why it is missing."""
    if f'{key}_ms' in row:
        return f"{row[f'{key}_ms']:.3g} ({row[f'{key}_min_ms']:.3g})"
    return row.get(f'{key}_error', '-')


def markdown(report) -> str:
    env, parts, stats = report['environment'], report['parts'], report['part_stats']
    lines = [f"# GPU check: {env['device_name']}", '',
             f"torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, python "
             f"{env['python']}, {env['when']}; {_f(report['seconds'], '.0f')} s in all. "
             f"From the wheels: {', '.join(env['unpacked']) or 'nothing (the node had all)'}.", '',
             f"**{'PASS' if report['ok'] else 'FAIL'}**: " + (
                 'every correctness check holds.' if report['ok'] else
                 'failed: ' + '; '.join(report['failures'])), '']
    skipped = report.get('skipped_parts') or []
    if skipped:
        lines += ['Skipped (not failures): ' + '; '.join(skipped) + '.', '']
    if env['device'] == 'cpu':
        lines += ['CPU dry run: timings are regression figures of this CPU, not GPU ones.', '']
    lines += ['## Parts: wall time and peak memory', '',
              f"Planned for parts a-e on one H100: {sum(BUDGET_S.values())} s "
              f"({', '.join(f'{k} {v} s' for k, v in BUDGET_S.items())}).", '',
              '| part | seconds | peak MiB | peak of |', '|---|---|---|---|']
    for name, s in stats.items():
        lines.append(f"| {name} | {_f(s.get('seconds'), '.1f')} | {_f(s.get('peak_mib'), '.0f')} "
                     f"| {s.get('peak_of', '-')} |")
    lines += ['', '## Targets', '', '| target | measured (worst) | met |', '|---|---|---|']
    for what, value, met in targets(parts):
        lines.append(f"| {what} | {_f(value)} | {'-' if met is None else 'yes' if met else 'NO'} |")
    lines += ['', '## a. Attention cores against float64 (forward and backward)', '',
              "Largest error relative to the float64 output's (gradients': each input's) "
              f"largest value; limits {CORE_TOL}.", '',
              '| core | precision | tokens | output | gradients | ok |',
              '|---|---|---|---|---|---|']
    for r in parts.get('cores') or []:
        lines.append(f"| {r['core']} | {r['precision']} | {r['tokens']} | {_f(r.get('out_err'))} | "
                     f"{_f(r.get('grad_err'))} | {_verdict(r)} |")
    lines += ['', '## b. Backbone training step under autocast against fp32', '',
              f"||g - g_fp32|| / ||g_fp32|| over every parameter; limits {GRAD_TOL}.", '',
              '| backbone | precision | input | finite | gradient error | loss error | ok |',
              '|---|---|---|---|---|---|---|']
    for r in parts.get('amp_steps') or []:
        lines.append(f"| {r['backbone']} | {r['precision']} | {r['batch']}x{r['size']}^2 | "
                     f"{r.get('finite', '-')} | {_f(r.get('grad_err'))} | {_f(r.get('loss_err'))} "
                     f"| {_verdict(r)} |")
    c = parts.get('core_speed') or {}
    timer = 'CUDA events' if env['device'] == 'cuda' else 'perf_counter'
    lines += ['', '## c. Cores at our backbones\' shapes and over a token sweep (forward + '
              'backward)', '',
              'Shapes: each core call of one forward of the tiny backbone at the input (batch x H '
              'x W), found by running the model; stage 1-4; B = the batch dimension the core sees '
              '(windows: batch x windows), h heads, N tokens (keys: N_kv), d head dim. '
              'Precisions: fp32 with TF32 off, fp32 with TF32 on (CUDA only), bf16 inputs (what '
              'autocast hands a core; the linear cores compute in fp32). The floor is Q (K^T V) '
              'and SDPA torch\'s scaled_dot_product_attention (flash in bf16 on CUDA) at the same '
              'shape and precision. Times in ms: median (min) of at least '
              f'{MIN_REPS} repeats after a warm-up ({timer}); '
              'x floor / x SDPA: the core\'s median over theirs.', '',
              '| source | input | stage | core | B x h x N x d (N_kv) | precision | core | floor | '
              'SDPA | x floor | x SDPA | fwd chunked / one piece |',
              '|---|---|---|---|---|---|---|---|---|---|---|---|']
    for r in c.get('rows', []):
        chunk = (f"{r['fwd_chunked_ms']:.3g} / {r['fwd_unchunked_ms']:.3g} (chunk "
                 f"{r['chunk_tokens']}; default here: {r['chunk_default']})"
                 if 'fwd_unchunked_ms' in r else r.get('chunk_error', '-'))
        lines.append(f"| {r['source']} | {r['input']} | {_f(r.get('stage'))} | {r['core']} | "
                     f"{r['batch']}x{r['heads']}x{r['tokens']}x{r['head_dim']} "
                     f"({r['kv_tokens']}) | {r['precision']} | {_ms(r, 'core')} | "
                     f"{_ms(r, 'floor')} | {_ms(r, 'sdpa')} | {_f(r.get('vs_floor'))} | "
                     f"{_f(r.get('vs_sdpa'))} | {chunk} |")
    for e in c.get('errors', []):
        lines.append(f"| {e['source']} | {e['input']} | | | {e['error']} | | | | | | | |")
    lines += ['', 'Accuracy: each core\'s output (no-autograd path, one image of the batch) '
              'against the same core in float64 on the same inputs (bf16: the bf16-rounded '
              f'inputs); largest error relative to the largest float64 value; limits {CORE_TOL}.',
              '', '| source | input | stage | core | B x h x N x d | precision | error | limit '
              '| ok |',
              '|---|---|---|---|---|---|---|---|---|']
    for r in c.get('accuracy', []):
        lines.append(f"| {r['source']} | {r['input']} | {_f(r.get('stage'))} | {r['core']} | "
                     f"1x{r['heads']}x{r['tokens']}x{r['head_dim']} | {r['precision']} | "
                     f"{_f(r.get('err'))} | {r['limit']:g} | {_verdict(r)} |")
    lines += ['', '## d. Backbones, forward + backward (loss: mean square of the outputs)', '',
              'Ours: the backbone up to its last stage, without the output norm (out_indices=(3,), '
              'out_norm=False); the authors\' and timm\'s: their classifiers\' forward_features '
              '(their final norm, no classifier; MALA\'s keeps its 1x1 projection to 2048 '
              'channels), at the classification size only. ms: median (min).',
              '', '| model | input | fp32 ms | bf16 ms | fp32 MiB | bf16 MiB | bf16/fp32 memory | '
              'ours vs authors (fp32, bf16) |', '|---|---|---|---|---|---|---|---|']
    for r in parts.get('backbone_speed') or []:
        if 'bf16_mib' not in r or 'error' in r:
            why = f"skipped: {r['skipped']}" if r.get('skipped') else r.get('error')
            lines.append(f"| {r['model']} | {r['batch']}x{r['size']} | {why} | | | | | |")
            continue
        vs = (f"{r['speedup_vs_authors']:.2f}x, {r['bf16_speedup_vs_authors']:.2f}x"
              if 'speedup_vs_authors' in r else '')
        lines.append(f"| {r['model']} | {r['batch']}x{r['size']} | {_ms(r, 'fp32')} | "
                     f"{_ms(r, 'bf16')} | {_f(r['fp32_mib'], '.0f')} | "
                     f"{_f(r['bf16_mib'], '.0f')} | {_f(r.get('bf16_mem_ratio'), '.2f')} | {vs} |")
    comp = parts.get('compile') or []
    backends = sorted({r.get('backend', '') for r in comp})
    lines += ['', f"## e. torch.compile (inference, fp32, backend {', '.join(backends)})", '',
              'After one probe compile with the same backend on the same device; where the '
              'backend cannot run here the rows are skipped with the reason (not a failure). '
              f'Largest error relative to eager\'s largest output value; limit {COMPILE_TOL}.', '',
              '| backbone | input | first call s | error | eager ms | compiled ms | ok |',
              '|---|---|---|---|---|---|---|']
    for r in comp:
        lines.append(f"| {r['backbone']} | {r['batch']}x{r['size']}^2 | "
                     f"{_f(r.get('compile_s'), '.1f')} | {_f(r.get('err'), '.1e')} | "
                     f"{_f(r.get('eager_ms'), '.1f')} | {_f(r.get('compiled_ms'), '.1f')} | "
                     f"{_verdict(r)} |")
    det = parts.get('detectors') or dict(skipped='not run', rows=[])
    lines += ['', '## f. Detector and segmentor steps (benchmark_step.py)', '']
    if det['skipped']:
        lines.append(f"Skipped: {det['skipped']}.")
    for r in det['rows']:
        lines += [f"`{r['config']}` {r['amp'] or ''}: exit {r['rc']}, {_f(r.get('seconds'), '.0f')}"
                  ' s', '', '```', json.dumps(r['result'], indent=1)[:1500] if 'result' in r
                  else r.get('tail') or r.get('skipped', ''), '```']
    return '\n'.join(lines) + '\n'


def environment(device, unpacked, target=None):
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
                python=platform.python_version(), unpacked=unpacked, unpacked_into=target,
                when=time.strftime('%Y-%m-%d %H:%M'))


def check_args(args):
    """Refusals before any work, as one line: an unknown device, a repository option that names
    no folder. Returns the message or None."""
    if not re.fullmatch(r'cpu|cuda(:\d+)?', args.device):
        return f'--device {args.device!r}: choose {DEVICE_CHOICES}'
    for opt in ('inline_repo', 'mala_repo'):
        repo = getattr(args, opt)
        if repo is not None and not osp.isdir(repo):
            return (f'--{opt.replace("_", "-")} {repo}: no such folder; give the root of a clone '
                    f'of {"LeapLabTHU/InLine" if opt == "inline_repo" else "qhfan/MALA"}, or '
                    'leave the option out (part d then skips the authors\' rows)')
    parts = set(args.parts)
    if not parts or parts - set('abcde'):
        return f'--parts {args.parts!r}: letters of abcde (part f is --detectors)'
    return None


def run(args) -> int:
    start = time.perf_counter()
    refused = check_args(args)
    if refused:
        return tool_error(refused)
    saved_path, saved_term = list(sys.path), signal.getsignal(signal.SIGTERM)
    with contextlib.suppress(ValueError):  # a kill (SIGTERM) still deletes the unpacked wheels
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        try:
            unpack = unpack_dir(args.wheels)
        except OSError as err:
            return tool_error(str(err))
        return _unpacked_run(args, start, unpack, saved_path)
    finally:
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGTERM, saved_term)


def _unpacked_run(args, start, unpack, saved_path) -> int:
    with unpack as target:
        unpacked = unpack_missing(args.wheels, target)  # before torch, which looks for numpy
        problems = import_problems(list(NODE_MODULES) + list(WHEEL_MODULES), [target, ROOT])
        if problems:
            for line in explain_import_problems(problems, args.wheels):
                tool_error(line)
            return 2
        sys.path[:0] = [target, ROOT]
        try:
            return _run(args, start, unpacked, target)
        finally:
            sys.path[:] = saved_path


def _run(args, start, unpacked, target) -> int:
    import torch
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        return tool_error(f'no CUDA device visible to this torch ({torch.__version__}); '
                          '--device cpu runs the CPU dry run')
    try:
        import mmlinattn.core  # noqa: F401  (registers the backbones)
    except ImportError as err:
        return tool_error(f'mmlinattn does not import here ({err}); the wheels of '
                          f'requirements/gpu_check.txt belong in {args.wheels} '
                          '(gpu_check.py fetch on a machine with network)')
    for kind, (family, opt) in AUTHORS.items():  # the clones hold the authors' files
        repo = getattr(args, opt)
        why = repo and authors_repo_problem(family, repo)
        if why:
            return tool_error(f'--{opt.replace("_", "-")}: {why}; give the root of a clone of '
                              'the authors\' repository')
    no_tf32()
    small = args.quick
    TIMING['target_s'] = 0.02 if small else 0.1

    def log(msg):
        print(msg, flush=True)
    wanted = [PARTS[p] for p in 'abcde' if p in args.parts] + ['detectors']
    plan = {k: v for k, v in BUDGET_S.items() if k in wanted}
    log(f"planned on one H100: parts {''.join(p for p in 'abcde' if p in args.parts)} in "
        f"{sum(plan.values())} s ({', '.join(f'{k} {v} s' for k, v in plan.items())})"
        + ('; part f: up to 5 min per config' if args.detectors else '') +
        (' - this run: the quick dry-run sizes' if small else ''))
    budget = (lambda name: None) if small else BUDGET_S.get
    steps = {'cores': lambda: part_cores(device, small, log),
             'amp_steps': lambda: part_amp_steps(device, small, log),
             'core_speed': lambda: part_core_speed(device, small, log, budget('core_speed')),
             'backbone_speed': lambda: part_backbone_speed(device, small, args, log,
                                                           budget('backbone_speed')),
             'compile': lambda: part_compile(device, small, args.compile_backend, log,
                                             budget('compile')) if not args.no_compile else [],
             'detectors': lambda: part_detectors(device, small, log, args.detectors)}
    empty = {'core_speed': dict(rows=[], accuracy=[], errors=[]),
             'detectors': dict(skipped='crashed', rows=[])}
    parts, stats, failures = {}, {}, []
    for name in wanted:
        stats[name] = {}
        try:
            with part_stats(device, stats[name]):
                parts[name] = steps[name]()
        except Exception:  # the other parts still run
            failures.append(f'part {name} crashed: {traceback.format_exc().splitlines()[-1]}')
            parts[name] = empty.get(name, [])
    det = parts['detectors']
    failures += [f"detectors: {r['config']} {r['amp'] or ''} exit {r['rc']}"
                 for r in det['rows'] if r['rc'] != 0]
    for name in ('cores', 'amp_steps', 'compile'):
        failures += [f"{name}: {r.get('core') or r.get('backbone')} "
                     f"{r.get('precision', '')} {r.get('error', 'over its limit')}".strip()
                     for r in parts.get(name, []) if not r['ok']]
    failures += [f"core_speed: {r['core']} {r['precision']} at {r['source']} {r['input']} "
                 f"N={r['tokens']}: {r.get('error') or 'error %.2g over its limit' % r['err']}"
                 for r in parts.get('core_speed', {}).get('accuracy', []) if not r['ok']]
    skipped_parts = [f"{name}: {why}" for name, why in (
        ('compile', next((r['skipped'] for r in parts.get('compile', []) if r.get('skipped')),
                         None)),
        ('detectors', det['skipped'])) if why]
    report = dict(environment=environment(device, unpacked, target), parts=parts, part_stats=stats,
                  failures=failures, skipped_parts=skipped_parts, ok=not failures,
                  seconds=time.perf_counter() - start)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out + '.json', 'w') as f:
        json.dump(report, f, indent=1, default=str)
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
    f.add_argument('--index-url', help='pip\'s --index-url (default: pip\'s own)')
    f.add_argument('--quiet', action='store_true', help='pip download -q')
    r = sub.add_parser('run', help='run the check (the GPU node)')
    r.add_argument('--out', default=osp.join(ROOT, 'docs', 'benchmarks', 'gpu_check', 'report'),
                   help='OUT.md and OUT.json are written')
    r.add_argument('--device', default='cuda', help=f'{DEVICE_CHOICES} (default cuda)')
    r.add_argument('--wheels', default=WHEELS)
    r.add_argument('--quick', '--small', dest='quick', action='store_true',
                   help='small sizes (the CPU dry run)')
    r.add_argument('--parts', default='abcde', help='which of parts a-e to run (default abcde)')
    r.add_argument('--detectors', action='store_true',
                   help='part f: the detector and segmentor steps (CUDA, mmdet, mmseg, mmcv ops)')
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
