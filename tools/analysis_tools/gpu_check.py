"""The GPU check: what needs a CUDA GPU, on a bare GPU node (python, torch, no network).

    python tools/analysis_tools/gpu_check.py fetch    # once, where there is a network
    python3 tools/analysis_tools/gpu_check.py run --out docs/benchmarks/gpu_check/report \\
        [--inline-repo PATH/InLine] [--mala-repo PATH/MALA] [--detectors]    # on the node

``run`` needs python >= 3.10, torch >= 2.1 and the node's own numpy, PyYAML, opencv and pillow;
of the wheels ``fetch`` put in ``wheels/gpu_check/`` it unpacks those whose modules the node lacks,
for this process only (docs/development.md, "The GPU check"). It writes OUT.md and OUT.json:

a. every core of ``CORES``, forward and backward, fp32 / fp16 / bf16 against float64;
b. every tiny backbone's training step under autocast (fp16 with a GradScaler, bf16) against fp32;
c. each core at the shapes the tiny backbones hand it and over a 1k-64k token sweep, fp32 / TF32 /
   bf16, beside the two-GEMM floor Q (K^T V) and SDPA; its output against float64; the
   no-autograd path in chunks of ``CHUNK_TOKENS`` and in one piece;
d. each tiny backbone's last stage, forward + backward, beside the authors' ``forward_features``
   (``--inline-repo``, ``--mala-repo``; fvcore stood in for) and timm's Swin-T, fp32 and bf16;
e. ``torch.compile`` of each tiny backbone, after one probe compile with the same backend on the
   same device (else skipped with the reason);
f. (``--detectors``) benchmark_step.py's detector and segmentor steps and the GPU tests, where
   mmdet, mmseg and mmcv's CUDA ops import.

Parts a-e are sized for 5 minutes on one H100 (c, d and e stop at their budgets); ``--device cpu
--quick`` is the CPU dry run. Exit status: 0 when every correctness check holds (a part that cannot
run here is skipped, with the reason), 1 when one fails, 2 when the command is refused or the node
lacks what the check needs (one line says what).
"""
import argparse
import contextlib
import functools
import hashlib
import importlib.util
import itertools
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

ROOT = osp.abspath(osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))
sys.path.insert(0, ROOT)  # tools.workshop, and mmlinattn from this checkout
WHEELS = osp.join(ROOT, 'wheels', 'gpu_check')
REQUIREMENTS = osp.join(ROOT, 'requirements', 'gpu_check.txt')
COMPLETE = '.complete'  # written by fetch once every download succeeded (the list's sha256 first)
CARRY_LIMIT_MIB = 8  # what a device lease may carry of wheels/gpu_check/ (64 MiB for the tree)
#: wheels that never belong in the carried folder: the node's own (compiled, large)
NODE_OWN = ('numpy', 'opencv', 'torch', 'pillow', 'pyyaml', 'triton', 'nvidia')
#: module -> the distribution a node provides it with (imported in a child process first)
NODE_MODULES = {'numpy': 'numpy', 'yaml': 'PyYAML', 'cv2': 'opencv-python-headless',
                'PIL': 'pillow'}
WHEEL_MODULES = ('mmengine', 'mmcv')  # what the wheels bring where the node lacks it
DEVICE_CHOICES = 'cpu, cuda or cuda:N'
#: correctness limits: the largest error relative to the reference's largest value (cores), the
#: AMP step's ||g - g32|| / ||g32|| over all parameters, torch.compile against eager (fp32)
CORE_TOL = {'fp32': 1e-4, 'fp16': 5e-3, 'bf16': 1e-2}
GRAD_TOL = {'fp16': 2e-2, 'bf16': 1e-1}
COMPILE_TOL = 1e-3
FAMILIES = (('InLinePVT', 'tiny'), ('InLineSwin', 'tiny'), ('MAViT', 'tiny'))
#: backbone -> (family of tools.workshop.authors_code, the option naming the authors' clone)
AUTHORS = {'InLinePVT': ('inline_pvt', 'inline_repo'), 'InLineSwin': ('inline_swin', 'inline_repo'),
           'MAViT': ('mavit', 'mala_repo')}
