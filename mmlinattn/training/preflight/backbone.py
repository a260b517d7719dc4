"""The config's backbone built once on the ``meta`` device (no memory, no init) for the pre-flight's
model checks: the neck's / heads' channels (:mod:`.channels`) and the checkpoint fits
(:mod:`.checkpoints`). :func:`~mmlinattn.training.preflight.preflight` makes one
:class:`MetaBackbone` per run and hands it on, so the backbone is built once before the Runner
builds the model."""
import copy
from typing import Optional

import torch
from mmengine.config import Config

from ..config import ConfigError, model_registry

#: what building a backbone config on the ``meta`` device raises for a reason the Runner's own
#: build reports (an unknown type: KeyError; an assert of another package's backbone) or that only
#: the meta device causes (a backbone that reads tensor values while it is built: RuntimeError,
#: NotImplementedError); anything else (TypeError, AttributeError, ...) is raised as it is
META_BUILD_ERRORS = (KeyError, AssertionError, RuntimeError, NotImplementedError)


def model_cfg(cfg: Config) -> Optional[dict]:
    """The model config that holds the backbone (through a TTA wrapper's ``module``), or None."""
    model = cfg.get('model')
    if isinstance(model, dict) and isinstance(model.get('module'), dict):  # a TTA wrapper
        model = model['module']
    if isinstance(model, dict) and isinstance(model.get('backbone'), dict):
        return model
    return None


class MetaBackbone:
    """The backbone of ``cfg`` on the ``meta`` device, built at the first :meth:`get` and kept:
    every later :meth:`get` returns the same module (or the same ``None``)."""

    def __init__(self, cfg: Config, logger=None):
        self.cfg, self.logger = cfg, logger
        self._built, self._module = False, None

    def get(self) -> Optional[torch.nn.Module]:
        """The backbone; ``None`` for a config without a backbone dict or one that does not build
        on the meta device (a warning names the error: the checks that need the backbone are
        skipped, the Runner's build reports it). Our backbones' range checks (``ValueError``: an
        unknown arch, an out-of-range ``out_indices``) raise :class:`ConfigError`."""
        if not self._built:
            self._module = self._build()
            self._built = True
        return self._module

    def ours(self) -> Optional[torch.nn.Module]:
        """:meth:`get` if it is one of mmlinattn's backbones, else None."""
        backbone = self.get()
        if backbone is None or not type(backbone).__module__.startswith('mmlinattn'):
            return None
        return backbone

    def _build(self):
        model = model_cfg(self.cfg)
        if model is None:
            return None
        bb_cfg = copy.deepcopy(model['backbone'])
        bb_cfg['init_cfg'] = None
        models = model_registry(self.cfg)
        try:
            with torch.device('meta'):
                return models.build(bb_cfg)
        except ValueError as e:  # our range checks (arch, out_indices, ...): a clear message
            raise ConfigError(f'model.backbone: {e}') from None
        except META_BUILD_ERRORS as e:
            from mmengine.logging import MMLogger
            logger = self.logger or MMLogger.get_current_instance()
            first = (str(e).strip().splitlines() or [''])[0][:200]
            logger.warning(
                f"pre-flight: model.backbone ({bb_cfg.get('type')}) does not build on the meta "
                f'device ({type(e).__name__}: {first}); the neck / heads in_channels and the '
                'backbone checkpoint fit are not checked before the Runner builds the model')
            return None
