"""Cost of one training step and one inference of whole detectors / segmentors, at the config's real
input size and per-GPU batch: time and peak memory, one progress line per config.

    python tools/analysis_tools/benchmark_step.py CONFIG [CONFIG ...]
    python tools/analysis_tools/benchmark_step.py --matrix --references --out docs/benchmarks/step_cost
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --size 512 1024
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --size 2048 --no-train
    python tools/analysis_tools/benchmark_step.py CONFIG --with-references --size 512 --compile
    python tools/analysis_tools/benchmark_step.py --matrix --device cuda --amp          # on a GPU

* training step = forward + backward + optimizer step (the config's optim_wrapper, paramwise rules
  included) on a synthetic batch of ``train_dataloader.batch_size`` images at the training scale
  (detection: 1333x800 with a few boxes and masks; segmentation: the crop, 512x512), after
  ``--warmup`` untimed steps;
* inference = ``predict`` on one image at the test scale, after one untimed call;
* memory: on CUDA the peak allocated by torch (train and inference separately); on the CPU the growth
  of the process's peak resident memory over its size after building the model (each config runs
  in its own process, so peaks do not leak between configs).

``--matrix`` takes the smallest variant of every cell of the config matrix; ``--references`` adds,
for each model family, the same detector / segmentor with mmdet's Swin-T and PVT-S backbones (only the
backbone and the neck / head input channels changed); ``--with-references`` does the same for the given
configs. ``--size H[xW] [H[xW] ...]`` trains and tests at these input sizes instead of the config's
scale, every model at every size in one run (a resolution sweep; the ratios compare models at the same
size). ``--no-train`` times inference only (for sizes whose training step does not fit in memory).
``--compile`` wraps the backbone in ``torch.compile`` (inductor) before timing; the untimed warm-up
calls compile it (at least one for each of training and inference), so the timed step runs the
compiled code. Only the backbone is compiled: it is the part that differs between the compared models,
and the detectors' heads have data-dependent shapes that recompile on every batch. ``--amp`` runs
both under autocast (fp16 on CUDA, bf16 on the CPU) with AmpOptimWrapper on CUDA. SyncBN is reverted
to BN (one process).
"""
import argparse
import json
import os
import os.path as osp
import re
import resource
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG_DIRS = ('inline_pvt', 'inline_swin', 'mavit')  # the config matrix: one folder per family
# our backbone in a config name, e.g. "mavit-t"; the arch letters smallest first
BACKBONE_IN_NAME = re.compile(r'(inline-pvt|inline-swin|mavit)-([tsmbl])')
ARCH_ORDER = 'tsmbl'

# mmdet's / mmseg's own backbones for the reference rows: (type, kwargs, channels)
REFERENCES = {
    'Swin-T': ('mmdet.SwinTransformer', dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                                             window_size=7, drop_path_rate=0.2, convert_weights=False),
               [96, 192, 384, 768]),
    'PVT-S': ('mmdet.PyramidVisionTransformer', dict(num_layers=[3, 4, 6, 3], drop_path_rate=0.1),
              [64, 128, 320, 512]),
}


def matrix_cells():
    """The config matrix as it is on disk: {recipe: the smallest variant of each family that has it},
    recipes in name order, families in folder order."""
    cells = {}
    for family in CONFIG_DIRS:
        folder = osp.join('configs', family)
        for name in sorted(os.listdir(osp.join(ROOT, folder)), key=_smallest_first):
            if BACKBONE_IN_NAME.search(name) and name.endswith('.py'):
                cells.setdefault(_recipe(name), {}).setdefault(family, osp.join(folder, name))
    return {recipe: list(fams.values()) for recipe, fams in sorted(cells.items())}


def _smallest_first(name):
    m = BACKBONE_IN_NAME.search(name)
    return (ARCH_ORDER.index(m.group(2)) if m else len(ARCH_ORDER), name)


def matrix_configs():
    return [cfg for cfgs in matrix_cells().values() for cfg in cfgs]


def reference_jobs():
    """(config, reference name): per detector / segmentor recipe, its first family's smallest config
    with each reference backbone."""
    return [(cfgs[0], ref) for cfgs in matrix_cells().values() for ref in REFERENCES]


