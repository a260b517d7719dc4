"""What the benchmark tools share: the machine named beside every figure, timing, memory, results
files, fresh processes, mmdet's reference backbones, the config matrix, synthetic batches, and one
measured training step + inference of a whole config (:func:`measure_one`)."""
import functools
import json
import os
import os.path as osp
import platform
import re
import resource
import statistics
import subprocess
import sys
import time

import torch

from mmlinattn.core.families import FAMILIES
from mmlinattn.paths import resource_root

#: where configs/ is: the checkout, or the installed package's .mim folder (mmlinattn.paths)
ROOT = resource_root()
#: the config matrix: one folder of configs/ per family, in the family table's order
CONFIG_DIRS = tuple(FAMILIES)
# our backbone in a config name, e.g. "mavit-t": (family prefix, arch letter)
BACKBONE_IN_NAME = re.compile('(' + '|'.join(f.prefix for f in FAMILIES.values()) + r')-([a-z])')


@functools.lru_cache(None)
def cpu_info() -> dict:
    """The CPU's model name and flags (/proc/cpuinfo, else lscpu, else the platform's)."""
    fields = {}
    for cmd in (['cat', '/proc/cpuinfo'], ['lscpu']):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True).stdout
        except OSError:
            continue
        for line in out.splitlines():
            key, _, value = line.partition(':')
            fields.setdefault(key.strip().lower(), value.strip())
    return dict(model_name=fields.get('model name') or platform.processor() or platform.machine(),
                flags=set(fields.get('flags', '').split()), cores=os.cpu_count())


def where(device='cpu') -> str:
    """The machine the figures come from, printed beside them."""
    device = torch.device(device)
    name = (torch.cuda.get_device_name(device) if device.type == 'cuda' else
            f'CPU: {cpu_info()["model_name"]}, {torch.get_num_threads()} threads')
    return f'{name}; torch {torch.__version__}'


def synced(fn, device):
    """``fn`` that returns once its work is done (on CUDA it synchronizes)."""
    if torch.device(device).type != 'cuda':
        return fn

    def run():
        out = fn()
        torch.cuda.synchronize(device)
        return out
    return run


def once(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def timeit(fn, min_time: float = 0.3, max_reps: int = 50) -> float:
    """Best wall time of ``fn()`` over repetitions (after one warm-up call), in seconds."""
    fn()
    reps, total, best = 0, 0.0, float('inf')
    while reps < max_reps and (total < min_time or reps < 3):
        dt = once(fn)
        best, total, reps = min(best, dt), total + dt, reps + 1
        if dt > 2.0:
            break
    return best


def rounds(ops: dict, repeats: int = 1, time_one=once, rotate: bool = False) -> dict:
    """``{name: [time_one(op) per round]}``, the ops (name -> callable) interleaved in each round so
    that all see the same machine state; ``rotate``: each round starts one op later."""
    names, times = list(ops), {n: [] for n in ops}
    for r in range(repeats):
        k = r % len(names) if rotate else 0
        for n in names[k:] + names[:k]:
            times[n].append(time_one(ops[n]))
    return times


def peak_memory(fn) -> int:
    """Peak bytes that ``fn()`` allocates beyond what existed when it started (CPU: torch profiler
    memory events; CUDA: the caching allocator's peak)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        fn()
    # an event's cpu_memory_usage includes what the ops it calls allocate, so a sum of those counts
    # one allocation once per enclosing op: walk the self (exclusive) figures in time order instead
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage),
                    key=lambda e: e.time_range.start)
    cur = peak = 0
    for e in events:
        cur += e.self_cpu_memory_usage
        peak = max(peak, cur)
    return peak


def status_kb(key: str) -> float:
    """A figure of ``/proc/self/status`` in KB (``VmRSS``, ``VmHWM``, ...)."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return float(line.split()[1])
    raise KeyError(key)


def peak_rss_kb() -> float:
    """This process's peak resident memory in KB: VmHWM (``ru_maxrss`` is inherited across fork +
    exec: a child would report a large parent's peak), else ``ru_maxrss``."""
    try:
        return status_kb('VmHWM')
    except (OSError, KeyError):
        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def save(stem: str, data, md: str = None) -> None:
    """``stem``.json and, with ``md``, ``stem``.md."""
    os.makedirs(osp.dirname(osp.abspath(stem)), exist_ok=True)
    with open(stem + '.json', 'w') as f:
        json.dump(data, f, indent=1)
    if md is not None:
        with open(stem + '.md', 'w') as f:
            f.write(md + '\n')


def result(obj) -> None:
    """Print ``obj`` as the result line :func:`in_fresh_process` reads."""
    print('RESULT ' + json.dumps(obj), flush=True)


def in_fresh_process(script: str, argv, **env):
    """``python script *argv`` in a fresh process (its own peak memory): (the object of its last
    :func:`result` line or None if it failed, the process, stdout and stderr in ``stdout``)."""
    proc = subprocess.run([sys.executable, script, *map(str, argv)], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env={**os.environ, **env})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('RESULT ')]
    return (json.loads(lines[-1][7:]) if proc.returncode == 0 and lines else None), proc


