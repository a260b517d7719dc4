"""The dataset configs of a config's dataloaders, and the classes they select."""
import importlib
from typing import List

from mmengine.config import Config

from ..config import ConfigError


def dataset_cfgs(cfg: Config, which: List[str]):
    """``(config key, dataset config)`` of every dataset the loaders ``which`` read, looking through
    RepeatDataset / ClassBalancedDataset / ConcatDataset wrappers."""
    for name in which:
        loader = cfg.get(name)
        if not loader:
            continue
        ds = loader.get('dataset')
        key = f'{name}.dataset'
        while isinstance(ds, dict) and 'dataset' in ds and 'data_root' not in ds:
            ds, key = ds['dataset'], key + '.dataset'
        if isinstance(ds, dict) and 'datasets' in ds:
            for i, sub in enumerate(ds['datasets']):
                yield f'{key}.datasets.{i}', sub
        elif isinstance(ds, dict):
            yield key, ds


def dataset_class(cfg: Config, ds: dict):
    """The class of a dataset config in the config's toolbox (``None`` if it cannot be found)."""
    try:
        reg = importlib.import_module(cfg.default_scope + '.registry').DATASETS
        from mmengine.registry import init_default_scope
        init_default_scope(cfg.default_scope)
        return reg.get(ds['type']) if isinstance(ds.get('type'), str) else ds.get('type')
    except Exception:  # noqa: BLE001 - an unknown type fails later with the registry's own error
        return None


def dataset_classes(cfg: Config, ds: dict):
    """The class names a dataset config selects (its ``metainfo`` or the dataset type's default)."""
    meta = ds.get('metainfo') or {}
    if meta.get('classes'):
        return list(meta['classes'])
    cls = dataset_class(cfg, ds)
    return list(getattr(cls, 'METAINFO', {}).get('classes', ())) or None


def loader_evaluators(cfg: Config, key: str) -> list:
    """``(config key, evaluator config)`` of the evaluator that scores the loader a dataset key
    (``test_dataloader.dataset...``) belongs to; ``[]`` for a training loader."""
    loader = key.split('.', 1)[0]
    if not loader.endswith('_dataloader'):
        return []
    name = loader[:-len('_dataloader')] + '_evaluator'
    ev = cfg.get(name)
    if isinstance(ev, (list, tuple)):
        return [(f'{name}.{i}', e) for i, e in enumerate(ev) if isinstance(e, dict)]
    return [(name, ev)] if isinstance(ev, dict) else []


def _needs_labels(ev: dict) -> bool:
    kind = str(ev.get('type', ''))
    return not ev.get('format_only', False) and not kind.endswith('DumpResults') and \
        not kind.endswith('DumpDetResults')


def labels_needed(cfg: Config, key: str) -> bool:
    """Whether the dataset at ``key`` must carry labels: always for training, and for a val / test
    set unless every evaluator of its loader only formats results for a test server
    (``format_only=True``, as for COCO test-dev or the ADE20K test set) or dumps them."""
    evs = loader_evaluators(cfg, key)
    return not evs or any(_needs_labels(e) for _, e in evs)


def check_format_only(cfg: Config, loaders) -> None:
    """A ``format_only`` evaluator must say where its files go, else they are lost: mmdet's
    CocoMetric would write them to a temporary folder it deletes (an assert), mmseg's IoUMetric
    would fail after the whole run (``osp.dirname(None)``). Names the key to set."""
    for loader in loaders:
        for ev_key, ev in loader_evaluators(cfg, f'{loader}.dataset'):
            if not ev.get('format_only'):
                continue
            kind = str(ev.get('type', ''))
            if kind.endswith('CocoMetric') and not ev.get('outfile_prefix'):
                raise ConfigError(
                    f'{ev_key}: format_only=True writes the results json for a test server but '
                    f'no outfile_prefix is set; set {ev_key}.outfile_prefix=DIR/NAME (or '
                    'tools/test.py --json-prefix DIR/NAME)')
            if kind.endswith('IoUMetric') and not ev.get('output_dir'):
                raise ConfigError(
                    f'{ev_key}: format_only=True writes PNG predictions for a test server but no '
                    f'output_dir is set; set {ev_key}.output_dir=DIR (or tools/test.py --out DIR)')
