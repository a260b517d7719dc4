"""Run a trained detector / segmentor through OpenMMLab's inferencers (:func:`build_inferencer`)
and draw ground truth | prediction for the first validation images (:func:`draw_val_predictions`).

    python -m mmlinattn.apis.inference CONFIG CHECKPOINT --out-dir DIR [--num-images 4]
        [--score-thr 0.3]
"""
import argparse
import copy
import importlib
import os
import os.path as osp
import sys
import warnings
from typing import List, NamedTuple, Optional, Sequence, Union

from mmengine.config import Config

from mmlinattn.core.registry import add_function_registries

#: the inferencer of each toolbox scope
INFERENCERS = {'mmdet': ('mmdet.apis', 'DetInferencer'), 'mmseg': ('mmseg.apis', 'MMSegInferencer')}

#: detections drawn from this score on, unless told otherwise (mmdet's own default)
SCORE_THR = 0.3


class ScopeError(ValueError):
    """A config of a toolbox with no detection / segmentation inferencer here."""


def load_config(config: Union[str, Config]) -> Config:
    """A private copy of the config (the inferencers edit the one they are given)."""
    if isinstance(config, Config):
        return copy.deepcopy(config)
    from mmlinattn.training.config import read_config_file
    return read_config_file(config)


def config_scope(cfg: Config, name: str = 'the config') -> str:
    """``'mmdet'`` or ``'mmseg'``; :class:`ScopeError` naming the scope otherwise."""
    scope = cfg.get('default_scope')
    if scope not in INFERENCERS:
        raise ScopeError(
            f'{name} has default_scope={scope!r}: only detection (mmdet) and segmentation (mmseg) '
            'configs can be run here, through mmdet\'s DetInferencer or mmseg\'s MMSegInferencer')
    from mmlinattn.training.config import check_toolboxes
    check_toolboxes(cfg, name)  # its toolbox installed, else the extra that installs it
    return scope


class ClassesFromConfigWarning(UserWarning):
    """The checkpoint carries no class names; the config's dataset gave them."""


#: the warnings mmdet's / mmseg's inferencers give when they fall back to COCO / Cityscapes classes
_DEFAULT_CLASSES_WARNINGS = ('dataset_meta or class names are not saved', 'weights is None, use')


def _dataset_cfg(loader_cfg):
    """The dataset config inside a data loader config, through dataset wrappers."""
    ds = (loader_cfg or {}).get('dataset')
    while isinstance(ds, dict) and 'metainfo' not in ds:
        inner = ds.get('dataset') or (ds.get('datasets') or [None])[0]
        if not isinstance(inner, dict):
            break
        ds = inner
    return ds if isinstance(ds, dict) and ds.get('type') else None


def config_dataset_meta(cfg: Config, scope: str) -> Optional[dict]:
    """``{'classes', 'palette', 'source'}`` of the config's test (else val, else train) dataset,
    as the dataset merges them (built with ``lazy_init=True``); ``None`` if none names classes."""
    from mmengine.registry import init_default_scope
    init_default_scope(scope)
    datasets = importlib.import_module(f'{scope}.registry').DATASETS
    for key in ('test_dataloader', 'val_dataloader', 'train_dataloader'):
        ds = _dataset_cfg(cfg.get(key))
        if ds is None:
            continue
        ds = copy.deepcopy(ds)
        try:
            ds['lazy_init'] = True
            meta = dict(datasets.build(ds).metainfo)
        except (OSError, KeyError, ValueError, AssertionError):  # needs its files to build
            cls = datasets.get(ds['type'])
            meta = dict(getattr(cls, 'METAINFO', None) or {})
            meta.update(ds.get('metainfo') or {})
        if meta.get('classes'):
            return dict(classes=list(meta['classes']), palette=meta.get('palette'),
                        source=f'{key}.dataset ({ds["type"]})')
    return None


