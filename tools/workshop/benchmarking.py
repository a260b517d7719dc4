"""What the benchmark tools share (tools/analysis_tools/benchmark*.py,
from_scratch_study.py): timing and memory helpers, mmdet's reference backbones (Swin-T, PVT-S)
defined once, the config matrix as it is on disk, synthetic detection / segmentation batches, and
one measured training step + inference of a whole config (:func:`measure_one`).

Nothing here runs at import; the tools are thin command lines over it.
"""
import os
import os.path as osp
import platform
import re
import resource
import statistics
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


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo, else the platform's), printed beside timings."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or 'unknown CPU'


def timeit(fn, min_time: float = 0.3, max_reps: int = 50) -> float:
    """Best wall time of ``fn()`` over repetitions (after one warm-up call), in seconds."""
    fn()
    reps, total, best = 0, 0.0, float('inf')
    while reps < max_reps and (total < min_time or reps < 3):
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, total, reps = min(best, dt), total + dt, reps + 1
        if dt > 2.0:
            break
    return best


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


#: mmdet's own backbones that our families are measured against: name -> (type, kwargs, channels of
#: the four stages). Swin-T and PVT-S have the sizes of InLine-Swin-T / InLine-PVT-S (the papers'
#: baselines); PVT-T and ResNet-18 serve the from-scratch study.
REFERENCE_BACKBONES = {
    'Swin-T': ('mmdet.SwinTransformer',
               dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7,
                    drop_path_rate=0.2, convert_weights=False),
               [96, 192, 384, 768]),
    'PVT-S': ('mmdet.PyramidVisionTransformer', dict(num_layers=[3, 4, 6, 3], drop_path_rate=0.1),
              [64, 128, 320, 512]),
    'PVT-T': ('mmdet.PyramidVisionTransformer', dict(num_layers=[2, 2, 2, 2], drop_path_rate=0.1),
              [64, 128, 320, 512]),
    'ResNet-18': ('mmdet.ResNet', dict(depth=18, num_stages=4, frozen_stages=-1,
                                       norm_cfg=dict(type='BN',
                                                     requires_grad=True), norm_eval=False,
                                       style='pytorch'),
                  [64, 128, 256, 512]),
}
#: the reference rows of the step benchmarks (their two ratio columns)
REFERENCES = {k: REFERENCE_BACKBONES[k] for k in ('Swin-T', 'PVT-S')}


def reference_cfg(name: str, **overrides) -> dict:
    """The backbone config of mmdet's backbone ``name`` (a key of :data:`REFERENCE_BACKBONES`)."""
    kind, kwargs, _ = REFERENCE_BACKBONES[name]
    return dict(type=kind, **{**kwargs, **overrides})


def build_reference(name: str, **overrides):
    """mmdet's backbone ``name`` (a key of :data:`REFERENCE_BACKBONES`), built from its registry."""
    from mmdet.registry import MODELS
    cfg = reference_cfg(name, init_cfg=None, **overrides)
    cfg['type'] = cfg['type'].split('.')[-1]
    return MODELS.build(cfg)


def matrix_cells():
    """The config matrix as it is on disk: {recipe: the smallest variant of each family that has
    it}, recipes in name order, families in folder order."""
    cells = {}
    for family in CONFIG_DIRS:
        folder = osp.join('configs', family)
        for name in sorted(os.listdir(osp.join(ROOT, folder)), key=_smallest_first):
            if BACKBONE_IN_NAME.search(name) and name.endswith('.py'):
                cells.setdefault(recipe_name(name), {}).setdefault(family, osp.join(folder, name))
    return {recipe: list(fams.values()) for recipe, fams in sorted(cells.items())}


def family_in_name(name):
    """(family row, arch letter) of the backbone a config name names (``mask-rcnn_mavit-t_...``:
    MAViT's row and ``'t'``), or None."""
    m = BACKBONE_IN_NAME.search(name)
    if m is None:
        return None
    return next(f for f in FAMILIES.values() if f.prefix == m.group(1)), m.group(2)


def _smallest_first(name):
    """Sort key: the arch's place in its family's arch table (smallest first), then the name."""
    found = family_in_name(name)
    if found:
        fam, letter = found
        letters = list(fam.archs)
        if letter in letters:
            return (letters.index(letter), name)
    return (99, name)