def plot(path: str, curves: list, xlabel: str, title: str, xbase: float = 10) -> None:
    """Two log-log panels: ``curves`` of (label, style, [(x, ms)], [(x, MB)])."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, style, *series in curves:
        for ax, pts in zip(axes, series):
            if pts:
                ax.plot(*zip(*pts), style, label=label)
    for ax, lab, what in zip(axes, ('time (ms)', 'peak extra memory (MB)'), (title, 'peak memory')):
        ax.set(xlabel=xlabel, ylabel=lab, title=what)
        ax.set_xscale('log', base=xbase)
        ax.set_yscale('log')
        ax.grid(True, which='both', alpha=.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


#: mmdet's backbones ours are measured against: name -> (type, kwargs, channels of the four stages)
REFERENCE_BACKBONES = {
    'Swin-T': ('mmdet.SwinTransformer',
               dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7,
                    drop_path_rate=0.2, convert_weights=False),
               [96, 192, 384, 768]),
    'PVT-S': ('mmdet.PyramidVisionTransformer', dict(num_layers=[3, 4, 6, 3], drop_path_rate=0.1),
              [64, 128, 320, 512]),
    'PVT-T': ('mmdet.PyramidVisionTransformer', dict(num_layers=[2, 2, 2, 2], drop_path_rate=0.1),
              [64, 128, 320, 512]),
    'ResNet-18': ('mmdet.ResNet', dict(depth=18, num_stages=4, frozen_stages=-1, style='pytorch',
                                       norm_cfg=dict(type='BN', requires_grad=True),
                                       norm_eval=False),
                  [64, 128, 256, 512]),
}
#: the reference rows of the step benchmarks (their two ratio columns)
REFERENCES = {k: REFERENCE_BACKBONES[k] for k in ('Swin-T', 'PVT-S')}


def reference_cfg(name: str, **overrides) -> dict:
    """The backbone config of mmdet's backbone ``name``."""
    kind, kwargs, _ = REFERENCE_BACKBONES[name]
    return dict(type=kind, **{**kwargs, **overrides})


def build_reference(name: str, **overrides):
    """mmdet's backbone ``name``, built from its registry."""
    from mmdet.registry import MODELS
    cfg = reference_cfg(name, init_cfg=None, **overrides)
    cfg['type'] = cfg['type'].split('.')[-1]
    return MODELS.build(cfg)


def family_in_name(name):
    """(family row, arch letter) of the backbone a config name names, or None."""
    m = BACKBONE_IN_NAME.search(name)
    if m is None:
        return None
    return next(f for f in FAMILIES.values() if f.prefix == m.group(1)), m.group(2)


def recipe_name(name):
    """The config name without its backbone (rows of one detector / segmentor share it)."""
    return BACKBONE_IN_NAME.sub('{}', name)


def _smallest_first(name):
    """Sort key: the arch's place in its family's table (smallest first), then the name."""
    found = family_in_name(name)
    letters = list(found[0].archs) if found else []
    return (letters.index(found[1]), name) if found and found[1] in letters else (99, name)


def matrix_cells():
    """The config matrix on disk: {recipe: the smallest variant of each family that has it}."""
    cells = {}
    for family in CONFIG_DIRS:
        folder = osp.join('configs', family)
        for name in sorted(os.listdir(osp.join(ROOT, folder)), key=_smallest_first):
            if BACKBONE_IN_NAME.search(name) and name.endswith('.py'):
                cells.setdefault(recipe_name(name), {}).setdefault(family, osp.join(folder, name))
    return {recipe: list(fams.values()) for recipe, fams in sorted(cells.items())}


def matrix_configs():
    return [cfg for cfgs in matrix_cells().values() for cfg in cfgs]


def reference_jobs():
    """(config, reference): per recipe, its first smallest config with each reference backbone."""
    return [(cfgs[0], ref) for cfgs in matrix_cells().values() for ref in REFERENCES]


def swap_backbone(cfg, ref):
    """mmdet's backbone ``ref`` into the config, and its channels into the neck or heads."""
    ch = REFERENCE_BACKBONES[ref][2]
    out_indices = tuple(cfg.model.backbone.get('out_indices', (0, 1, 2, 3)))
    cfg.model.backbone = reference_cfg(ref, out_indices=out_indices, init_cfg=None)
    used = [ch[i] for i in out_indices]
    if cfg.model.get('neck') and 'in_channels' in cfg.model.neck:
        cfg.model.neck.in_channels = used
    elif cfg.model.get('decode_head'):  # no neck (UperNet): the heads read the backbone directly
        cfg.model.decode_head.in_channels = used
        if cfg.model.get('auxiliary_head'):
            cfg.model.auxiliary_head.in_channels = ch[2]


