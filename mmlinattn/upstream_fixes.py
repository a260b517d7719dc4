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

from .training import compat

#: the environment variable that turns the fixes off ('0', 'off', 'false', 'no')
SWITCH = 'MMLINATTN_UPSTREAM_FIXES'

if os.environ.get(SWITCH, '1').strip().lower() in ('0', 'off', 'false', 'no'):
    compat.STATUS.update({name: f'off ({SWITCH}={os.environ[SWITCH]})' for name in compat.PATCHES})
else:
    compat.apply()