def matrix_configs():
    return [cfg for cfgs in matrix_cells().values() for cfg in cfgs]


def reference_jobs():
    """(config, reference name): per detector / segmentor recipe, its first family's smallest config
    with each reference backbone."""
    return [(cfgs[0], ref) for cfgs in matrix_cells().values() for ref in REFERENCES]


def swap_backbone(cfg, ref):
    ch = REFERENCE_BACKBONES[ref][2]
    old = cfg.model.backbone
    out_indices = tuple(old.get('out_indices', (0, 1, 2, 3)))
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


def det_batch(n, hw, with_mask):
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(n):
        s = DetDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw,
                                        scale_factor=(1., 1.),
                                        batch_input_shape=hw))
        h, w = hw
        boxes = torch.tensor([[0.1 * w, 0.1 * h, 0.4 * w, 0.5 * h],
                              [0.5 * w, 0.3 * h, 0.9 * w, 0.9 * h],
                              [0.2 * w, 0.6 * h, 0.35 * w, 0.8 * h]])
        inst = InstanceData(bboxes=boxes, labels=torch.tensor([0, 5, 17]))
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


def peak_rss_kb() -> float:
    """This process's peak resident memory in KB: Linux's VmHWM (its own address space's high-water
    mark; ``ru_maxrss`` is inherited across fork + exec, so a child started by a large parent would
    report the parent's peak), else ``ru_maxrss``."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def same_head_work(test_cfg) -> None:
    """Make a detector's test-time heads do the same work whatever its backbone outputs: no
    proposal or detection is dropped by a score threshold or by NMS, so the RPN hands on its full
    ``max_per_img`` proposals and the box / mask heads run on ``max_per_img`` detections. (With
    randomly initialised weights the kept counts otherwise differ from model to model and from run
    to run, and with them the heads' time.)"""
    if not test_cfg:
        return
    for part in (test_cfg, test_cfg.get('rpn'), test_cfg.get('rcnn')):
        if not part:
            continue
        if 'score_thr' in part:
            part['score_thr'] = 0.0
        if isinstance(part.get('nms'), dict):
            part['nms']['iou_threshold'] = 1.0


def bench_model(config, ref=None, device='cpu', amp=False, batch=None, size=None, compiled=False,
                fixed_heads=False):
    """The model of ``config`` (optionally with a reference backbone) built as the benchmarks time
    it, with its optimizer: a namespace with ``model``, ``train_step()`` (forward + backward +
    optimizer step on a synthetic batch at the training scale), ``infer()`` (predict on one image at
    the test scale), ``infer_backbone()`` (the backbone alone on that image), ``n`` (images per
    training step), ``train_hw``, ``test_hw`` and ``params_m``. ``fixed_heads``: the detector's
    test-time heads do the same work for every backbone (:func:`same_head_work`)."""
    from types import SimpleNamespace

    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.optim import build_optim_wrapper

    from mmlinattn.core.registry import model_registry
    cfg = Config.fromfile(osp.join(ROOT, config))
    cfg.model.backbone.init_cfg = None
    if ref:
        swap_backbone(cfg, ref)
    train_hw, test_hw = _scales(cfg, size)
    if fixed_heads:
        same_head_work(cfg.model.get('test_cfg'))
    models = model_registry(cfg)
    model = revert_sync_batchnorm(models.build(cfg.model)).to(device)
    model.init_weights()
    if compiled:
        model.backbone = torch.compile(model.backbone)
    n = batch or cfg.train_dataloader.batch_size
    det = cfg.default_scope == 'mmdet'
    make = (lambda k, hw: det_batch(k, hw, 'mask_head' in str(cfg.model))) if det else seg_batch
    ow_cfg = dict(cfg.optim_wrapper)
    if amp and device == 'cuda':
        ow_cfg.update(type='AmpOptimWrapper', loss_scale='dynamic')
    optim = build_optim_wrapper(model, ow_cfg)
    ac_dtype = torch.float16 if device == 'cuda' else torch.bfloat16

    def train_step():
        model.train()
        data = model.data_preprocessor(make(n, train_hw), True)
        with torch.autocast(device, dtype=ac_dtype, enabled=amp):
            losses = model(**data, mode='loss')
            loss, _ = model.parse_losses(losses)
        optim.update_params(loss)

    test = make(1, test_hw)

    def infer():
        model.eval()
        with torch.no_grad(), torch.autocast(device, dtype=ac_dtype, enabled=amp):
            model(**model.data_preprocessor(test, False), mode='predict')

    test_inputs = []  # the preprocessed test image, made once: only the backbone is timed

    def infer_backbone():
        model.eval()
        with torch.no_grad(), torch.autocast(device, dtype=ac_dtype, enabled=amp):
            if not test_inputs:
                test_inputs.append(model.data_preprocessor(test, False)['inputs'])
            model.backbone(test_inputs[0])
    return SimpleNamespace(cfg=cfg, model=model, optim=optim, train_step=train_step, infer=infer,
                           infer_backbone=infer_backbone, n=n, train_hw=train_hw, test_hw=test_hw,
                           make=make,
                           params_m=sum(p.numel() for p in model.parameters()) / 1e6)


def measure_one(config, ref=None, device='cpu', amp=False, batch=None, warmup=1, size=None,
                compiled=False, train=True, infer_reps=1, fixed_heads=False):
    """Time one training step (unless ``train`` is False) and one inference of
    :func:`bench_model`'s model after ``warmup`` untimed steps; returns a dict. ``infer_reps`` > 1:
    the inference time is the median of that many, and the backbone alone is timed the same way
    (``infer_backbone_s``)."""
    bench = bench_model(config, ref, device, amp, batch, size, compiled, fixed_heads)
    if compiled:
        warmup = max(warmup, 1)  # the first call compiles
    cuda = device == 'cuda'

    def timed(fn, untimed):
        """Run ``fn`` ``untimed`` times, then once timed: (seconds, peak memory in MB)."""
        base_rss = peak_rss_kb() / 1024  # after building the model, before any step
        for _ in range(untimed):
            fn()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated() / 2 ** 20 if cuda
                else peak_rss_kb() / 1024 - base_rss)
        return seconds, peak

    t_train, mem_train = timed(bench.train_step, warmup) if train else (None, None)
    t_infer, mem_infer = timed(bench.infer, 1)
    mem_infer = mem_infer if cuda else None
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
                fixed_heads=fixed_heads,
                train_mem_mb=_round(mem_train, 1), infer_mem_mb=_round(mem_infer, 1),
                device=device, amp=amp, threads=torch.get_num_threads())


