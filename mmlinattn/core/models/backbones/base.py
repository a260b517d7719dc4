"""What the three backbone families share: arch tables, argument checks, the drop-path schedule,
output norms, init / pretrained loading, freezing."""
import copy
import inspect
from typing import Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from mmlinattn.core.models.layers import LayerNorm2d
from mmlinattn.core.ops.cores import CORES, parse_attn_type
from mmlinattn.core.weights import AuthorsLayout
from mmlinattn.core.weights.fitting import fit_backbone_checkpoint


class LinAttnBackbone(BaseModule):
    """Base class: ``arch`` resolution, ``init_cfg`` Pretrained loading of the authors' files,
    ``frozen_stages`` and ``norm_eval``.

    Subclasses define ``arch_zoo``, ``default_attn_type``, ``authors_layout`` (the
    :class:`~mmlinattn.core.weights.AuthorsLayout` of the released checkpoints: classification
    parts, recomputed buffers, size-dependent tensors), ``out_norm_name`` (the attribute holding the
    output norms) and ``_stage_modules(i)`` (the modules of stage i; i = 0 the stem).
    """
    arch_zoo: Dict[str, dict] = {}
    arch_keys: Sequence[str] = ()
    default_attn_type: str = ''
    #: whether ``attn_type`` may use an older spelling (:func:`parse_attn_type`)
    legacy_mixed: bool = False
    out_norm_name: str = 'out_norms'
    authors_layout: AuthorsLayout = AuthorsLayout('base', classification=('head.',))

    def __init__(self, init_cfg=None):
        super().__init__(init_cfg=copy.deepcopy(init_cfg))

    @property
    def _new_prefixes(self) -> Sequence[str]:
        """Keys that the authors' classification files cannot have: our output norms."""
        return (self.out_norm_name + '.',)

    def _block_cores(self, attn_type, arch: dict) -> List[List[str]]:
        """One core name per block from ``attn_type`` (or the arch's / family's default); the
        letters and names are those of :data:`mmlinattn.core.ops.cores.CORES`."""
        spec = attn_type or arch.get('attn_type') or self.default_attn_type
        return parse_attn_type(spec, self.depths, type(self).__name__,
                               legacy_mixed=self.legacy_mixed)

    # ------------------------------------------------------------------ construction
    def _check_attn_cfg(self, attn_cfg: Optional[dict], modules,
                        owned: Sequence[str] = ('dim', 'num_heads', 'core')) -> None:
        """``attn_cfg`` holds keyword options of the family's attention ``modules`` (one class or
        several) that the backbone does not set itself (``owned``); anything else is named with
        the keys it may hold (and a core's option, MALA's ``beta``, with where it goes)."""
        if attn_cfg is None:
            return
        owner = type(self).__name__
        if not isinstance(attn_cfg, dict):
            raise TypeError(f'{owner}: attn_cfg must be a dict, got {type(attn_cfg).__name__}')
        modules = tuple(modules) if isinstance(modules, (list, tuple)) else (modules,)
        valid: List[str] = []
        for module in modules:
            for p in inspect.signature(module.__init__).parameters.values():
                if p.name not in ('self', *owned, *valid) and \
                        p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                    valid.append(p.name)
        bad = [k for k in attn_cfg if k not in valid]
        if bad:
            core_opts = sorted(k for k in bad if k != 'dropout_p'
                               and any(k in c.options for c in CORES.values()))
            hint = (f'; {core_opts} belong to the attention core: write attn_cfg=dict('
                    f'core_options=dict({", ".join(f"{k}={attn_cfg[k]!r}" for k in core_opts)}))'
                    if core_opts else '')
            names = ', '.join(m.__name__ for m in modules)
            raise ValueError(f'{owner}: attn_cfg {bad} are not options of its attention '
                             f'module{"s" if len(modules) > 1 else ""} ({names}); it takes '
                             f'{valid} (the backbone sets {list(owned)} itself){hint}')

    def _setup(self, arch, out_indices: Sequence[int], frozen_stages: int, norm_eval: bool,
               with_cp: bool, drop_path_rate: Optional[float]) -> dict:
        """Resolve ``arch`` and check / store the arguments every family takes.

        Sets ``arch_name``, ``depths``, ``num_stages``, ``out_indices``, ``frozen_stages``,
        ``norm_eval``, ``with_cp`` and ``dpr`` (one drop-path rate per block, per stage, rising
        linearly from 0 to ``drop_path_rate`` over the whole network). Returns the arch dict.
        """
        owner = type(self).__name__
        arch = self.resolve_arch(arch)
        self.arch_name = arch['name']
        self.depths = list(arch['depths'])
        n = self.num_stages = len(self.depths)
        if not isinstance(out_indices, (list, tuple)):
            out_indices = (out_indices,)
        out_indices = tuple(out_indices)
        if not out_indices:
            raise ValueError(f'{owner}: out_indices is empty; choose stages from {list(range(n))}, '
                             'e.g. (0, 1, 2, 3)')
        bad = [i for i in out_indices if not isinstance(i, int) or not 0 <= i < n]
        if bad or len(set(out_indices)) != len(out_indices) or \
                list(out_indices) != sorted(out_indices):
            raise ValueError(f'{owner}: out_indices {out_indices} must be distinct, increasing '
                             f'stage indices from {list(range(n))}')
        if not isinstance(frozen_stages, int) or not -1 <= frozen_stages <= n:
            raise ValueError(f'{owner}: frozen_stages={frozen_stages!r} must be an int from -1 '
                             f'(nothing frozen), 0 (the stem) ... {n} (every stage)')
        rate = arch.get('drop_path_rate', 0.1) if drop_path_rate is None else drop_path_rate
        if not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise ValueError(f'{owner}: drop_path_rate={rate!r} must lie in [0, 1)')
        self.out_indices = out_indices
        self.frozen_stages, self.norm_eval, self.with_cp = frozen_stages, norm_eval, with_cp
        rates = torch.linspace(0, float(rate), sum(self.depths), device='cpu').tolist()
        starts = [sum(self.depths[:i]) for i in range(n)]
        self.dpr: List[List[float]] = [rates[s:s + d] for s, d in zip(starts, self.depths)]
        return arch

    def _set_dims(self, dims: Sequence[int]) -> None:
        """Channels per stage; ``num_features`` = the channels of the returned stages."""
        self.embed_dims = list(dims)
        self.num_features = [self.embed_dims[i] for i in self.out_indices]

    def _build_out_norms(self, out_norm: bool, norm_cfg: dict) -> None:
        """A norm over channels built from the backbone's ``norm_cfg`` (as mmdet's backbones build
        theirs) on each *returned* stage (``<out_norm_name>.<stage>``); the other stages get an
        ``Identity``, so no parameter is left without a gradient (DDP)."""
        self.out_norm = out_norm
        if out_norm:
            setattr(self, self.out_norm_name, nn.ModuleList(
                [LayerNorm2d(d, norm_cfg=norm_cfg) if i in self.out_indices else nn.Identity()
                 for i, d in enumerate(self.embed_dims)]))

    # ------------------------------------------------------------------ forward
    def forward_stem(self, x: torch.Tensor):
        """The image -> stage 0's input. The identity here: a family whose first stage starts with
        its own patch embedding (InLine-PVT) has no stem."""
        return x

    def run_stage(self, i: int, x, downsample: bool):
        """Stage ``i`` on its input ``x`` -> ``(output, next_input)``: its (B, C, H, W) map, and
        what stage ``i + 1`` takes (after the stage's own downsampling when ``downsample``; the
        stage skips it otherwise). The default runs ``self.layers[i]``, a stage module that owns its
        downsampling."""
        return self.layers[i](x, downsample=downsample)

    def forward(self, x: torch.Tensor) -> tuple:
        """The (B, C, H, W) maps of the stages in ``out_indices``, each through its output norm.

        The one loop of every family: stem, then each stage up to the last one returned; that stage
        skips its downsampling (nothing reads it) and the stages after it never run.
        """
        x = self.forward_stem(x)
        last = max(self.out_indices)
        outs = []
        for i in range(last + 1):
            out, x = self.run_stage(i, x, downsample=i < last)
            if i in self.out_indices:
                outs.append(self._output(i, out))
        return tuple(outs)

    def _output(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage i's (B, C, H, W) output through its output norm, if any, in contiguous NCHW memory.

        The maps come out of token layouts by a permute, i.e. with channels-last strides;
        convolutions keep that layout, and mmcv's C++ RoIAlign reads its input as plain NCHW memory
        without checking the strides - the RoI heads of a detector then see scrambled features (they
        do not learn).
        """
        x = getattr(self, self.out_norm_name)[i](x) if self.out_norm else x
        return x.contiguous()

    @classmethod
    def stage_channels(cls, arch) -> List[int]:
        """Channels of every stage of ``arch`` (a name or a dict), without building the model."""
        return [int(c) for c in cls.resolve_arch(arch)['embed_dims']]

    @classmethod
    def resolve_arch(cls, arch) -> dict:
        if isinstance(arch, str):
            key = arch.lower()
            aliases = {k[0]: k for k in cls.arch_zoo}
            key = aliases.get(key, key) if len(key) == 1 else key
            if key not in cls.arch_zoo:
                raise ValueError(f'{cls.__name__}: unknown arch {arch!r}; choose one of '
                                 f'{sorted(cls.arch_zoo)} or pass a dict with keys '
                                 f'{list(cls.arch_keys)}')
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
            n = len(out['depths'])
            for key, val in out.items():  # per-stage lists: one entry per stage of depths
                if key != 'depths' and isinstance(val, (list, tuple)) and len(val) != n:
                    raise ValueError(f'{cls.__name__}: custom arch: {key}={list(val)} has '
                                     f'{len(val)} entries but depths={list(out["depths"])} '
                                     f'has {n} stages')
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

    def load_pretrained(self, checkpoint: str, use_ema: bool = False, prefix: str = '',
                        allow_unsafe: bool = False) -> dict:
        """Load the authors' classification checkpoint (or our own backbone weights) through the
        family's :attr:`authors_layout` filter.

        Raises :class:`mmlinattn.core.weights.CheckpointError` naming the path and the first
        mismatched keys when the file does not fit this architecture. Returns the load report
        (``loaded``, ``dropped``, ``ignored``, ``new`` key lists). The reading, key mapping and
        fitting are :func:`mmlinattn.core.weights.fitting.fit_backbone_checkpoint`, which the
        tools' pre-flight (``tools/workshop/apis/preflight``) runs with ``check_only=True``.
        """
        # the model's state has to be initialised for keys the checkpoint does not carry
        self.apply(self._default_init)
        self._post_init()
        return fit_backbone_checkpoint(self, checkpoint, use_ema=use_ema, prefix=prefix,
                                       allow_unsafe=allow_unsafe,
                                       logger=MMLogger.get_current_instance())

    # ------------------------------------------------------------------ freezing
    def _stage_modules(self, i: int) -> Iterable[nn.Module]:
        """Modules (or parameters) of stage i, i = 0 the stem."""
        raise NotImplementedError

    def _frozen_modules(self, i: int) -> Iterable[nn.Module]:
        mods = list(self._stage_modules(i))
        if i > 0 and self.out_norm:
            mods.append(getattr(self, self.out_norm_name)[i - 1])
        return mods

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
