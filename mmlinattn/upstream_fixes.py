"""The fixes for upstream breakage (:mod:`mmlinattn.training.compat`), applied when this module is
imported.

mmengine 0.10 on torch >= 2.6 cannot resume or test from its own checkpoints (torch loads
weights-only by default, mmengine's checkpoints hold numpy scalars and HistoryBuffer objects). Our
tools import this module, and every config of ours lists it::

    custom_imports = dict(imports=['mmlinattn', 'mmlinattn.upstream_fixes'],
                          allow_failed_imports=False)

so mmdet's, mmseg's and mmpretrain's own tools get the same fixes on our configs. Each fix is
applied only where the breakage exists (:data:`mmlinattn.training.compat.STATUS` says which were); a
config of yours that lists only ``'mmlinattn'`` gets none. ``MMLINATTN_UPSTREAM_FIXES=0`` in the
environment turns them off here too (then mmengine's checkpoints need
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` on torch >= 2.6, as without mmlinattn).
"""
import os
import warnings

from .core import settings
from .training import compat

#: the environment variable that turns the fixes off ('0', 'off', 'false', 'no')
SWITCH = 'MMLINATTN_UPSTREAM_FIXES'

try:
    _on = settings.get(SWITCH)
except settings.SettingError as e:  # our tools stop on it first (settings.check_all)
    warnings.warn(f'{e}; the fixes stay on', stacklevel=2)
    _on = True
if _on:
    compat.apply()
else:
    compat.STATUS.update({name: f'off ({SWITCH}={os.environ[SWITCH]})' for name in compat.PATCHES})