#: part -> (full size on a GPU, --quick); sizes are (batch, (H, W)) or (batch, side)
SIZES = {
    'core_n': (1024, 196),
    # c: the backbones' core calls at these inputs; 1333 x 800 padded to 32 as mmdet does
    'core_inputs': ([(64, (224, 224)), (2, (800, 1344))], [(1, (32, 32))]),
    # c: the token sweep, (tokens, batch, heads, head dim): batch x heads x tokens = 2^20
    'sweep': ([(n, 2 ** 20 // n // 8, 8, 64) for n in (1024, 4096, 16384, 65536)],
              [(256, 1, 2, 32)]),
    'step': ((2, 224), (2, 32)),
    'bench': ([(64, (224, 224)), (2, (800, 1344))], [(2, (32, 32))]),
    'compile': ((8, 224), (1, 64)),
}
QUADRATIC_FP32_MAX = 16384  # c: no fp32 SDPA nor softmax core above (quadratic: minutes at 64k)
#: planned seconds of parts a-e on one H100 (c, d and e stop at theirs)
BUDGET_S = {'cores': 15, 'amp_steps': 20, 'core_speed': 110, 'backbone_speed': 60, 'compile': 90}
PARTS = {'a': 'cores', 'b': 'amp_steps', 'c': 'core_speed', 'd': 'backbone_speed', 'e': 'compile',
         'f': 'detectors'}


class _Torch(types.ModuleType):
    """torch, imported on first use: once the node's modules are checked and the wheels unpacked."""

    def __getattr__(self, name):
        import torch
        return getattr(torch, name)


torch = _Torch('torch')


def tool_error(msg: str, code: int = 2) -> int:
    """One line on stderr (``gpu_check.py: error: ...``); returns the exit status."""
    print(f'gpu_check.py: error: {msg}', file=sys.stderr, flush=True)
    return code


# --- wheels: fetch (networked machine) and unpack (node) ---
def _wheels_in(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith('.whl'))


def _dist(wheel):
    return wheel.split('-', 1)[0].lower().replace('_', '-')


def carry_problems(folder: str):
    """What keeps ``folder`` from a lease: over the size limit, compiled or node's own wheels."""
    wheels = _wheels_in(folder)
    total = sum(osp.getsize(osp.join(folder, f)) for f in wheels)
    problems = [f'{total / 2 ** 20:.1f} MiB of wheels, over the {CARRY_LIMIT_MIB} MiB a lease '
                'carries'] if total > CARRY_LIMIT_MIB * 2 ** 20 else []
    for f in wheels:
        if _dist(f).startswith(NODE_OWN):
            problems.append(f'{f}: the node\'s own package, not carried')
        elif not f.endswith('-none-any.whl'):
            problems.append(f'{f}: a compiled wheel (only pure-Python ones are carried)')
    return problems


def fetch(args) -> int:
    """pip download of the listed wheels beside ``--dest``, swapped in once every one succeeded."""
    dest = osp.abspath(args.dest)
    os.makedirs(osp.dirname(dest), exist_ok=True)
    new = tempfile.mkdtemp(prefix='.fetch-', dir=osp.dirname(dest))
    try:
        with open(REQUIREMENTS, 'rb') as f:
            listed = f.read()
        cmd = [sys.executable, '-m', 'pip', 'download', '--disable-pip-version-check', '--no-deps',
               '--only-binary=:all:', '-d', new, '--python-version', '3.10', '--implementation',
               'py', '--platform', 'any', '--abi', 'none'] + (['-q'] if args.quiet else []) + \
            (['--index-url', args.index_url] if args.index_url else []) + \
            [s for s in map(str.strip, listed.decode().splitlines()) if s and s[0] != '#']
        if not args.quiet:
            print('+', ' '.join(cmd), flush=True)
        if subprocess.call(cmd) != 0:
            kept = ' (its earlier wheels are kept)' if osp.isfile(osp.join(dest, COMPLETE)) else ''
            return tool_error(f'pip download failed (above); {dest} is unchanged{kept}', 1)
        problems = carry_problems(new)
        if problems:
            return tool_error(f'requirements/gpu_check.txt gives wheels a lease cannot carry: '
                              f'{"; ".join(problems)}; {dest} is unchanged', 1)
        wheels = _wheels_in(new)
        with open(osp.join(new, COMPLETE), 'w') as f:  # tools/install.sh compares the digest
            f.write(f'sha256 {hashlib.sha256(listed).hexdigest()}\n' + '\n'.join(wheels) + '\n')
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


def wheel_fits(filename: str, version=None) -> bool:
    """Whether python ``version`` (this one's by default) runs the wheel: pure Python (none-any, the
    only kind fetch takes and a lease carries) for python 3 or for this CPython."""
    m = _WHEEL.match(filename)
    major, minor = version or sys.version_info[:2]
    return bool(m) and (m['abi'], m['plat']) == ('none', 'any') and \
        any(p in ('py3', f'py{major}', f'cp{major}{minor}') for p in m['py'].split('.'))


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def unpack_missing(wheels: str, target: str):
    """Unpack into ``target`` each fitting wheel whose modules do not import: name-versions."""
    taken, seen = [], set()
    for fname in _wheels_in(wheels) if osp.isdir(wheels) else []:
        if _dist(fname) in seen or not wheel_fits(fname):
            continue
        seen.add(_dist(fname))
        with zipfile.ZipFile(osp.join(wheels, fname)) as z:
            tops = {n.split('/', 1)[0] if '/' in n else n.split('.', 1)[0] for n in z.namelist()
                    if not n.split('/', 1)[0].endswith(('.dist-info', '.data', '.libs'))
                    and not n.startswith('.')}
            if tops and all(_importable(m) for m in tops):  # the node has it
                continue
            z.extractall(target)
        for data in [d for d in os.listdir(target) if d.endswith('.data')]:
            for sub in ('purelib', 'platlib'):  # a wheel's .data/purelib belongs at the root
                src = osp.join(target, data, sub)
                for item in os.listdir(src) if osp.isdir(src) else []:
                    shutil.move(osp.join(src, item), osp.join(target, item))
            shutil.rmtree(osp.join(target, data))
        taken.append('-'.join(fname.split('-', 2)[:2]))  # name-version
    return taken


def unpack_dir(wheels: str):
    """A temp folder beside the wheels (a noexec TMPDIR does not matter), else in TMPDIR."""
    for where in (osp.dirname(osp.abspath(wheels)), None):
        with contextlib.suppress(OSError):
            if where is not None:
                os.makedirs(where, exist_ok=True)
            return tempfile.TemporaryDirectory(prefix='.unpacked-' if where else
                                               'mmlinattn-gpu-check-', dir=where)
    raise OSError('no writable folder to unpack the wheels into (neither beside them nor TMPDIR)')


_IMPORT_PROBE = '''import importlib, json, sys
res = {}
for m in sys.argv[1:]:
    try:
        res[m] = importlib.import_module(m) and None
    except BaseException as e:
        msg = (str(e).splitlines() or [''])[0][:300]
        res[m] = [type(e).__name__, msg, getattr(e, 'name', None)]
print(json.dumps(res))'''


def import_problems(modules, path=()):
    """{module: why (None: absent)} for ``modules`` failing a real import in a child."""
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(list(path) + [p for p in [env.get('PYTHONPATH')] if p])
    proc = None
    try:
        proc = subprocess.run([sys.executable, '-c', _IMPORT_PROBE, *modules], env=env,
                              capture_output=True, text=True, timeout=300)
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        tail = ' '.join((proc.stderr if proc else '').split()[-30:])
        return {m: f'importing {", ".join(modules)} in a child python crashed or hung ({tail})'
                for m in modules}
    return {m: None if kind == 'ModuleNotFoundError' and (missing or '').split('.')[0] == m
            else f'{kind}: {msg}' for m, (kind, msg, missing) in
            [(m, why) for m, why in found.items() if why is not None]}


def explain_import_problems(problems, wheels):
    """A line per module that fails (only the node's own where one of them does)."""
    if any(m in NODE_MODULES for m in problems):
        problems = {m: why for m, why in problems.items() if m in NODE_MODULES}
    lines = []
    for m, why in problems.items():
        dist = NODE_MODULES.get(m)
        if dist and why is None:
            lines.append(f'this python ({sys.executable}) has no {m}; the check uses the node\'s '
                         f'own {dist} (not carried as a wheel): install it there')
        elif dist:
            lines.append(f'{m} is installed but does not import ({why}); the check uses the '
                         f'node\'s own {dist}: repair it there' + (
                             ' (opencv-python needs libGL: opencv-python-headless does not)'
                             if m == 'cv2' else ''))
        elif why is None:
            lines.append(f'{m} is neither on this python nor among the wheels in {wheels}: they '
                         'belong there (gpu_check.py fetch on a machine with network, then copy '
                         'wheels/gpu_check/ along)')
        else:
            lines.append(f'{m} does not import ({why})')
    return lines


# --- measuring ---
def _sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


#: repeats of one timing: at least MIN_REPS, more up to MAX_REPS while under TIMING's target
#: seconds in all (the quick dry run sets 0.02)
MIN_REPS, MAX_REPS = 7, 50
TIMING = dict(target_s=0.1)


def timed(fn, device, min_reps=MIN_REPS, max_reps=MAX_REPS, target_s=None) -> dict:
    """``fn()``'s median and min ms over ``reps`` repeats, sized by a warm-up (CUDA events)."""
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    target_s = TIMING['target_s'] if target_s is None else target_s
    reps = max(min_reps, min(max_reps, int(target_s / max(time.perf_counter() - t, 1e-6))))
    cuda, times = device.type == 'cuda', []
    events = [[torch.cuda.Event(enable_timing=True) for _ in 'ab'] if cuda else (None, None)
              for _ in range(reps)]
    for a, b in events:
        if cuda:
            a.record()
        t = time.perf_counter()
        fn()
        if cuda:
            b.record()
        times.append((time.perf_counter() - t) * 1e3)
    _sync(device)
    times = [a.elapsed_time(b) for a, b in events] if cuda else times
    return dict(ms=statistics.median(times), min_ms=min(times), reps=reps)


def _put(row, key, t):
    """A :func:`timed` result into ``row`` as KEY_ms, KEY_min_ms and KEY_reps."""
    row.update({f'{key}_ms': t['ms'], f'{key}_min_ms': t['min_ms'], f'{key}_reps': t['reps']})


def peak_mib(fn, device):
    """Peak CUDA MiB ``fn()`` allocates above what was there (None on the CPU: not called)."""
    if device.type != 'cuda':
        return None
    _sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20


@contextlib.contextmanager
def part_stats(device, into: dict):
    """Wall time and peak memory (CUDA's allocation, else peak RSS) of a part into ``into``."""
    import resource
    if device.type == 'cuda':
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
    t = time.perf_counter()
    try:
        yield
    finally:
        _sync(device)
        into['seconds'] = time.perf_counter() - t
        if device.type == 'cuda':
            into.update(peak_mib=torch.cuda.max_memory_allocated(device) / 2 ** 20,
                        peak_of='CUDA max_memory_allocated over the part')
        else:  # VmHWM: ru_maxrss would carry a parent's peak over fork + exec
            kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (
                2 ** 10 if sys.platform == 'darwin' else 1)
            with contextlib.suppress(OSError, StopIteration), open('/proc/self/status') as f:
                kib = next(float(ln.split()[1]) for ln in f if ln.startswith('VmHWM:'))
            into.update(peak_mib=kib / 2 ** 10, peak_of='process peak RSS so far')


def _over(deadline) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def _why(err: BaseException, limit: int = 200) -> str:
    """One line naming an exception, for the report."""
    return f'{type(err).__name__}: {err}'.splitlines()[0][:limit]


def rel_err(got, want) -> float:
    scale = want.abs().max().item() or 1.0
    return (got.double() - want.double()).abs().max().item() / scale


def _half(prec):
    return torch.float16 if prec == 'fp16' else torch.bfloat16


def autocast(device, prec):
    return torch.autocast(device.type, _half(prec)) if prec != 'fp32' else contextlib.nullcontext()


def _skipped(rows, row, device, prec, log, what) -> bool:
    """Without ``prec`` autocast on ``device`` (torch 2.1's CPU), ``row`` joins ``rows`` skipped."""
    try:
        with autocast(device, prec):
            return False
    except RuntimeError as err:
        why = f'this torch has no {prec} autocast on {device.type}: {_why(err, 120)}'
    rows.append(dict(row, ok=True, skipped=why))
    log(f'{what}: skipped ({why})')
    return True


@contextlib.contextmanager
def tf32(on: bool):
    """TF32 matmuls and convolutions on or off inside (CUDA; nothing elsewhere)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# --- the parts ---
def part_cores(device, small, log):
    """a. Every core, forward and backward, fp32 / fp16 / bf16 against float64."""
    from mmlinattn.core.ops import CORES
    n, rows = SIZES['core_n'][small], []
    for name, core in CORES.items():
        g = torch.Generator().manual_seed(0)
        q, k, v, grad = (torch.randn(2, 4, n, 32, generator=g, dtype=torch.float64)
                         for _ in range(4))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = core.attention_matrix(*leaves[:2]) @ leaves[2]
        want = [out.detach()] + list(torch.autograd.grad(out, leaves, grad))
        for prec in ('fp32', 'fp16', 'bf16'):
            row = dict(core=name, precision=prec, tokens=n)
            if _skipped(rows, row, device, prec, log, f'a. {name:8s} {prec}'):
                continue
            xs = [t.float().to(device).requires_grad_() for t in (q, k, v)]
            try:
                with autocast(device, prec):  # the inputs in the precision a projection gives
                    y = core(*[x if prec == 'fp32' else x.to(_half(prec)) for x in xs])
                got = [y.detach()] + list(torch.autograd.grad(y.float(), xs,
                                                              grad.float().to(device)))
                errs = [rel_err(a.cpu(), b) for a, b in zip(got, want)]
                row.update(out_err=errs[0], grad_err=max(errs[1:]), dtype=str(y.dtype)[6:],
                           finite=all(bool(torch.isfinite(t).all()) for t in got))
                row['ok'] = row['finite'] and max(errs) <= CORE_TOL[prec]
            except Exception as err:  # the report names it
                row.update(ok=False, error=_why(err))
            rows.append(row)
            log(f'a. {name:8s} {prec}: ' + (row.get('error') or f"out {row['out_err']:.2e}, "
                                                                f"grad {row['grad_err']:.2e}"))
    return rows


def build_backbone(kind, arch, device, **options):
    """Our tiny backbone (stochastic depth 0), the four stage maps unless ``options`` say else."""
    from mmlinattn.core.registry import MODELS
    torch.manual_seed(0)
    cfg = dict(type=kind, arch=arch, drop_path_rate=0.0, out_indices=(0, 1, 2, 3))
    return MODELS.build(dict(cfg, **options)).to(device)


def _step(model, x, device, prec, scaler=None):
    """One training step's forward + backward under ``prec`` (loss: the outputs' mean square)."""
    model.zero_grad(set_to_none=True)
    with autocast(device, prec):
        outs = model(x)
    loss = sum(o.float().pow(2).mean() for o in (outs if isinstance(outs, (tuple, list))
                                                 else [outs]))
    (loss if scaler is None else scaler.scale(loss)).backward()
    return loss


def _grad_scaler(device):
    with contextlib.suppress(AttributeError, TypeError, RuntimeError, AssertionError):
        return torch.amp.GradScaler(device.type)  # torch >= 2.3
    return torch.cuda.amp.GradScaler() if device.type == 'cuda' else None


def part_amp_steps(device, small, log):
    """b. Each tiny backbone's training step in fp32, fp16 (GradScaler) and bf16."""
    (batch, size), rows = SIZES['step'][small], []
    for kind, arch in FAMILIES:
        x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1)).to(device)
        label = dict(backbone=f'{kind}-{arch}', batch=batch, size=size)

        def grads(prec, model):
            scaler = _grad_scaler(device) if prec == 'fp16' else None
            loss = _step(model, x, device, prec, scaler)
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).float()
                              .flatten() for p in model.parameters() if p.requires_grad])
            return loss.detach().float(), flat / (scaler.get_scale() if scaler else 1.0), \
                scaler is not None

        try:
            model = build_backbone(kind, arch, device).train()
            ref_loss, ref, _ = grads('fp32', model)
        except Exception as err:  # no reference: both rows say why
            rows += [dict(label, precision=prec, ok=False, error=f'the fp32 step: {_why(err)}')
                     for prec in ('fp16', 'bf16')]
            log(f'b. {kind}: the fp32 step failed: {_why(err)}')
            continue
        for prec in ('fp16', 'bf16'):
            row = dict(label, precision=prec)
            if _skipped(rows, row, device, prec, log, f'b. {kind} {prec}'):
                continue
            try:
                loss, g, scaled = grads(prec, model)
                finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(g).all())
                err = ((g - ref).norm() / ref.norm()).item()
                row.update(finite=finite, grad_err=err, loss_err=abs((loss - ref_loss).item())
                           / abs(ref_loss.item()), grad_scaler=scaled,
                           ok=finite and err <= GRAD_TOL[prec])
            except Exception as err:
                row.update(ok=False, error=_why(err))
            rows.append(row)
            log(f'b. {kind} {prec}: ' + (row.get('error') or f"finite {row['finite']}, "
                                                             f"grad {row['grad_err']:.2e}"))
    return rows


