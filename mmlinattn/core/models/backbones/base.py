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
    ``frozen_stages`` and ``norm_eval``. Subclasses define ``arch_zoo``, ``default_attn_type``,
    ``authors_layout`` (the released checkpoints' :class:`~mmlinattn.core.weights.AuthorsLayout`)
    and ``out_norm_name`` (the attribute holding the output norms).

    Args shared by the families:
        arch (str | dict): a name of ``arch_zoo`` (or its first letter), or a dict with
            ``embed_dims, depths, num_heads`` (and optionally ``drop_path_rate``, ...).
        in_channels (int): image channels.
        attn_type (str | list | None): the core of every block
            (:func:`mmlinattn.core.ops.cores.parse_attn_type`): one letter per stage (``I`` InLine,
            ``M`` MALA, ``S`` softmax, ``L`` linear, ...) or a mixed stage in parentheses
            (``(I2S)``); ``None``: the arch's or family's default.
        attn_cfg (dict | None): keywords of every block's attention module: the shared
            ``qkv_bias``, ``kernel``, ``attn_drop``, ``proj_drop``, ``core_options`` (e.g.
            ``dict(core_options=dict(beta=False))``) and the module's own.
        out_indices (Sequence[int]): stages whose features are returned.
        frozen_stages (int): -1 nothing frozen, 0 the stem, k also stages 1..k.
        norm_eval (bool): keep BatchNorm layers in eval mode while training.
        with_cp (bool): activation checkpointing of each block while training.
        drop_path_rate (float | None): stochastic depth at the last block (``None``: the arch's).
        out_norm (bool): a norm (``norm_cfg``) on each returned stage.
        norm_cfg (dict): the family's transformer norm: the blocks' norms and the output norms.
        init_cfg (dict | None): ``dict(type='Pretrained', checkpoint=PATH)`` loads the authors'
            file.
    """
    arch_zoo: Dict[str, dict] = {}
    arch_keys: Sequence[str] = ()
    default_attn_type: str = ''
    #: whether ``attn_type`` may use an older spelling (:func:`parse_attn_type`)
    legacy_mixed: bool = False
    out_norm_name: str = 'out_norms'
    authors_layout: AuthorsLayout = AuthorsLayout('base', classification=('head.',))

    #: the key of this backbone's entry in a state dict's ``_metadata`` that records the attention
    #: function of every attention module (:func:`~mmlinattn.core.weights.attention_functions`)
    TRAINED_AS_KEY = 'mmlinattn_attention'

    def __init__(self, init_cfg=None):
        super().__init__(init_cfg=copy.deepcopy(init_cfg))
        #: load weights recorded as another attention function (MAViT's softmax and MALA stages
        #: share their parameters) without the stop; the config's ``allow_attention_change=True``
        #: sets it
        self.allow_attention_change = False
        #: the next load was checked already (a Runner's checks compared the checkpoint's
        #: recorded config): the load pre-hook passes it once
        self.trained_as_checked = False
        # a checkpoint records the function in its state dict (record_trained_as, at the save),
        # so any Runner and any tool that loads it into this backbone checks it (no hook a
        # config can drop); a state dict without the record (model.state_dict(), the authors'
        # files) loads as torch loads it
        from mmlinattn.core.weights.allowlist import hint_upstream_fixes
        hint_upstream_fixes()  # built before the run writes a checkpoint
        add_pre = getattr(self, 'register_load_state_dict_pre_hook', None)
        if add_pre is not None:
            add_pre(_check_trained_as)
        else:  # torch < 2.? : the private spelling, the module passed first the same way
            self._register_load_state_dict_pre_hook(_check_trained_as, with_module=True)

    @property
    def _new_prefixes(self) -> Sequence[str]:
        """Keys the authors' files cannot have: our output norms."""
        return (self.out_norm_name + '.',)

    def _block_cores(self, attn_type, arch: dict) -> List[List[str]]:
        """One core name per block from ``attn_type`` (or the arch's / family's default)."""
        spec = attn_type or arch.get('attn_type') or self.default_attn_type
        return parse_attn_type(spec, self.depths, type(self).__name__,
                               legacy_mixed=self.legacy_mixed)

    # ------------------------------------------------------------------ construction
    def _check_attn_cfg(self, attn_cfg: Optional[dict], modules,
                        owned: Sequence[str] = ('dim', 'num_heads', 'core')) -> None:
        """Refuse keys of ``attn_cfg`` that are no keywords of ``modules`` or are ``owned``."""
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
        """Resolve ``arch`` (returned), check and store the arguments every family takes; ``dpr``:
        the drop-path rates per stage and block, rising linearly to ``drop_path_rate``."""
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
        """A ``norm_cfg`` norm on each returned stage, an ``Identity`` on the others."""
        self.out_norm = out_norm
        if out_norm:
            setattr(self, self.out_norm_name, nn.ModuleList(
                [LayerNorm2d(d, norm_cfg=norm_cfg) if i in self.out_indices else nn.Identity()
                 for i, d in enumerate(self.embed_dims)]))

    # ------------------------------------------------------------------ forward
    def forward_stem(self, x: torch.Tensor):
        """The image -> stage 0's input: ``patch_embed`` (MAViT's stem, Swin's patch embedding)."""
        return self.patch_embed(x)

    def run_stage(self, i: int, x, downsample: bool):
        """Stage ``i`` -> ``(its (B, C, H, W) map, stage i + 1's input)``."""
        return self.layers[i](x, downsample=downsample)

    def forward(self, x: torch.Tensor) -> tuple:
        """The (B, C, H, W) maps of the stages in ``out_indices``, each through its output norm."""
        x = self.forward_stem(x)
        last = max(self.out_indices)
        outs = []
        for i in range(last + 1):
            out, x = self.run_stage(i, x, downsample=i < last)
            if i in self.out_indices:
                outs.append(self._output(i, out))
        return tuple(outs)

    def _output(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage i's output through its norm, in contiguous NCHW memory (as RoIAlign reads)."""
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
        elif cfg is None:
            self.apply(self._default_init)
            self._post_init()
        else:
            return super().init_weights()
        self.is_init = True

    def _post_init(self):
        """Hook for inits that must follow the generic one (e.g. layer-scale values)."""

    def load_pretrained(self, checkpoint: str, use_ema: bool = False, prefix: str = '',
                        allow_unsafe: bool = False) -> dict:
        """Load the authors' (or our) backbone weights by :func:`fit_backbone_checkpoint`."""
        # initialised first, for the keys the checkpoint does not carry
        self.apply(self._default_init)
        self._post_init()
        return fit_backbone_checkpoint(self, checkpoint, use_ema=use_ema, prefix=prefix,
                                       allow_unsafe=allow_unsafe,
                                       logger=MMLogger.get_current_instance())

    # ------------------------------------------------------------------ freezing
    def _stage_modules(self, i: int) -> Iterable[nn.Module]:
        """Modules (or parameters) of stage i, i = 0 the stem."""
        return [self.patch_embed] if i == 0 else [self.layers[i - 1]]

    def _freeze_stages(self):
        for i in range(self.frozen_stages + 1):
            mods = list(self._stage_modules(i))
            if i > 0 and self.out_norm:
                mods.append(getattr(self, self.out_norm_name)[i - 1])
            for m in mods:
                if isinstance(m, nn.Parameter):
                    m.requires_grad = False
                elif m is not None:
                    m.eval()
                    m.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):  # BatchNorm2d and SyncBatchNorm alike
                    m.eval()
        return self


def record_trained_as(model: nn.Module, state_dict) -> None:
    """Record in ``state_dict``'s metadata (torch's ``_metadata``, which mmengine's checkpoints and
    ``torch.load`` keep) what each attention module of every backbone of ours in ``model``
    computes, under the backbone's own entry: the check a load into such a backbone makes. Called
    on a checkpoint being saved (the runtime's ``RunChecksHook.before_save_checkpoint``; a run
    whose hook list lacks it writes no record, and its checkpoints are checked by the Runner's
    comparison of their recorded config only)."""
    from collections import OrderedDict

    from mmlinattn.core.weights.fitting import attention_functions
    metadata = getattr(state_dict, '_metadata', None)
    if metadata is None:
        metadata = state_dict._metadata = OrderedDict()
    for name, module in model.named_modules():
        if isinstance(module, LinAttnBackbone):
            entry = metadata.setdefault(name, {'version': module._version})
            entry[LinAttnBackbone.TRAINED_AS_KEY] = attention_functions(module)


def _check_trained_as(module, state_dict, prefix, local_metadata, strict, missing_keys,
                      unexpected_keys, error_msgs) -> None:
    """Load pre-hook: a state dict recorded as another attention function stops the load, naming
    the first modules that differ (a state dict without the record, such as the authors' files,
    is not checked here)."""
    recorded = (local_metadata or {}).get(LinAttnBackbone.TRAINED_AS_KEY)
    if getattr(module, 'trained_as_checked', False):
        module.trained_as_checked = False
        return
    if not isinstance(recorded, (list, tuple)):
        return
    from mmlinattn.core.weights import CheckpointError
    from mmlinattn.core.weights.fitting import attention_functions, by_module
    theirs, own = by_module(recorded), by_module(attention_functions(module))
    if theirs == own:
        return
    diff = [f'{prefix}{n}: {theirs.get(n, "(none)")} (weights) vs {own.get(n, "(none)")} (model)'
            for n in list(theirs) + [n for n in own if n not in theirs]
            if theirs.get(n) != own.get(n)]
    msg = (f'the weights loaded into {type(module).__name__} ({prefix.rstrip(".") or "model"}) '
           f'were trained as another attention function than the model builds: '
           f'{"; ".join(diff[:2])}' + (f' (and {len(diff) - 2} more)' if len(diff) > 2 else ''))
    if getattr(module, 'allow_attention_change', False):
        MMLogger.get_current_instance().warning(
            msg + ' - loaded anyway (allow_attention_change=True)')
        return
    raise CheckpointError(
        msg + '. Build the backbone as the weights were trained (its attn_type / attn_cfg: the '
        "checkpoint's meta.cfg records them); to run these weights with the other function on "
        'purpose, add allow_attention_change=True to the config.')