def _scales(cfg, size=None):
    """(train hw, test hw) at the config's real scale, or both ``size`` (H, W) if given."""
    if size:
        if cfg.default_scope == 'mmseg' and cfg.model.data_preprocessor.get('size'):
            cfg.model.data_preprocessor.size = tuple(size)  # it pads every input to this size
        return tuple(size), tuple(size)
    if cfg.default_scope == 'mmseg':
        size = tuple(cfg.model.data_preprocessor.get('size') or (512, 512))
        return size, size
    return (800, 1333), (800, 1333)


def det_batch(n, hw, with_mask, num_classes=80):
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(0)
    h, w = hw
    inputs, samples = [], []
    for _ in range(n):
        s = DetDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw,
                                        scale_factor=(1., 1.), batch_input_shape=hw))
        boxes = torch.tensor([[0.1 * w, 0.1 * h, 0.4 * w, 0.5 * h],
                              [0.5 * w, 0.3 * h, 0.9 * w, 0.9 * h],
                              [0.2 * w, 0.6 * h, 0.35 * w, 0.8 * h]])
        inst = InstanceData(bboxes=boxes, labels=torch.tensor([0, 5, 17]) % num_classes)
        if with_mask:
            masks = torch.zeros(3, h, w, dtype=torch.uint8)
            for j, (x0, y0, x1, y1) in enumerate(boxes.int().tolist()):
                masks[j, y0:y1, x0:x1] = 1
            inst.masks = BitmapMasks(masks.numpy(), h, w)
        s.gt_instances = inst
        inputs.append(torch.randint(0, 255, (3, *hw), dtype=torch.uint8, generator=g))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


def seg_batch(n, hw):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    g = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(n):
        s = SegDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw))
        s.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, *hw), generator=g))
        inputs.append(torch.randint(0, 255, (3, *hw), dtype=torch.uint8, generator=g))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


def same_head_work(test_cfg) -> None:
    """A detector's test-time heads drop no proposal or detection (score threshold, NMS), so that
    they do the same work behind every (randomly initialised) backbone."""
    for part in (test_cfg, (test_cfg or {}).get('rpn'), (test_cfg or {}).get('rcnn')):
        if part and 'score_thr' in part:
            part['score_thr'] = 0.0
        if part and isinstance(part.get('nms'), dict):
            part['nms']['iou_threshold'] = 1.0


def build_untrained(cfg):
    """The model of the Config ``cfg`` (its backbone's ``init_cfg`` set to None in ``cfg``: no
    ImageNet weights), built by its scope's registry, SyncBN reverted to BN; in training mode, not
    initialised. :mod:`.flops` and :mod:`.deploy` build with it too."""
    from mmengine.model import revert_sync_batchnorm

    from mmlinattn.core.registry import model_registry
    backbone = cfg.model.get('backbone')
    if isinstance(backbone, dict):
        backbone['init_cfg'] = None
    return revert_sync_batchnorm(model_registry(cfg).build(cfg.model))


def bench_model(config, ref=None, device='cpu', amp=False, batch=None, size=None, compiled=False,
                fixed_heads=False):
    """The model of ``config`` (optionally with a reference backbone) and its optimizer: a namespace
    with ``train_step()`` (on a synthetic batch of ``n`` at ``train_hw``; returns the log_vars),
    ``infer()`` (predict on one image at ``test_hw``), ``infer_backbone()``, ``params_m``."""
    from types import SimpleNamespace

    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    cfg = Config.fromfile(osp.join(ROOT, config))
    if ref:
        swap_backbone(cfg, ref)
    train_hw, test_hw = _scales(cfg, size)
    if fixed_heads:
        same_head_work(cfg.model.get('test_cfg'))
    model = build_untrained(cfg).to(device)
    model.init_weights()
    if compiled:
        model.backbone = torch.compile(model.backbone)
    n = batch or cfg.train_dataloader.batch_size
    det = cfg.default_scope == 'mmdet'
    classes = min(map(int, re.findall(r"'num_classes': (\d+)", str(cfg.model))), default=80)
    make = (lambda k, hw: det_batch(k, hw, 'mask_head' in str(cfg.model), classes)) if det else \
        seg_batch
    ow_cfg = dict(cfg.optim_wrapper)
    if amp and device == 'cuda':
        ow_cfg.update(type='AmpOptimWrapper', loss_scale='dynamic')
    optim = build_optim_wrapper(model, ow_cfg)
    autocast = lambda: torch.autocast(device, enabled=amp,  # noqa: E731
                                      dtype=torch.float16 if device == 'cuda' else torch.bfloat16)

    def train_step():
        model.train()
        data = model.data_preprocessor(make(n, train_hw), True)
        with autocast():
            loss, log_vars = model.parse_losses(model(**data, mode='loss'))
        optim.update_params(loss)
        return log_vars

    test = make(1, test_hw)
    test_inputs = []  # the preprocessed test image, made once: only the backbone is timed

    def infer():
        model.eval()
        with torch.no_grad(), autocast():
            model(**model.data_preprocessor(test, False), mode='predict')

    def infer_backbone():
        model.eval()
        with torch.no_grad(), autocast():
            if not test_inputs:
                test_inputs.append(model.data_preprocessor(test, False)['inputs'])
            model.backbone(test_inputs[0])
    return SimpleNamespace(cfg=cfg, model=model, optim=optim, train_step=train_step, infer=infer,
                           infer_backbone=infer_backbone, n=n, train_hw=train_hw, test_hw=test_hw,
                           make=make, params_m=sum(p.numel() for p in model.parameters()) / 1e6)