def sdpa_fn(device, dtype):
    """torch's SDPA over (..., h, N, d): flash attention alone for bf16 on CUDA."""
    ctx = contextlib.nullcontext
    if device.type == 'cuda' and dtype == torch.bfloat16:
        try:  # torch >= 2.3
            from torch.nn.attention import SDPBackend, sdpa_kernel
            ctx = functools.partial(sdpa_kernel, SDPBackend.FLASH_ATTENTION)
        except ImportError:  # torch 2.1, 2.2
            ctx = functools.partial(torch.backends.cuda.sdp_kernel, enable_flash=True,
                                    enable_math=False, enable_mem_efficient=False)

    def sdpa(q, k, v):
        q4, k4, v4 = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))  # windows: into the batch
        with ctx():
            out = torch.nn.functional.scaled_dot_product_attention(q4, k4, v4)
        return out.reshape(*q.shape[:-1], v.shape[-1])
    return sdpa


def core_calls(kind, arch, device, hw):
    """The distinct core calls (shapes, stage, context) of our backbone's forward at ``hw``."""
    from mmlinattn.core.ops.cores import Core
    model = build_backbone(kind, arch, device).eval()
    dims, found, run = list(getattr(model, 'embed_dims', []) or []), {}, Core.run

    def recording(self, q, k, v, bound, rope=None, attn_bias=None, dropout_p=0.):
        key = (self.name, tuple(q.shape), tuple(k.shape), tuple(v.shape))
        h, d = q.shape[-3], q.shape[-1]
        found.setdefault(key, dict(
            core=self.name, q=list(q.shape), k=list(k.shape), v=list(v.shape), heads=h,
            head_dim=d, tokens=q.shape[-2], kv_tokens=k.shape[-2], calls=0, bound=dict(bound),
            stage=dims.index(h * d) + 1 if h * d in dims else None, rope=rope,
            attn_bias=attn_bias))['calls'] += 1
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


