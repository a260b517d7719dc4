"""The dataset configs of a config's dataloaders, and the classes they select."""
import importlib
from typing import List

from mmengine.config import Config


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