def swap_backbone(cfg, ref):
    kind, kwargs, ch = REFERENCES[ref]
    old = cfg.model.backbone
    out_indices = tuple(old.get('out_indices', (0, 1, 2, 3)))
    cfg.model.backbone = dict(type=kind, out_indices=out_indices, init_cfg=None, **kwargs)
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
    import torch
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(n):
        s = DetDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw, scale_factor=(1., 1.),
                                        batch_input_shape=hw))
        h, w = hw
        boxes = torch.tensor([[0.1 * w, 0.1 * h, 0.4 * w, 0.5 * h], [0.5 * w, 0.3 * h, 0.9 * w, 0.9 * h],
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
    import torch
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


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_one(config, ref=None, device='cpu', amp=False, batch=None, warmup=1, size=None,
                compiled=False, train=True):
    """Build the model of ``config`` (optionally with a reference backbone) and time one training step
    (unless ``train`` is False) and one inference; returns a dict."""
    import torch
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.optim import build_optim_wrapper

    import mmlinattn  # noqa: F401
    from mmlinattn.apis import model_registry
    cfg = Config.fromfile(osp.join(ROOT, config))
    cfg.model.backbone.init_cfg = None
    if ref:
        swap_backbone(cfg, ref)
    train_hw, test_hw = _scales(cfg, size)
    models = model_registry(cfg)
    model = revert_sync_batchnorm(models.build(cfg.model)).to(device)
    model.init_weights()
    if compiled:
        model.backbone = torch.compile(model.backbone)
        warmup = max(warmup, 1)  # the first call compiles
    n = batch or cfg.train_dataloader.batch_size
    det = cfg.default_scope == 'mmdet'
    make = (lambda k, hw: det_batch(k, hw, 'mask_head' in str(cfg.model))) if det else seg_batch
    ow_cfg = dict(cfg.optim_wrapper)
    if amp and device == 'cuda':
        ow_cfg.update(type='AmpOptimWrapper', loss_scale='dynamic')
    optim = build_optim_wrapper(model, ow_cfg)
    cuda = device == 'cuda'
    ac_dtype = torch.float16 if cuda else torch.bfloat16
    params = sum(p.numel() for p in model.parameters()) / 1e6

    def train_step():
        model.train()
        data = model.data_preprocessor(make(n, train_hw), True)
        with torch.autocast(device, dtype=ac_dtype, enabled=amp):
            losses = model(**data, mode='loss')
            loss, _ = model.parse_losses(losses)
        optim.update_params(loss)

    def timed(fn, untimed):
        """Run ``fn`` ``untimed`` times, then once timed: (seconds, peak memory in MB)."""
        base_rss = _peak_rss_mb()  # after building the model, before any step
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
        return seconds, (torch.cuda.max_memory_allocated() / 2 ** 20 if cuda else _peak_rss_mb() - base_rss)

    t_train, mem_train = timed(train_step, warmup) if train else (None, None)
    model.eval()
    test = make(1, test_hw)

    def infer():
        with torch.no_grad(), torch.autocast(device, dtype=ac_dtype, enabled=amp):
            model(**model.data_preprocessor(test, False), mode='predict')
    t_infer, mem_infer = timed(infer, 1)
    mem_infer = mem_infer if cuda else None
    return dict(config=osp.basename(config)[:-3], backbone=ref or cfg.model.backbone.type,
                params_m=round(params, 2), batch=n, train_hw=list(train_hw), test_hw=list(test_hw),
                size=list(size) if size else None, compiled=compiled,
                train_s=_round(t_train, 3), infer_s=round(t_infer, 3),
                train_mem_mb=_round(mem_train, 1), infer_mem_mb=_round(mem_infer, 1),
                device=device, amp=amp, threads=torch.get_num_threads())


def _round(x, digits):
    return None if x is None else round(x, digits)


def run_job(config, ref, args, size=None):
    """One config at one size in a fresh process (clean peak memory); returns its result dict."""
    from mmlinattn.apis import run_script
    cmd = ['--one', config, '--device', args.device, '--warmup', str(args.warmup)]
    if ref:
        cmd += ['--reference', ref]
    if args.amp:
        cmd.append('--amp')
    if args.batch:
        cmd += ['--batch', str(args.batch)]
    if size:
        cmd += ['--size', f'{size[0]}x{size[1]}']
    if args.compile:
        cmd.append('--compile')
    if args.no_train:
        cmd.append('--no-train')
    r = run_script(osp.abspath(__file__), cmd, cwd=ROOT, show=False, check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('RESULT ')]
    if r.returncode != 0 or not lines:
        failed = dict(config=osp.basename(config)[:-3], backbone=ref or '?', size=size and list(size))
        if r.returncode < 0:  # killed by a signal, most often SIGKILL from the kernel's OOM killer
            return dict(failed, error=f'process killed (signal {-r.returncode}), out of memory?')
        last = r.stdout.strip().splitlines()[-1:] or ['?']
        return dict(failed, error=last[0][:200])
    return json.loads(lines[-1][len('RESULT '):])


def _recipe(name):
    """The config name without its backbone: rows of the same detector / segmentor share it."""
    return BACKBONE_IN_NAME.sub('{}', name)


def _size(r):
    return 'x'.join(map(str, r['size'])) if r.get('size') else ''


def _ratio(ref, ours):
    return '-' if ref is None or ours is None else f'{ref / ours:.2f}'


def table(rows):
    """Markdown: time / memory per config, and the reference backbones' time over ours in the same
    detector / segmentor at the same size (> 1: ours is faster)."""
    sized = any(r.get('size') for r in rows)
    head = ('| config | ' + ('size | ' if sized else '') + 'backbone | params (M) | batch | train step (s) | '
            'inference (s) | train peak (MB) | Swin-T / this: train, infer | PVT-S / this: train, infer |')
    out = [head, '|' + '---|' * (10 if sized else 9)]
    refs = {(_recipe(r['config']), r['backbone'], _size(r)): r for r in rows
            if r.get('backbone') in REFERENCES and 'error' not in r}
    for r in rows:
        size = f'{_size(r)} | ' if sized else ''
        if 'error' in r:
            out.append(f"| {r['config']} | {size}{r['backbone']} | error: {r['error']} |||||||")
            continue
        fam = _recipe(r['config'])
        ratios = []
        for ref in REFERENCES:
            b = refs.get((fam, ref, _size(r)))
            if b is None or r['backbone'] in REFERENCES:
                ratios.append('')
            else:
                ratios.append(f"{_ratio(b['train_s'], r['train_s'])} / {_ratio(b['infer_s'], r['infer_s'])}")
        name = _recipe(r['config']).format(r['backbone'].lower()) if r['backbone'] in REFERENCES \
            else r['config']
        trained = r['train_s'] is not None  # inference-only rows (--no-train) have no batch
        train, mem, batch = (r['train_s'], r['train_mem_mb'], r['batch']) if trained else ('-', '-', '-')
        out.append(f"| {name} | {size}{r['backbone']} | {r['params_m']} | {batch} | {train} | "
                   f"{r['infer_s']} | {mem} | {ratios[0]} | {ratios[1]} |")
    return '\n'.join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('configs', nargs='*', help='config files')
    p.add_argument('--matrix', action='store_true', help='the smallest variant of every matrix cell')
    p.add_argument('--references', action='store_true',
                   help="also each model family with mmdet's Swin-T and PVT-S backbones")
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    p.add_argument('--amp', action='store_true', help='autocast (fp16 on CUDA with AmpOptimWrapper, bf16 on CPU)')
    p.add_argument('--batch', type=int, help='images per step (default: the config\'s per-GPU batch)')
    p.add_argument('--warmup', type=int, default=1, help='untimed training steps first')
    p.add_argument('--size', type=lambda v: tuple(int(x) for x in (v.split('x') * 2)[:2]), nargs='+',
                   help='H or HxW, one or more: train and test at these input sizes instead of the '
                        'config\'s scale (every model at every size)')
    p.add_argument('--no-train', action='store_true', help='time inference only')
    p.add_argument('--compile', action='store_true',
                   help='torch.compile (inductor) the backbone; the warm-up calls compile it')
    p.add_argument('--with-references', action='store_true',
                   help="also run each given config's detector / segmentor with mmdet's Swin-T and PVT-S")
    p.add_argument('--out', help='write OUT.json and OUT.md')
    p.add_argument('--table', help='only print the table of a saved OUT.json')
    p.add_argument('--one', help=argparse.SUPPRESS)
    p.add_argument('--reference', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return 0
    if args.one:
        res = measure_one(args.one, args.reference, args.device, args.amp, args.batch, args.warmup,
                          args.size[0] if args.size else None, args.compile, not args.no_train)
        print('RESULT ' + json.dumps(res), flush=True)
        return 0
    jobs = [(c, None) for c in args.configs]
    if args.matrix:
        jobs += [(c, None) for c in matrix_configs()]
    if args.references:
        jobs += reference_jobs()
    if args.with_references:  # one reference row per detector / segmentor recipe
        seen = set()
        for c in args.configs:
            if _recipe(osp.basename(c)) not in seen:
                seen.add(_recipe(osp.basename(c)))
                jobs += [(c, ref) for ref in REFERENCES]
    if not jobs:
        p.error('give config files, --matrix or --references')
    runs = [(size, config, ref) for size in (args.size or [None]) for config, ref in jobs]
    rows = []
    for i, (size, config, ref) in enumerate(runs, 1):
        t0 = time.time()
        r = run_job(config, ref, args, size)
        rows.append(r)
        what = osp.basename(config)[:-3] + (f' [{ref}]' if ref else '') + (f' at {size[0]}x{size[1]}' if size else '')
        if 'error' in r:
            print(f'[{i}/{len(runs)}] {what}: ERROR {r["error"]}', flush=True)
        else:
            train = ('' if r['train_s'] is None else
                     f'train step {r["train_s"]:.2f} s (peak +{r["train_mem_mb"]:.0f} MB), ')
            print(f'[{i}/{len(runs)}] {what}: {train}inference {r["infer_s"]:.2f} s '
                  f'({time.time() - t0:.0f} s)', flush=True)
    md = table(rows)
    print(md)
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out + '.json', 'w') as f:
            json.dump(rows, f, indent=1)
        with open(args.out + '.md', 'w') as f:
            f.write(md + '\n')
    return 1 if any('error' in r for r in rows) else 0


if __name__ == '__main__':
    sys.exit(main())