def bench_core(device, label, name, batch, call, deadline=None, only=None):
    """One core at one shape (``call`` as :func:`core_calls` gives it, at batch ``batch``): forward
    + backward time of the core, the two-GEMM floor and SDPA in each precision; the no-autograd
    path chunked and in one piece; the output against float64 (``only``: these precisions and
    cases alone). Returns (speed rows, accuracy rows)."""
    from mmlinattn.core.ops import CORES, attention
    core, chunk = CORES[name], attention.CHUNK_TOKENS
    shapes = [[batch] + list(call[x][1:]) for x in ('q', 'k', 'v')]
    n = max(call['tokens'], call['kv_tokens'])
    g = torch.Generator(device).manual_seed(0)
    base = [torch.randn(*s, generator=g, device=device) for s in shapes]
    gout = torch.randn(*shapes[0][:-1], shapes[2][-1], generator=g, device=device)
    shape = dict(label, core=name, batch=batch, heads=call['heads'], head_dim=call['head_dim'],
                 tokens=call['tokens'], kv_tokens=call['kv_tokens'])
    speed, accuracy, over = [], [], False

    def run_core(dtype):
        ctx = dict(rope=_cast(call['rope'], torch.float64) if dtype == torch.float64 else
                   call['rope'], attn_bias=_cast(call['attn_bias'], dtype))
        return lambda q, k, v: core.run(q, k, v, call['bound'], **ctx)

    def fwd_bwd(fn, xs):
        out = fn(*[t.detach().requires_grad_() for t in xs])
        out.backward(gout.to(out.dtype))

    for prec in ('fp32', 'tf32', 'bf16') if device.type == 'cuda' else ('fp32', 'bf16'):
        if only and prec not in only:
            continue
        dtype = torch.bfloat16 if prec == 'bf16' else torch.float32
        xs, row = [t.to(dtype) for t in base], dict(shape, precision=prec)
        cases = {'core': run_core(dtype), 'floor': lambda q, k, v: q @ (k.transpose(-2, -1) @ v),
                 'sdpa': sdpa_fn(device, dtype)}  # the floor: the products no linear core avoids
        with tf32(prec == 'tf32'):
            for case, fn in cases.items():
                quadratic = case == 'sdpa' or name == 'softmax' and case == 'core'
                if only and case not in only:
                    continue
                elif _over(deadline):
                    row[f'{case}_error'], over = 'skipped: over part c\'s budget', True
                elif quadratic and prec != 'bf16' and n > QUADRATIC_FP32_MAX:
                    row[f'{case}_error'] = ('skipped: quadratic in fp32 above '
                                            f'{QUADRATIC_FP32_MAX} tokens')
                else:
                    try:
                        _put(row, case, timed(lambda fn=fn: fwd_bwd(fn, xs), device))
                        if device.type == 'cuda':
                            row[f'{case}_mib'] = peak_mib(lambda fn=fn: fwd_bwd(fn, xs), device)
                    except Exception as err:
                        row[f'{case}_error'] = _why(err, 160)
            for case in ('floor', 'sdpa'):
                if 'core_ms' in row and f'{case}_ms' in row:
                    row[f'vs_{case}'] = row['core_ms'] / row[f'{case}_ms']
            # the no-autograd path in chunks of CHUNK_TOKENS and in one piece (set_chunk_tokens),
            # and which of the two this device runs by default
            if prec == 'bf16' and n > chunk and name != 'softmax' and not over:
                fwd = run_core(dtype)
                try:
                    with torch.no_grad():
                        for key, tokens in (('fwd_chunked_ms', chunk), ('fwd_unchunked_ms', None)):
                            old = attention.set_chunk_tokens(device.type, tokens)
                            try:
                                row[key] = timed(lambda: fwd(*xs), device)['ms']
                            finally:
                                attention.set_chunk_tokens(device.type, old)
                    default = attention.chunk_tokens(device)
                    row.update(chunk_tokens=chunk,
                               chunk_default='one piece' if default is None else default)
                except Exception as err:
                    row['chunk_error'] = _why(err, 160)
            # accuracy: the output against the same core in float64 on the same inputs (bf16:
            # the rounded inputs), no-autograd path, one image; softmax up to 4096 tokens
            if prec != 'tf32' and (name != 'softmax' or n <= 4096) and not over:
                one, acc = [t[:1] for t in xs], dict(shape, precision=prec, limit=CORE_TOL[prec])
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
    """c. Each core at our backbones' shapes and over a token sweep (:func:`bench_core`)."""
    from mmlinattn.core.ops import CORES
    deadline = time.perf_counter() + budget_s if budget_s else None
    groups, speed, accuracy, errors = [], [], [], []
    for (kind, arch), (batch, hw) in itertools.product(FAMILIES, SIZES['core_inputs'][small]):
        label = dict(source=f'{kind}-{arch}', input=f'{batch}x{hw[0]}x{hw[1]}')
        try:
            groups += [(dict(label, stage=call['stage'], calls=call['calls']), call['core'],
                        batch, call) for call in core_calls(kind, arch, device, hw)]
        except Exception as err:  # the report names it
            errors.append(dict(label, error=_why(err)))
            log(f"c. {kind} {label['input']}: {_why(err)}")
    for (n, b, h, d), (name, core) in itertools.product(SIZES['sweep'][small], CORES.items()):
        groups.append((dict(source='sweep', input=f'{b}x{h}x{n}x{d}', stage=None, calls=None),
                       name, b, dict(q=[b, h, n, d], k=[b, h, n, d], v=[b, h, n, d], heads=h,
                                     head_dim=d, tokens=n, kv_tokens=n, rope=None, attn_bias=None,
                                     bound=core.bind(scale=d ** -0.5))))
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
    """Where fvcore is not installed (it has no wheel; the authors' files import its FLOP counter,
    which their models never call), a module ``fvcore`` (and ``fvcore.nn``) whose every name is a
    function that raises, while their file is imported; out of ``sys.modules`` again after."""
    def stand_in(name):
        def missing(*args, **kwargs):
            raise RuntimeError(f'fvcore.{name}: fvcore is not installed (gpu_check.py stood in '
                               'for it to import the authors\' model file)')
        return missing
    mods = {} if _importable('fvcore') else {n: types.ModuleType(n)
                                             for n in ('fvcore', 'fvcore.nn')}
    for mod in mods.values():  # PEP 562 (`from fvcore.nn import X`); a package: `import fvcore.nn`
        mod.__getattr__, mod.__path__ = stand_in, []
    if mods:
        mods['fvcore'].nn = mods['fvcore.nn']
    sys.modules.update(mods)
    try:
        yield
    finally:
        for name, mod in mods.items():
            if sys.modules.get(name) is mod:
                del sys.modules[name]


