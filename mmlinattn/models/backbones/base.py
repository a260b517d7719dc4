"""What the three backbone families share: arch tables, init / pretrained loading, freezing."""
import copy
from typing import Dict, Iterable, Sequence

import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from mmlinattn.checkpoint import extract_state_dict, fit_state_dict, read_checkpoint


class LinAttnBackbone(BaseModule):
    """Base class: ``arch`` resolution, ``init_cfg`` Pretrained loading of the authors' files,
    ``frozen_stages`` and ``norm_eval``.

    Subclasses define ``arch_zoo``, ``_ckpt_drop_prefixes`` (classification parts of the authors'
    checkpoints), ``_ckpt_tolerated`` (buffers we recompute), ``_new_prefixes`` (our output norms), and
    ``_frozen_modules(i)`` (the modules of stage i; i = 0 the stem).
    """
    arch_zoo: Dict[str, dict] = {}
    arch_keys: Sequence[str] = ()
    _ckpt_drop_prefixes: Sequence[str] = ('head.',)
    _ckpt_tolerated: Sequence[str] = ()
    _new_prefixes: Sequence[str] = ()

    def __init__(self, init_cfg=None):
        super().__init__(init_cfg=copy.deepcopy(init_cfg))

    @classmethod
    def resolve_arch(cls, arch) -> dict:
        if isinstance(arch, str):
            key = arch.lower()
            aliases = {k[0]: k for k in cls.arch_zoo}
            key = aliases.get(key, key) if len(key) == 1 else key
            if key not in cls.arch_zoo:
                raise ValueError(f'{cls.__name__}: unknown arch {arch!r}; choose one of '
                                 f'{sorted(cls.arch_zoo)} or pass a dict with keys {list(cls.arch_keys)}')
            out = dict(cls.arch_zoo[key])
            out['name'] = key
            return out
        if isinstance(arch, dict):
            missing = set(cls.arch_keys) - set(arch)
            if missing:
                raise ValueError(f'{cls.__name__}: custom arch dict lacks {sorted(missing)} '
                                 f'(needs {list(cls.arch_keys)})')
            out = dict(arch)
            out.setdefault('name', 'custom')
            return out
        raise TypeError(f'{cls.__name__}: arch must be a str or a dict, got {type(arch).__name__}')

    # ------------------------------------------------------------------ init / checkpoints
    def _default_init(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.Conv1d)):
            nn.init.trunc_normal_(m.weight, std=.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def init_weights(self):
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            self.load_pretrained(cfg['checkpoint'], use_ema=cfg.get('use_ema', False),
                                 prefix=cfg.get('prefix', ''),
                                 allow_unsafe=cfg.get('allow_unsafe', False))
            self._is_init = True
            return
        if cfg is None:
            self.apply(self._default_init)
            self._post_init()
            self._is_init = True
            return
        super().init_weights()

    def _post_init(self):
        """Hook for inits that must follow the generic one (e.g. layer-scale values)."""

    def convert_state_dict(self, state: dict) -> dict:
        """Adapt checkpoint tensors to this model (e.g. resize position tables). Default: as is."""
        return state

    def load_pretrained(self, checkpoint: str, use_ema: bool = False, prefix: str = '',
                        allow_unsafe: bool = False) -> dict:
        """Load the authors' classification checkpoint (or our own backbone weights).

        Raises :class:`mmlinattn.checkpoint.CheckpointError` naming the path and the first mismatched
        keys when the file does not fit this architecture.
        """
        logger = MMLogger.get_current_instance()
        obj = read_checkpoint(checkpoint, allow_unsafe=allow_unsafe, logger=logger)
        state = extract_state_dict(obj, use_ema=use_ema, path=checkpoint)
        if not prefix and any(k.startswith('backbone.') for k in state):
            prefix = 'backbone.'  # a whole detector/segmentor checkpoint
        if prefix:
            state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        # the model's state has to be initialised for keys the checkpoint does not carry
        self.apply(self._default_init)
        self._post_init()
        state = self.convert_state_dict(state)
        return fit_state_dict(self, state, drop_prefixes=self._ckpt_drop_prefixes,
                              tolerated=self._ckpt_tolerated, new_prefixes=self._new_prefixes,
                              path=checkpoint, logger=logger)

    # ------------------------------------------------------------------ freezing
    def _frozen_modules(self, i: int) -> Iterable[nn.Module]:
        raise NotImplementedError

    def _freeze_stages(self):
        for i in range(self.frozen_stages + 1):
            for m in self._frozen_modules(i):
                if m is None:
                    continue
                if isinstance(m, nn.Parameter):
                    m.requires_grad = False
                    continue
                m.eval()
                for p in m.parameters():
                    p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):  # BatchNorm2d and SyncBatchNorm alike
                    m.eval()
        return self

    @staticmethod
    def run_block(block: nn.Module, with_cp: bool, *args):
        if with_cp and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False)
        return block(*args)