def build_inferencer(config: Union[str, Config], checkpoint: str = None, device: str = 'cpu',
                     show_progress: bool = False):
    """``DetInferencer`` / ``MMSegInferencer`` (by the config's scope) with the checkpoint; without
    its ``dataset_meta``, the config dataset's classes (:class:`ClassesFromConfigWarning`)."""
    cfg = load_config(config)
    scope = config_scope(cfg, config if isinstance(config, str) else 'the config')
    if 'visualizer' in cfg:
        # the inferencers save drawings themselves; LocalVisBackend would only warn (no save_dir)
        cfg.visualizer.vis_backends = []
    module, name = INFERENCERS[scope]
    add_function_registries((scope,))  # before the inferencer looks its collate function up
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        inferencer = getattr(importlib.import_module(module), name)(
            model=cfg, weights=checkpoint, device=device)
    # large images: no full-resolution logits (mmlinattn.apis.large_image)
    if scope == 'mmseg':
        from mmlinattn.apis.large_image import lean_postprocess
        lean_postprocess(inferencer.model)
    fell_back = [w for w in caught if str(w.message).startswith(_DEFAULT_CLASSES_WARNINGS)]
    meta = config_dataset_meta(cfg, scope) if fell_back else None
    for w in caught:  # the other warnings, as they came
        if meta is None or w not in fell_back:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if meta is not None:
        source = meta.pop('source')
        if meta['palette'] is None:  # keep the toolbox's (mmdet: 'random'; mmseg: its own)
            meta['palette'] = inferencer.model.dataset_meta.get('palette')
        dataset_meta = inferencer.model.dataset_meta
        dataset_meta.clear()  # the same dict as mmdet's visualizer.dataset_meta
        dataset_meta.update(meta)
        if scope == 'mmdet':
            inferencer.visualizer.dataset_meta = dataset_meta
        what = f'checkpoint {checkpoint} carries' if checkpoint else 'no checkpoint, so'
        warnings.warn(f'{what} no dataset_meta (class names): using the {len(meta["classes"])} '
                      f'classes of the config\'s {source}', ClassesFromConfigWarning, stacklevel=2)
    inferencer.show_progress = show_progress
    return inferencer


def predict(inferencer, inputs) -> list:
    """The inferencer's data samples as a list, one per image."""
    out = inferencer(inputs, return_datasamples=True)
    if isinstance(out, dict):
        out = out['predictions']
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _visualizer(inferencer, scope):
    vis = inferencer.visualizer
    meta = inferencer.model.dataset_meta
    if scope == 'mmseg':
        vis.set_dataset_meta(meta.get('classes'), meta.get('palette'))
    else:
        vis.dataset_meta = meta
    return vis


def _ground_truth(cfg: Config, scope: str):
    """The validation set loading each image and its annotations at their own size, and
    ``pack(results, scale)``: the toolbox's ``Resize`` by ``scale`` and ``Pack*Inputs``."""
    from mmengine.registry import init_default_scope
    init_default_scope(scope)
    registry = importlib.import_module(f'{scope}.registry')
    dataset_cfg = copy.deepcopy(cfg.val_dataloader.dataset)
    pipeline = dataset_cfg.pipeline
    load_ann = [t for t in pipeline if t['type'].split('.')[-1] == 'LoadAnnotations']
    pack = [t for t in pipeline if t['type'].split('.')[-1].startswith('Pack')]
    if not load_ann or not pack:
        raise ValueError('val_dataloader.dataset.pipeline has no LoadAnnotations / Pack*Inputs: no '
                         'ground truth to draw')
    dataset_cfg.pipeline = [dict(type='LoadImageFromFile'), load_ann[0]]
    packer = registry.TRANSFORMS.build(dict(type=pack[0]['type']))

    def pack_scaled(results, scale):
        if scale != 1:
            resize = dict(type='Resize', scale_factor=scale, keep_ratio=True)
            results = registry.TRANSFORMS.build(resize)(results)
        return packer(results)
    return registry.DATASETS.build(dataset_cfg), pack_scaled


class Picture(NamedTuple):
    """A picture's file, caption and (detector) numbers of detections returned and drawn."""
    path: str
    caption: List[str]
    detections: Optional[int] = None
    drawn: Optional[int] = None


def detection_caption(scores: Sequence[float], score_thr: float,
                      num_objects: int) -> List[str]:
    """``[ground truth header, prediction header, note]`` of a detection picture; ``scores``: all
    the detections', those >= ``score_thr`` drawn."""
    scores = [float(s) for s in scores]
    drawn = [s for s in scores if s >= score_thr]
    hidden = [s for s in scores if s < score_thr]
    plural = 's' if num_objects != 1 else ''
    head = (f'ground truth: {num_objects} object{plural}',
            f'prediction: {len(drawn)} of {len(scores)} detections, score >= {score_thr:g}')
    if hidden:
        span = (f'{min(hidden):.2f}' if len(hidden) == 1 or min(hidden) == max(hidden)
                else f'{min(hidden):.2f} to {max(hidden):.2f}')
        note = (f'not drawn: {len(hidden)} with score {span} (--score-thr 0 draws all '
                f'{len(scores)}).')
    elif scores:
        note = f'all {len(scores)} detections that the model returned are drawn.'
    else:
        note = 'the model returned no detection.'
    return [*head, note + ' Box labels: class: score x 100.']


def _font(size):
    from PIL import ImageFont
    try:
        from matplotlib import font_manager
        return ImageFont.truetype(font_manager.findfont('DejaVu Sans'), size)
    except (ImportError, OSError, ValueError):  # no matplotlib or its font: PIL's own
        return ImageFont.load_default()


def _wrap(text, font, width):
    lines, line = [], ''
    for word in text.split(' '):
        trial = f'{line} {word}' if line else word
        if line and font.getlength(trial) > width:
            lines.append(line)
            line = word
        else:
            line = trial
    return lines + [line]