def _features(model):
    """A classifier (the authors', timm's) called through its ``forward_features``."""
    model.forward = getattr(model, 'forward_features', model.forward)
    return model


def authors_repo_problem(family, repo):
    """Why ``repo`` is not a clone holding the authors' model file of ``family``, or None."""
    from tools.workshop.authors_code import SOURCES
    rel = SOURCES[family][1]
    return None if osp.isfile(osp.join(repo, rel)) else f'{repo} has no {rel}'


def load_authors(kind, args):
    """(the authors' tiny classifier from their clone, None), or (None, why not)."""
    from tools.workshop.authors_code import build_authors
    family, opt = AUTHORS[kind]
    if not getattr(args, opt):
        return None, f'--{opt.replace("_", "-")} not given'
    for req in ('timm', 'einops'):  # what their files import (fvcore is stood in for)
        if not _importable(req):
            return None, f'{req} not installed'
    try:
        with fvcore_stand_in():
            return _features(build_authors(family, 'tiny', getattr(args, opt), drop_path=0.0)), None
    except Exception as err:  # another commit of their code, ...
        return None, _why(err)


def load_timm_swin(hw):
    if not _importable('timm'):
        return None, 'timm not installed'
    try:
        import timm
        return _features(timm.create_model('swin_tiny_patch4_window7_224', img_size=hw)), None
    except Exception as err:
        return None, f'timm swin_tiny: {_why(err)}'


def part_backbone_speed(device, small, args, log, budget_s=None):
    """d. Forward + backward time and peak memory of each tiny backbone's last stage (no output
    norm: the work of the authors' ``forward_features``), fp32 and bf16, beside the authors' code
    and timm's Swin-T at the classification size (their classifiers are built for it)."""
    deadline = time.perf_counter() + budget_s if budget_s else None
    rows = []
    for batch, hw in SIZES['bench'][small]:
        x = torch.randn(batch, 3, *hw).to(device)
        classification = hw == SIZES['bench'][small][0][1]
        models = {}
        for kind, arch in FAMILIES:
            models[f'{kind}-{arch}'] = ('ours', lambda k=kind, a=arch: (build_backbone(
                k, a, device, out_indices=(3,), out_norm=False), None))
            if classification:
                models[f'{kind}-{arch} (authors)'] = ('authors', functools.partial(
                    load_authors, kind, args))
        if classification:
            models['Swin-T (timm)'] = ('timm', functools.partial(load_timm_swin, hw))
        for label, (who, make) in models.items():
            row = dict(model=label, who=who, batch=batch, size=f'{hw[0]}x{hw[1]}')
            rows.append(row)
            if _over(deadline):
                row['skipped'] = 'over part d\'s budget'
                continue
            try:
                model, why = make()
                if model is None:
                    row['skipped'] = why
                    log(f"d. {label} {batch}x{row['size']}: skipped ({why})")
                    continue
                model = model.to(device).train()
                for prec in ('fp32', 'bf16'):
                    step = functools.partial(_step, model, x, device, prec)
                    # a bf16 step on a CPU without bf16 units takes seconds: 3 repeats there
                    _put(row, prec, timed(step, device, min_reps=3 if small else 5, max_reps=20,
                                          target_s=10 * TIMING['target_s']))
                    model.zero_grad(set_to_none=True)  # the peak counts the gradients too
                    row[f'{prec}_mib'] = peak_mib(step, device)
                if row['fp32_mib']:
                    row['bf16_mem_ratio'] = row['bf16_mib'] / row['fp32_mib']
                model = step = None  # freed before the next model is built
            except Exception as err:
                row['error'] = _why(err)
            if device.type == 'cuda':
                torch.cuda.empty_cache()
            log(f"d. {label} {batch}x{row['size']}: " + (
                row.get('error') or f"fp32 {row['fp32_ms']:.1f} ms, bf16 {row['bf16_ms']:.1f} ms"))
    for row in rows:  # ours against the authors' at the same size
        theirs = next((r for r in rows if r['model'] == row['model'] + ' (authors)'
                       and r['size'] == row['size'] and 'bf16_ms' in r), None)
        if theirs and 'bf16_ms' in row and 'error' not in row and 'error' not in theirs:
            row['speedup_vs_authors'] = theirs['fp32_ms'] / row['fp32_ms']
            row['bf16_speedup_vs_authors'] = theirs['bf16_ms'] / row['bf16_ms']
    return rows