def infer_together(jobs, device='cpu', size=None, reps=5) -> list:
    """Inference of several detectors / segmentors built in ONE process, with the same head work
    (:func:`same_head_work`), timed in turn: each repetition runs every model once (whole
    ``predict`` and the backbone alone), in an order that rotates; the medians are returned. In
    separate processes the same heads on the same work differ by up to ~25 % between processes on
    a shared machine; here every model sees the same process and machine state. ``jobs``: (config,
    reference backbone or None) pairs."""
    benches = [(config, ref, bench_model(config, ref, device, size=size, fixed_heads=True))
               for config, ref in jobs]
    for _, _, b in benches:  # warm-up: one call of each
        b.infer()
        b.infer_backbone()
    times = {i: ([], []) for i in range(len(benches))}
    for rep in range(reps):
        order = list(range(len(benches)))
        order = order[rep % len(order):] + order[:rep % len(order)]
        for i in order:
            b = benches[i][2]
            for j, fn in enumerate((b.infer, b.infer_backbone)):
                t = time.perf_counter()
                fn()
                if device == 'cuda':
                    torch.cuda.synchronize()
                times[i][j].append(time.perf_counter() - t)
    return [dict(config=osp.basename(config)[:-3], backbone=ref or b.cfg.model.backbone.type,
                 params_m=round(b.params_m, 2), test_hw=list(b.test_hw),
                 infer_s=round(statistics.median(times[i][0]), 3),
                 infer_backbone_s=round(statistics.median(times[i][1]), 3), infer_reps=reps,
                 fixed_heads=True, together=True, train_s=None, train_mem_mb=None, batch=None,
                 size=list(size) if size else None, device=device,
                 threads=torch.get_num_threads())
            for i, (config, ref, b) in enumerate(benches)]


def _round(x, digits):
    return None if x is None else round(x, digits)


def recipe_name(name):
    """The config name without its backbone: rows of the same detector / segmentor share it."""
    return BACKBONE_IN_NAME.sub('{}', name)