def _round(x, digits):
    return None if x is None else round(x, digits)


def measure_one(config, ref=None, device='cpu', amp=False, batch=None, warmup=1, size=None,
                compiled=False, train=True, infer_reps=1, fixed_heads=False):
    """One training step (``train``) after ``warmup`` untimed ones and one inference: time and peak
    memory (CUDA: torch's; CPU: the growth of the peak RSS after building). ``infer_reps`` > 1:
    median inference time of that many, and the backbone alone timed the same way."""
    bench = bench_model(config, ref, device, amp, batch, size, compiled, fixed_heads)
    if compiled:
        warmup = max(warmup, 1)  # the first call compiles
    cuda = device == 'cuda'

    def timed(fn, untimed):
        base_rss = peak_rss_kb() / 1024  # after building the model, before any step
        for _ in range(untimed):
            fn()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        seconds = once(synced(fn, device))
        peak = (torch.cuda.max_memory_allocated() / 2 ** 20 if cuda
                else peak_rss_kb() / 1024 - base_rss)
        return seconds, peak

    t_train, mem_train = timed(bench.train_step, warmup) if train else (None, None)
    t_infer, mem_infer = timed(bench.infer, 1)
    t_backbone = None
    if infer_reps > 1:
        t_infer = statistics.median([t_infer] + [timed(bench.infer, 0)[0]
                                                 for _ in range(infer_reps - 1)])
        t_backbone = statistics.median([timed(bench.infer_backbone, 1 if i == 0 else 0)[0]
                                        for i in range(infer_reps)])
    return dict(config=osp.basename(config)[:-3], backbone=ref or bench.cfg.model.backbone.type,
                params_m=round(bench.params_m, 2), batch=bench.n, train_hw=list(bench.train_hw),
                test_hw=list(bench.test_hw), size=list(size) if size else None, compiled=compiled,
                train_s=_round(t_train, 3), infer_s=round(t_infer, 3),
                infer_backbone_s=_round(t_backbone, 3), infer_reps=infer_reps,
                fixed_heads=fixed_heads, train_mem_mb=_round(mem_train, 1),
                infer_mem_mb=_round(mem_infer, 1) if cuda else None, device=device, amp=amp,
                threads=torch.get_num_threads(), where=where(device))


def infer_together(jobs, device='cpu', size=None, reps=5) -> list:
    """Inference (whole, then the backbone alone) of the (config, reference) ``jobs``, all built in
    ONE process with the same head work and timed in turn, rotating: medians of ``reps``. (Separate
    processes time the same heads up to ~25 % apart on a shared machine.)"""
    benches = [(config, ref, bench_model(config, ref, device, size=size, fixed_heads=True))
               for config, ref in jobs]
    for _, _, b in benches:  # warm-up: one call of each
        b.infer()
        b.infer_backbone()
    times = rounds({i: b for i, (_, _, b) in enumerate(benches)}, reps, rotate=True,
                   time_one=lambda b: [once(synced(fn, device))
                                       for fn in (b.infer, b.infer_backbone)])
    return [dict(config=osp.basename(config)[:-3], backbone=ref or b.cfg.model.backbone.type,
                 params_m=round(b.params_m, 2), test_hw=list(b.test_hw),
                 infer_s=round(statistics.median(t[0] for t in times[i]), 3),
                 infer_backbone_s=round(statistics.median(t[1] for t in times[i]), 3),
                 infer_reps=reps, fixed_heads=True, together=True, train_s=None,
                 train_mem_mb=None, batch=None, size=list(size) if size else None, device=device,
                 threads=torch.get_num_threads(), where=where(device))
            for i, (config, ref, b) in enumerate(benches)]