def compile_unavailable(device, backend):
    """Why ``torch.compile(backend=backend)`` cannot run on ``device`` here, or None: torch < 2.3
    (whose dynamo fails on our backbones), inductor without triton (CUDA), a C compiler or
    Python.h, and last one tiny probe compile (a matmul, a GELU) failing or differing from eager."""
    if not hasattr(getattr(torch, 'compiler', None), 'is_compiling'):
        return (f'torch {torch.__version__}: dynamo before torch 2.3 cannot trace these backbones '
                '(torch >= 2.3 compiles them)')
    include = sysconfig.get_paths().get('include') or ''
    if backend == 'inductor' and device.type == 'cuda' and not _importable('triton'):
        return 'inductor needs triton on a GPU, and this python has none'
    if backend == 'inductor' and not any(
            c and shutil.which(c) for c in (os.environ.get('CC'), 'cc', 'gcc', 'clang')):
        return 'inductor needs a C compiler (cc, gcc or clang on PATH, or CC), and none is here'
    if backend == 'inductor' and not osp.isfile(osp.join(include, 'Python.h')):
        return (f'inductor builds Python extensions and needs Python.h, which is not in '
                f'{include or "this python"} (the python3-dev package)')

    def fn(x, w):
        return torch.nn.functional.gelu(x @ w).sum(-1)
    try:
        importlib.import_module('torch._dynamo')
        g = torch.Generator().manual_seed(0)
        x, w = (torch.randn(*s, generator=g).to(device) for s in ((16, 32), (32, 32)))
        torch._dynamo.reset()
        got = torch.compile(fn, backend=backend)(x, w)
        _sync(device)
        if not torch.allclose(got, fn(x, w), rtol=1e-3, atol=1e-3):
            raise RuntimeError('the probe\'s compiled output differs from eager')
    except Exception as err:
        return f'the probe torch.compile(backend={backend!r}) on {device.type} failed: {_why(err)}'
    finally:
        with contextlib.suppress(Exception):
            torch._dynamo.reset()
    return None


def part_compile(device, small, backend, log, budget_s=None):
    """e. torch.compile of each backbone: compiles, matches eager, its time; or why skipped."""
    deadline = time.perf_counter() + budget_s if budget_s else None
    batch, size = SIZES['compile'][small]
    why = compile_unavailable(device, backend)
    if why:
        log(f'e. skipped: {why}')
    rows = []
    for kind, arch in FAMILIES:
        row = dict(backbone=f'{kind}-{arch}', batch=batch, size=size, backend=backend)
        rows.append(row)
        if why or _over(deadline):
            row.update(ok=True, skipped=why[:300] if why else 'over part e\'s budget')
            if not why:
                log(f'e. {kind}: skipped (over part e\'s budget)')
            continue
        try:
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
                for key, fn in (('eager_ms', model), ('compiled_ms', compiled)):
                    row[key] = timed(lambda: fn(x), device, min_reps=5, max_reps=20)['ms']
            row['ok'] = row['err'] <= COMPILE_TOL
        except Exception as err:
            row.update(ok=False, error=_why(err))
        log(f'e. {kind}: ' + (row.get('error') or f"compile {row['compile_s']:.1f} s, err "
                              f"{row['err']:.1e}, eager {row['eager_ms']:.1f} ms, compiled "
                              f"{row['compiled_ms']:.1f} ms"))
    return rows


