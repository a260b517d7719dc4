"""Imported by the tests (conftest.py) and by the warm interpreter's fork server (warm.py): two
pure functions of mmengine's config reading and writing give their answer once per input for the
test process or tool run, instead of at every call.

- Metafiles. mmengine resolves each ``mmdet::`` / ``mmseg::`` base of a config by loading every
  ``metafile.yml`` of that package (``mmengine.config.utils._get_cfg_metainfo``) before it falls
  back to the base's path: about 1 s of a 1.2 s ``Config.fromfile`` of a config of ours on the
  2-core machine, paid by hundreds of config reads in the suite. The files do not change while the
  tests run, so their parsed contents are kept (keyed by path and modification time).
- Config text. mmengine's plain Runner formats its config with yapf (``Config.pretty_text``, about
  0.3-0.5 s on 2 cores) at each of the environment log, the config dump, the visualizer's config,
  the runtime info and every checkpoint's meta: five times or more a run, for the same text. The
  formatted text is kept per input text and style (our Runner formats once already:
  ``mmlinattn.training.runner.FormattedOnce``; tests/test_read_once.py counts its calls).

Nothing else of mmengine changes, and what each call returns is what the real function returns
for the same input.
"""
import functools
import os

import mmengine.config.config as _config_module
import mmengine.config.utils as _config_utils

_real_load = _config_utils.load


@functools.lru_cache(maxsize=None)
def _load_once(path: str, mtime_ns: int):
    return _real_load(path)


def _load(file, *args, **kwargs):
    # mmdet's metafiles are metafile.yml, mmseg's metafile.yaml
    if isinstance(file, str) and not args and not kwargs and file.endswith(('.yml', '.yaml')):
        return _load_once(file, os.stat(file).st_mtime_ns)
    return _real_load(file, *args, **kwargs)


if _config_utils.load is _real_load and getattr(_real_load, '__module__', '') != __name__:
    _config_utils.load = _load

_real_format = _config_module.FormatCode
_formatted = {}


def _format_code(text, *args, **kwargs):
    key = (text, repr(args), repr(sorted(kwargs.items())))
    if key not in _formatted:
        _formatted[key] = _real_format(text, *args, **kwargs)
    return _formatted[key]


if getattr(_real_format, '__module__', '') != __name__:
    _config_module.FormatCode = _format_code


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
