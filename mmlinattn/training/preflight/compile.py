"""``compile`` in a training config where the training inputs change size: one warning line before
any work, naming the transform and the ways round it. Not a refusal: whether torch.compile gets
past a new size depends on the backbone, the sizes and the torch version.

Measured on torch 2.14.1 (CPU, docs/benchmarks.md section 11): ``torch.compile(backbone)``
(inductor, the default automatic dynamic shapes) failed inside inductor's symbolic-shape code at a
new input size for every T backbone here (InLine-PVT-T and InLine-Swin-T at the second size, MAViT-T
once height and width had both changed), each after a first compilation of minutes; and mmseg's own
train.py with mmengine's ``compile=True`` (the whole ``train_step``) trained the toy MAViT-T
Semantic FPN through four square inputs of changing size, recompiling once, on one day and failed
inside inductor at that recompilation on the next
(tests/test_one_run.py::test_the_compile_warning_stands_where_upstream_trains). A ``compile`` dict
that sets ``dynamic`` or another backend than inductor is the user's choice: no warning.
"""
from typing import Iterable, Optional

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


def check_compile(cfg) -> Optional[str]:
    """The warning for ``compile`` with a training pipeline whose input size varies (None
    otherwise, and where the config's ``compile`` dict sets ``dynamic`` or a backend other than
    inductor)."""
    setting = cfg.get('compile')
    if not setting or (isinstance(setting, dict) and (
            'dynamic' in setting or setting.get('backend', 'inductor') != 'inductor')):
        return None
    why = size_varies(cfg)
    if not why:
        return None
    return (f'compile: the training inputs change size ({why}); torch.compile (inductor, '
            'automatic dynamic shapes) compiles again for new sizes, minutes each, and on torch '
            '2.14 it has failed at a new size of these backbones. To avoid both, train without '
            'compile or pad every batch to one size (mmdet: batch_augments=['
            'dict(type="BatchFixedSizePad", size=(H, W))] in the data preprocessor); '
            'compile=dict(dynamic=False) avoids the failure and compiles each size anew (after 8 '
            'sizes torch runs new ones eagerly) (docs/user_guide.md, "torch.compile")')