def run_child(cmd, timeout, **kw):
    """(exit or None on timeout, output, s) of ``cmd`` in its own process group, killed whole."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kw)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.perf_counter() - t
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0] or ''
        return None, out + f'\ntimed out after {timeout} s (process group killed)', \
            time.perf_counter() - t
    finally:
        with contextlib.suppress(ProcessLookupError):  # what the child left behind, if anything
            os.killpg(proc.pid, signal.SIGKILL)


#: part f: benchmark_step.py's training step of one config per task, fp32 and --amp (fp16: it has
#: no bf16 switch), one process each; and the tests that skip without a GPU
DETECTOR_CONFIGS = ('configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py',
                    'configs/mavit/upernet_mavit-t_160k_ade20k-512x512.py')
GPU_TESTS = ('tests/test_amp.py',)
CHILD_TIMEOUT_S = 300


def part_detectors(device, small, log, enabled=True):
    """f. The detector and segmentor steps and the GPU tests (--detectors, CUDA, mmcv ops)."""
    why = None if enabled else 'not asked for (--detectors runs it)'
    if not why and device.type != 'cuda':
        why = 'the CPU dry run (--device cpu) measures no detector'
    if not why:
        try:
            from mmcv.ops import nms
            nms(torch.tensor([[0., 0., 1., 1.]], device='cuda'), torch.ones(1, device='cuda'), 0.5)
            why = next((f'{pkg} is not installed' for pkg in ('mmdet', 'mmseg')
                        if not _importable(pkg)), None)
        except Exception as err:
            why = f'mmcv\'s compiled CUDA ops are not there ({_why(err, 160)})'
    if why:
        log(f'f. skipped: {why}')
        return dict(skipped=why, rows=[])
    rows = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with tempfile.TemporaryDirectory() as tmp:
        for config, amp in [(c, amp) for c in DETECTOR_CONFIGS for amp in (False, True)]:
            out = osp.join(tmp, f'{len(rows)}')
            rc, output, seconds = run_child(
                [sys.executable, osp.join(ROOT, 'tools', 'analysis_tools', 'benchmark_step.py'),
                 osp.join(ROOT, config), '--device', 'cuda', '--out', out]
                + (['--amp'] if amp else []), CHILD_TIMEOUT_S, env=env)
            row = dict(config=config, amp='fp16' if amp else 'fp32', rc=rc, seconds=seconds)
            if rc == 0 and osp.exists(out + '.json'):
                with open(out + '.json') as f:
                    row['result'] = json.load(f)
            else:
                row['tail'] = output[-600:]
            rows.append(row)
            log(f'f. {config} {row["amp"]}: exit {rc}, {seconds:.0f} s')
    row = dict(config=' '.join(GPU_TESTS), amp=None)
    if _importable('pytest'):
        rc, output, seconds = run_child([sys.executable, '-m', 'pytest', '-q', *GPU_TESTS],
                                        2 * CHILD_TIMEOUT_S, cwd=ROOT, env=env)
        rows.append(dict(row, rc=rc, seconds=seconds, tail=output[-600:]))
    else:
        rows.append(dict(row, rc=0, seconds=0.0, skipped='pytest is not installed'))
    return dict(skipped=None, rows=rows)


# --- the report ---
def _f(x, spec='.3g'):
    return '-' if x is None else format(x, spec) if isinstance(x, float) else str(x)


def targets(parts):
    """The GPU targets of the check, each as (target, measured, met or None when not measured)."""
    cores, speed = parts.get('cores') or [], parts.get('core_speed') or {}
    bench = parts.get('backbone_speed') or []
    steps = [r for r in parts.get('amp_steps') or [] if not r.get('skipped')]

    def worst(what, values, pick, met):
        value = pick(values) if values else None
        return what, value, None if value is None else met(value)
    return [worst(f'every core in {p} within {CORE_TOL[p]:g} of float64',
                  [max(r['out_err'], r['grad_err']) for r in cores
                   if r['precision'] == p and 'out_err' in r] + [
                      r['err'] for r in speed.get('accuracy', [])
                      if r['precision'] == p and 'err' in r],
                  max, lambda v, p=p: v <= CORE_TOL[p]) for p in ('fp32', 'bf16')] + [
        ('AMP training finite for every backbone, fp16 and bf16',
         f"{sum(bool(r.get('finite')) for r in steps)} / {len(steps)}",
         all(r.get('finite') for r in steps) if steps else None),
        worst('linear cores (bf16 inputs) at most 1.5x the bf16 two-GEMM floor at >= 4k tokens',
              [r['vs_floor'] for r in speed.get('rows', []) if r['tokens'] >= 4096 and
               r['core'] != 'softmax' and r['precision'] == 'bf16' and 'vs_floor' in r],
              max, lambda v: v <= 1.5),
        worst('each backbone\'s training step at least 1.0x the authors\' code',
              [r['speedup_vs_authors'] for r in bench if 'speedup_vs_authors' in r],
              min, lambda v: v >= 1.0),
        worst('bf16 peak training memory at most 0.6x fp32',
              [r['bf16_mem_ratio'] for r in bench
               if r.get('who') == 'ours' and r.get('bf16_mem_ratio')], max, lambda v: v <= 0.6)]


def _verdict(row) -> str:
    return f"skipped: {row['skipped']}" if row.get('skipped') else \
        'yes' if row['ok'] else row.get('error', 'NO')


def _ms(row, key):
    """'median (min)' of a timing, or why it is missing."""
    if f'{key}_ms' in row:
        return f"{row[f'{key}_ms']:.3g} ({row[f'{key}_min_ms']:.3g})"
    return row.get(f'{key}_error', '-')


def _section(heading, note, head, rows):
    """A report section: its heading, a note and a markdown table (``head``: 'a | b | ...')."""
    return ['', heading, '', note, '', f'| {head} |', '|---' * len(head.split(' | ')) + '|'] + \
        [f"| {' | '.join(str(c) for c in row)} |" for row in rows]


def markdown(report) -> str:
    env, parts, stats = report['environment'], report['parts'], report['part_stats']
    c, comp = parts.get('core_speed') or {}, parts.get('compile') or []
    lines = [f"# GPU check: {env['device_name']}", '',
             f"torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, python "
             f"{env['python']}, {env['when']}; {_f(report['seconds'], '.0f')} s in all. "
             f"From the wheels: {', '.join(env['unpacked']) or 'nothing (the node had all)'}.", '',
             f"**{'PASS' if report['ok'] else 'FAIL'}**: " + (
                 'every correctness check holds.' if report['ok'] else
                 'failed: ' + '; '.join(report['failures']))]
    if report.get('skipped_parts'):
        lines += ['', 'Skipped (not failures): ' + '; '.join(report['skipped_parts']) + '.']
    if env['device'] == 'cpu':
        lines += ['', 'CPU dry run: timings are regression figures of this CPU, not GPU ones.']
    lines += _section(
        '## Parts: wall time and peak memory', f'Planned for parts a-e on one H100: '
        f"{sum(BUDGET_S.values())} s ({', '.join(f'{k} {v} s' for k, v in BUDGET_S.items())}).",
        'part | seconds | peak MiB | peak of',
        [[name, _f(s.get('seconds'), '.1f'), _f(s.get('peak_mib'), '.0f'), s.get('peak_of', '-')]
         for name, s in stats.items()])
    lines += _section('## Targets', 'Each GPU target, where this run measured it.',
                      'target | measured (worst) | met',
                      [[what, _f(value), '-' if met is None else 'yes' if met else 'NO']
                       for what, value, met in targets(parts)])
    lines += _section(
        '## a. Attention cores against float64 (forward and backward)',
        "Largest error relative to the float64 output's (gradients': each input's) largest "
        f"value; limits {CORE_TOL}.", 'core | precision | tokens | output | gradients | ok',
        [[r['core'], r['precision'], r['tokens'], _f(r.get('out_err')), _f(r.get('grad_err')),
          _verdict(r)] for r in parts.get('cores') or []])
    lines += _section(
        '## b. Backbone training step under autocast against fp32',
        f"||g - g_fp32|| / ||g_fp32|| over every parameter; limits {GRAD_TOL}.",
        'backbone | precision | input | finite | gradient error | loss error | ok',
        [[r['backbone'], r['precision'], f"{r['batch']}x{r['size']}^2", r.get('finite', '-'),
          _f(r.get('grad_err')), _f(r.get('loss_err')), _verdict(r)]
         for r in parts.get('amp_steps') or []])
    lines += _section(
        '## c. Cores at our backbones\' shapes and over a token sweep (forward + backward)',
        'Each core call of one forward of the tiny backbone at the input (batch x H x W; stage '
        '1-4; B: the batch the core sees, windows included; h heads, N tokens, N_kv keys, d head '
        'dim). fp32 (TF32 off), tf32 (CUDA), bf16 inputs (what autocast hands a core; the linear '
        'cores compute in fp32); the floor is Q (K^T V), SDPA torch\'s (flash in bf16 on CUDA), '
        f'at the same shape and precision. ms: median (min) of at least {MIN_REPS} repeats after a '
        f"warm-up ({'CUDA events' if env['device'] == 'cuda' else 'perf_counter'}); x floor / x "
        'SDPA: the core\'s median over theirs.',
        'source | input | stage | core | B x h x N x d (N_kv) | precision | core | floor | SDPA | '
        'x floor | x SDPA | fwd chunked / one piece',
        [[r['source'], r['input'], _f(r.get('stage')), r['core'],
          f"{r['batch']}x{r['heads']}x{r['tokens']}x{r['head_dim']} ({r['kv_tokens']})",
          r['precision'], _ms(r, 'core'), _ms(r, 'floor'), _ms(r, 'sdpa'), _f(r.get('vs_floor')),
          _f(r.get('vs_sdpa')),
          f"{r['fwd_chunked_ms']:.3g} / {r['fwd_unchunked_ms']:.3g} (chunk {r['chunk_tokens']}; "
          f"default here: {r['chunk_default']})" if 'fwd_unchunked_ms' in r
          else r.get('chunk_error', '-')] for r in c.get('rows', [])]
        + [[e['source'], e['input'], '', '', e['error']] + [''] * 7 for e in c.get('errors', [])])
    lines += _section(
        '### c. Accuracy', 'Each core\'s output (no-autograd path, one image of the batch) against '
        'the same core in float64 on the same inputs (bf16: the bf16-rounded inputs); largest '
        f'error relative to the largest float64 value; limits {CORE_TOL}.',
        'source | input | stage | core | B x h x N x d | precision | error | limit | ok',
        [[r['source'], r['input'], _f(r.get('stage')), r['core'],
          f"1x{r['heads']}x{r['tokens']}x{r['head_dim']}", r['precision'], _f(r.get('err')),
          f"{r['limit']:g}", _verdict(r)] for r in c.get('accuracy', [])])
    lines += _section(
        '## d. Backbones, forward + backward (loss: mean square of the outputs)',
        'Ours: the backbone up to its last stage, without the output norm (out_indices=(3,), '
        'out_norm=False); the authors\' and timm\'s: their classifiers\' forward_features (their '
        'final norm, no classifier; MALA\'s keeps its 1x1 projection to 2048 channels), at the '
        'classification size only. ms: median (min).',
        'model | input | fp32 ms | bf16 ms | fp32 MiB | bf16 MiB | bf16/fp32 memory | ours vs '
        'authors (fp32, bf16)',
        [[r['model'], f"{r['batch']}x{r['size']}"] + (
            [f"skipped: {r['skipped']}" if r.get('skipped') else r.get('error')] + [''] * 5
            if 'bf16_mib' not in r or 'error' in r else
            [_ms(r, 'fp32'), _ms(r, 'bf16'), _f(r['fp32_mib'], '.0f'), _f(r['bf16_mib'], '.0f'),
             _f(r.get('bf16_mem_ratio'), '.2f'),
             f"{r['speedup_vs_authors']:.2f}x, {r['bf16_speedup_vs_authors']:.2f}x"
             if 'speedup_vs_authors' in r else ''])
         for r in parts.get('backbone_speed') or []])
    lines += _section(
        f"## e. torch.compile (inference, fp32, backend "
        f"{', '.join(sorted({r.get('backend', '') for r in comp}))})",
        'After one probe compile with the same backend on the same device; where the backend '
        'cannot run here the rows are skipped with the reason (not a failure). Largest error '
        f'relative to eager\'s largest output value; limit {COMPILE_TOL}.',
        'backbone | input | first call s | error | eager ms | compiled ms | ok',
        [[r['backbone'], f"{r['batch']}x{r['size']}^2", _f(r.get('compile_s'), '.1f'),
          _f(r.get('err'), '.1e'), _f(r.get('eager_ms'), '.1f'), _f(r.get('compiled_ms'), '.1f'),
          _verdict(r)] for r in comp])
    det = parts.get('detectors') or dict(skipped='not run', rows=[])
    lines += ['', '## f. Detector and segmentor steps (benchmark_step.py)', '']
    if det['skipped']:
        lines.append(f"Skipped: {det['skipped']}.")
    for r in det['rows']:
        lines += [f"`{r['config']}` {r['amp'] or ''}: exit {r['rc']}, {_f(r.get('seconds'), '.0f')}"
                  ' s', '', '```', json.dumps(r['result'], indent=1)[:1500] if 'result' in r
                  else r.get('tail') or r.get('skipped', ''), '```']
    return '\n'.join(lines) + '\n'


# --- the run ---
def check_args(args):
    """The refusal before any work, as one line, or None."""
    if not re.fullmatch(r'cpu|cuda(:\d+)?', args.device):
        return f'--device {args.device!r}: choose {DEVICE_CHOICES}'
    for opt, clone in (('inline_repo', 'LeapLabTHU/InLine'), ('mala_repo', 'qhfan/MALA')):
        repo = getattr(args, opt)
        if repo is not None and not osp.isdir(repo):
            return (f'--{opt.replace("_", "-")} {repo}: no such folder; give the root of a clone '
                    f'of {clone}, or leave the option out (part d then skips the authors\' rows)')
    if not args.parts or set(args.parts) - set('abcde'):
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
        with unpack as target:
            unpacked = unpack_missing(args.wheels, target)  # before torch, which looks for numpy
            problems = import_problems(list(NODE_MODULES) + list(WHEEL_MODULES), [target, ROOT])
            for line in explain_import_problems(problems, args.wheels):
                tool_error(line)
            if problems:
                return 2
            sys.path[:0] = [target, ROOT]
            return _run(args, start, unpacked, target)
    finally:
        sys.path[:] = saved_path
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGTERM, saved_term)


def _run(args, start, unpacked, target) -> int:
    """The check itself, the wheels unpacked into ``target`` and first on ``sys.path``."""
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
    for family, opt in AUTHORS.values():  # the clones hold the authors' files
        why = getattr(args, opt) and authors_repo_problem(family, getattr(args, opt))
        if why:
            return tool_error(f'--{opt.replace("_", "-")}: {why}; give the root of a clone of '
                              'the authors\' repository')
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    small, log = args.quick, functools.partial(print, flush=True)
    TIMING['target_s'] = 0.02 if small else 0.1
    letters = ''.join(p for p in 'abcde' if p in args.parts)
    wanted = [PARTS[p] for p in letters] + ['detectors']
    plan = {k: v for k, v in BUDGET_S.items() if k in wanted}
    log(f"planned on one H100: parts {letters} in {sum(plan.values())} s "
        f"({', '.join(f'{k} {v} s' for k, v in plan.items())})"
        + ('; part f: up to 5 min per config' if args.detectors else '') +
        (' - this run: the quick dry-run sizes' if small else ''))
    budget = {} if small else BUDGET_S
    steps = {'cores': lambda: part_cores(device, small, log),
             'amp_steps': lambda: part_amp_steps(device, small, log),
             'core_speed': lambda: part_core_speed(device, small, log, budget.get('core_speed')),
             'backbone_speed': lambda: part_backbone_speed(device, small, args, log,
                                                           budget.get('backbone_speed')),
             'compile': lambda: [] if args.no_compile else part_compile(
                 device, small, args.compile_backend, log, budget.get('compile')),
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
        failures += [' '.join(filter(None, (f'{name}:', r.get('core') or r.get('backbone'),
                                            r.get('precision'), r.get('error', 'over its limit'))))
                     for r in parts.get(name, []) if not r['ok']]
    failures += [f"core_speed: {r['core']} {r['precision']} at {r['source']} {r['input']} "
                 f"N={r['tokens']}: {r.get('error') or 'error %.2g over its limit' % r['err']}"
                 for r in parts.get('core_speed', {}).get('accuracy', []) if not r['ok']]
    compile_skip = next((r['skipped'] for r in parts.get('compile', []) if r.get('skipped')), None)
    triton = None
    with contextlib.suppress(Exception):
        import triton as _triton
        triton = _triton.__version__
    report = dict(environment=dict(
        device=device.type, device_name=torch.cuda.get_device_name(device)
        if device.type == 'cuda' else f'CPU ({platform.processor() or platform.machine()}, '
                                      f'{torch.get_num_threads()} threads)',
        torch=torch.__version__, cuda=torch.version.cuda, triton=triton,
        python=platform.python_version(), unpacked=unpacked, unpacked_into=target,
        when=time.strftime('%Y-%m-%d %H:%M')), parts=parts, part_stats=stats, failures=failures,
        skipped_parts=[f'{name}: {why}' for name, why in (('compile', compile_skip),
                                                          ('detectors', det['skipped'])) if why],
        ok=not failures, seconds=time.perf_counter() - start)
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
                   help='torch.compile backend of part e (aot_eager: dynamo and AOT autograd '
                        'without inductor\'s code generation, minutes per backbone on a CPU)')
    r.add_argument('--inline-repo', help='a clone of LeapLabTHU/InLine (their model files)')
    r.add_argument('--mala-repo', help='a clone of qhfan/MALA')
    args = p.parse_args(argv)
    return fetch(args) if args.command == 'fetch' else run(args)


if __name__ == '__main__':
    sys.exit(main())
