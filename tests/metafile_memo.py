"""Imported by the tests (conftest.py) and by the warm interpreter's fork server (warm.py): mmengine
parses each metafile of a package's model index once per session instead of at every config read.

mmengine resolves each ``mmdet::`` / ``mmseg::`` base of a config by loading every ``metafile.yml``
of that package (``mmengine.config.utils._get_cfg_metainfo``) before it falls back to the base's
path: about 1 s of a 1.2 s ``Config.fromfile`` of a config of ours on the 2-core machine, paid by
hundreds of config reads in the suite. The files do not change while the tests run, so their parsed
contents are kept (keyed by path and modification time); nothing else of mmengine changes.
"""
import functools
import os

import mmengine.config.utils as _config_utils

_real_load = _config_utils.load


@functools.lru_cache(maxsize=None)
def _load_once(path: str, mtime_ns: int):
    return _real_load(path)


def _load(file, *args, **kwargs):
    if isinstance(file, str) and not args and not kwargs and file.endswith('.yml'):
        return _load_once(file, os.stat(file).st_mtime_ns)
    return _real_load(file, *args, **kwargs)


if _config_utils.load is _real_load and getattr(_real_load, '__module__', '') != __name__:
    _config_utils.load = _load


def _parse_model_indexes(packages=('mmdet', 'mmseg', 'mmpretrain')):
    """Parse the packages' metafiles now (in the fork server: once for every run it forks)."""
    import importlib.util
    for name in packages:
        spec = importlib.util.find_spec(name)
        index = spec and spec.submodule_search_locations and os.path.join(
            spec.submodule_search_locations[0], '.mim', 'model-index.yml')
        if not index or not os.path.isfile(index):
            continue
        for meta in _load(index).get('Import', []):
            path = os.path.join(os.path.dirname(index), meta)
            if os.path.isfile(path):
                _load(path)


_parse_model_indexes()