def add_caption(picture, left: str, right: str, note: str = None):
    """``picture`` (RGB) under a strip: ``left``, ``right`` over each half, ``note`` across."""
    import numpy as np
    from PIL import Image, ImageDraw
    h, w = picture.shape[:2]
    half, pad = w // 2, 6
    head, small = _font(15), _font(13)
    columns = [_wrap(left, head, half - 2 * pad), _wrap(right, head, half - 2 * pad)]
    note_lines = _wrap(note, small, w - 2 * pad) if note else []
    height = pad + 19 * max(map(len, columns)) + 16 * len(note_lines) + pad
    canvas = Image.new('RGB', (w, height + h), 'white')
    canvas.paste(Image.fromarray(np.ascontiguousarray(picture)), (0, height))
    draw = ImageDraw.Draw(canvas)
    for x, lines in zip((pad, half + pad), columns):
        for k, line in enumerate(lines):
            draw.text((x, pad + 19 * k), line, fill='black', font=head)
    y = pad + 19 * max(map(len, columns))
    for k, line in enumerate(note_lines):
        draw.text((pad, y + 16 * k), line, fill=(70, 70, 70), font=small)
    return np.asarray(canvas)


def draw_val_predictions(config: Union[str, Config], checkpoint: str, out_dir: str,
                         num_images: int = 4, device: str = 'cpu', score_thr: float = SCORE_THR,
                         scale: float = None, inferencer=None) -> List[Picture]:
    """Draw ground truth | prediction of the first validation images under a caption (small ones
    enlarged ``scale`` times); writes ``out_dir/<image>.png``, returns a :class:`Picture` each."""
    import math

    import mmcv
    cfg = load_config(config)
    scope = config_scope(cfg, config if isinstance(config, str) else 'the config')
    if inferencer is None:
        inferencer = build_inferencer(cfg, checkpoint, device)
    dataset, pack = _ground_truth(cfg, scope)
    visualizer = _visualizer(inferencer, scope)
    os.makedirs(out_dir, exist_ok=True)
    pictures = []
    for i in range(min(num_images, len(dataset))):
        results = dataset[i]
        factor = float(scale or max(1, math.ceil(384 / max(results["img"].shape[:2]))))
        item = pack(results, factor)
        truth = item['data_samples']
        image = item['inputs'].permute(1, 2, 0).numpy()  # BGR, at the drawing size
        sample = predict(inferencer, image.copy())[0]
        counts = {}
        if scope == 'mmdet':
            # boxes as plain tensors, as mmdet's data preprocessor hands them to the visualizer
            from mmdet.models.utils import samplelist_boxtype2tensor
            samplelist_boxtype2tensor([truth])
            sample.gt_instances = truth.gt_instances
            scores = sample.pred_instances.scores
            caption = detection_caption(scores.tolist(), score_thr, len(truth.gt_instances))
            # selected here (>=, as the caption says); mmdet's own filter (>) removes nothing
            sample.pred_instances = sample.pred_instances[scores >= score_thr]
            counts = dict(detections=len(scores), drawn=len(sample.pred_instances))
            extra = dict(pred_score_thr=float('-inf'))
        else:
            sample.gt_sem_seg = truth.gt_sem_seg
            caption = ['ground truth', 'prediction: the class of each pixel']
            extra = {}
        stem = osp.splitext(osp.basename(truth.img_path))[0]
        path = osp.join(out_dir, stem + '.png')
        # the toolbox writes its picture, then the caption goes on top (PNG: exact round trip)
        visualizer.add_datasample(stem, image[..., ::-1].copy(), sample, draw_gt=True,
                                  draw_pred=True, show=False, out_file=path, **extra)
        drawn = add_caption(mmcv.imread(path, channel_order='rgb'), *caption)
        mmcv.imwrite(drawn[..., ::-1], path)
        pictures.append(Picture(path, caption, **counts))
    return pictures


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config')
    p.add_argument('checkpoint')
    p.add_argument('--out-dir', required=True)
    p.add_argument('--num-images', type=int, default=4)
    p.add_argument('--score-thr', type=float, default=SCORE_THR,
                   help='detection: draw the detections with at least this score (0: all that '
                   'the model returns; default %(default)s); the caption states it')
    p.add_argument('--scale', type=float, help='enlarge the pictures (default: to >= 384 px)')
    p.add_argument('--device', default='cpu')
    args = p.parse_args(argv)
    pictures = draw_val_predictions(args.config, args.checkpoint, args.out_dir, args.num_images,
                                    args.device, args.score_thr, args.scale)
    for picture in pictures:
        print(f'{osp.basename(picture.path)}: {picture.caption[0]} | {picture.caption[1]}'
              + (f'; {picture.caption[2]}' if len(picture.caption) > 2 else ''))
    print(f'{len(pictures)} pictures (ground truth | prediction) in {args.out_dir}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
