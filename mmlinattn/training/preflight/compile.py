"""``compile`` in a training config: refused, in one line, where the training inputs change size.

Measured on torch 2.14.1 (CPU, docs/benchmarks.md section 11): with ``torch.compile``'s default
automatic dynamic shapes, inductor compiles the first input size of every backbone here and then
fails when a second one arrives (MAViT-T once height and width both varied, InLine-PVT-T and
InLine-Swin-T at the first new size), inside inductor's symbolic-shape code. A pipeline that resizes
to random or aspect-dependent sizes therefore stops a compiled run at its second iteration, after a
first compilation of minutes. ``compile=dict(dynamic=False)`` (one static graph per size, each
compiled anew), an explicit ``dynamic=True`` or another backend than inductor is taken as the
user's choice.
"""
from typing import Iterable, Optional

from ..config import ConfigError

#: transforms whose output size changes from image to image or from draw to draw
_RANDOM_SIZE = ('RandomResize', 'RandomChoiceResize', 'RandomRescale', 'MultiScaleFlipAug')


def _transforms(pipeline) -> Iterable[dict]:
    """Every transform of ``pipeline``, those nested in RandomChoice / RandomApply / Compose
    included."""
    for t in pipeline or ():
        if isinstance(t, (list, tuple)):
            yield from _transforms(t)
        elif isinstance(t, dict):
            yield t
            for key in ('transforms', 'transform'):
                inner = t.get(key)
                if isinstance(inner, dict):
                    inner = [inner]
                yield from _transforms(inner)


def _pipeline(dataset) -> list:
    """The pipeline of a dataset config, through wrappers (RepeatDataset, ClassBalancedDataset,
    ConcatDataset: their first dataset)."""
    while isinstance(dataset, dict):
        if dataset.get('pipeline') is not None:
            return dataset['pipeline']
        inner = dataset.get('dataset', dataset.get('datasets'))
        dataset = inner[0] if isinstance(inner, (list, tuple)) and inner else inner
    return []


def size_varies(cfg) -> Optional[str]:
    """Why the training inputs change size (a transform of the training pipeline), or None where
    the batches have one size: a fixed-size pad in the data preprocessor (mmseg's ``size``,
    mmdet's ``BatchFixedSizePad``) or in the pipeline (``Pad`` with ``size``) after the resizing."""
    prep = dict((cfg.get('model') or {}).get('data_preprocessor') or {})
    augments = [str(a.get('type', '')) for a in prep.get('batch_augments') or ()
                if isinstance(a, dict)]
    resized = [a for a in augments if 'Resize' in a]  # mmdet's BatchSyncRandomResize (YOLOX)
    if resized:
        return f'{resized[0]} in the data preprocessor draws a size per batch'
    if prep.get('size') or 'BatchFixedSizePad' in augments:
        return None
    loader = cfg.get('train_dataloader') or {}
    why = None
    for t in _transforms(_pipeline(loader.get('dataset'))):
        kind = str(t.get('type', ''))
        if kind.split('.')[-1] in _RANDOM_SIZE:
            why = f'{kind} draws a size per image'
        elif kind.split('.')[-1] == 'Resize' and t.get('keep_ratio'):
            why = f'{kind}(keep_ratio=True) follows each image\'s aspect ratio'
        elif kind.split('.')[-1] == 'Pad' and t.get('size'):
            why = None  # padded to one size after whatever came before
    return why


def check_compile(cfg) -> None:
    """:class:`ConfigError` for ``compile`` with a training pipeline whose input size varies,
    unless the config's ``compile`` dict sets ``dynamic`` or a backend other than inductor."""
    setting = cfg.get('compile')
    if not setting or (isinstance(setting, dict) and (
            'dynamic' in setting or setting.get('backend', 'inductor') != 'inductor')):
        return
    why = size_varies(cfg)
    if why:
        raise ConfigError(
            f'compile: the training inputs change size ({why}), and torch.compile (inductor, '
            'automatic dynamic shapes) fails at the second input size of these backbones; '
            'train without compile, pad every batch to one size (mmdet: batch_augments=['
            'dict(type="BatchFixedSizePad", size=(H, W))] in the data preprocessor), or set '
            'compile=dict(dynamic=False) to compile each input size anew (minutes per size; '
            'after 8 sizes torch runs new ones eagerly) (docs/user_guide.md, "torch.compile")')
