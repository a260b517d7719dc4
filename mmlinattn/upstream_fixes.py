"""The fixes for upstream breakage (:mod:`mmlinattn.training.compat`; e.g. mmengine 0.10 on torch >=
2.6 cannot resume from its checkpoints), applied on import where the breakage exists. Our tools
import this module and our configs list it (``custom_imports``), so the toolboxes' own tools get
them too; ``MMLINATTN_UPSTREAM_FIXES=0`` turns them off."""
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
