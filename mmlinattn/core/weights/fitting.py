"""Fitting a state dict to a model with an exact report: what loads, what is dropped, ignored or
new, and one error naming the first misfits when a file belongs to another architecture."""
import logging
from collections import OrderedDict
from typing import Dict, Iterable, List, Optional, Sequence

import torch

from .errors import CheckpointError
from .reading import extract_state_dict, read_checkpoint
from .urls import DownloadError, authors_download_error, backbone_checkpoint

Tensor = torch.Tensor


def _fmt(keys: Sequence[str], limit: int = 12) -> str:
    keys = list(keys)
    more = f' ... (+{len(keys) - limit} more)' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def _misfit(mismatched: List[str], missing: List[str], unexpected: List[str], limit: int) -> str:
    """The non-empty parts of 'N shape mismatch(es): ...; N key(s) missing ...; ...'."""
    parts = []
    for items, what, n in ((mismatched, 'shape mismatch(es)', limit),
                           (missing, 'key(s) missing from the checkpoint', 2 * limit),
                           (unexpected, 'key(s) not in the model', 2 * limit)):
        if items:
            parts.append(f'{len(items)} {what}: {_fmt(items, n)}')
    return '; '.join(parts)


def fit_state_dict(model: torch.nn.Module, state: Dict[str, Tensor], *,
                   tolerated: Iterable[str] = (), new_prefixes: Iterable[str] = (),
                   path: str = '<checkpoint>', logger: Optional[logging.Logger] = None,
                   check_only: bool = False) -> Dict[str, List[str]]:
    """Load ``state`` into ``model`` (``check_only``: not) with an exact report. Keys named in
    ``tolerated`` may be missing on either side, model keys starting with ``new_prefixes`` from the
    checkpoint (new); anything else missing, unexpected or misshapen raises
    :class:`CheckpointError`."""
    logger = logger or logging.getLogger('mmlinattn')
    own = model.state_dict()
    tolerated, new_prefixes = set(tolerated), tuple(new_prefixes)
    ignored, unexpected, mismatched = [], [], []
    to_load = OrderedDict()
    for k, v in state.items():
        if k not in own:
            (ignored if k.rsplit('.', 1)[-1] in tolerated else unexpected).append(k)
        elif own[k].shape != v.shape:
            mismatched.append(f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}')
        else:
            to_load[k] = v
    missing = [k for k in own if k not in to_load and k.rsplit('.', 1)[-1] not in tolerated]
    new = [k for k in missing if new_prefixes and k.startswith(new_prefixes)]
    missing = [k for k in missing if k not in new]
    if mismatched or unexpected or missing:
        raise CheckpointError(
            f'{path} does not fit {type(model).__name__}'
            f'{" (" + model.arch_name + ")" if hasattr(model, "arch_name") else ""} - is it the '
            f'checkpoint of another architecture/size? '
            + _misfit(mismatched, missing, unexpected, 6))
    if check_only:
        return dict(loaded=list(to_load), dropped=[], ignored=ignored, new=new)
    model.load_state_dict(to_load, strict=False)
    logger.info(f'loaded {len(to_load)} tensors from {path} into {type(model).__name__}')
    if ignored:
        logger.info(f'ignored {len(ignored)} recomputed buffers: {_fmt(ignored, 8)}')
    if new:
        logger.info(f'newly initialised (not in the checkpoint): {_fmt(new, 50)}')
    return dict(loaded=list(to_load), dropped=[], ignored=ignored, new=new)


def fit_backbone_checkpoint(backbone: torch.nn.Module, checkpoint: str, *, obj=None,
                            use_ema: bool = False, prefix: str = '', allow_unsafe: bool = False,
                            check_only: bool = False, logger: Optional[logging.Logger] = None
                            ) -> Dict[str, List[str]]:
    """The one path from a backbone checkpoint (``obj`` if read already; a missing zoo
    ``checkpoints/<name>`` from the authors' URL; a whole detector under ``prefix`` ``backbone.``)
    through ``backbone.authors_layout``'s filter and :func:`fit_state_dict` (``check_only``: the
    pre-flight); returns the report, :class:`CheckpointError` on a misfit."""
    logger = logger or logging.getLogger('mmlinattn')
    if obj is None:
        source = backbone_checkpoint(checkpoint, logger)
        try:
            obj = read_checkpoint(source, map_location='meta' if check_only else 'cpu',
                                  allow_unsafe=allow_unsafe, logger=logger)
        except DownloadError as e:
            if source == checkpoint:
                raise
            raise authors_download_error(checkpoint, source, e) from None
    state = extract_state_dict(obj, use_ema=use_ema, path=checkpoint)
    if not prefix and any(k.startswith('backbone.') for k in state):
        prefix = 'backbone.'  # a whole detector/segmentor checkpoint
    if prefix:
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if not state:
            raise CheckpointError(f'{checkpoint}: no key starts with prefix {prefix!r}')
    layout = backbone.authors_layout
    state, filtered = layout.filter(state, backbone)
    report = fit_state_dict(backbone, state, tolerated=layout.tolerated,
                            new_prefixes=backbone._new_prefixes, path=checkpoint, logger=logger,
                            check_only=check_only)
    if filtered['dropped'] and not check_only:
        logger.info(f'dropped {len(filtered["dropped"])} classification keys: '
                    f'{", ".join(filtered["dropped"][:50])}')
    report['dropped'] = filtered['dropped']
    report['ignored'] = filtered['ignored'] + report['ignored']
    return report


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model a whole-model checkpoint was saved from: without DDP / TTA wrappers."""
    from mmengine.model import BaseTTAModel, is_model_wrapper
    while is_model_wrapper(model) or isinstance(model, BaseTTAModel):
        model = model.module
    return model


def check_model_checkpoint(model: torch.nn.Module, path: str, *, obj=None, partial: bool = False,
                           what: str = 'checkpoint', logger: Optional[logging.Logger] = None,
                           backbone_cfg=None, allow_attention_change: bool = False
                           ) -> Dict[str, List[str]]:
    """Refuse a whole-model checkpoint that does not fit ``model`` key for key and shape for shape
    (``partial=True``: a warning) or was trained as another attention function (``obj``: read)."""
    logger = logger or logging.getLogger('mmlinattn')
    if obj is None:
        obj = read_checkpoint(path, logger=logger)
    state = extract_state_dict(obj, path=path)
    own = _unwrap(model).state_dict()
    mismatched = [f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}'
                  for k, v in state.items() if k in own and own[k].shape != v.shape]
    unexpected = [k for k in state if k not in own]
    missing = [k for k in own if k not in state]
    report = dict(mismatched=mismatched, unexpected=unexpected, missing=missing)
    if not (mismatched or unexpected or missing):
        check_trained_function(model, path, obj, backbone_cfg, allow=allow_attention_change,
                               what=what, logger=logger)
        return report
    name = type(_unwrap(model)).__name__
    msg = f'{what} {path} does not fit the config\'s model ({name}): ' + \
        _misfit(mismatched, missing, unexpected, 4)
    if partial:
        logger.warning(msg + ' - loading the fitting keys only (partial load requested)')
        return report
    raise CheckpointError(
        msg + '. Is it the checkpoint of another architecture, size or class count? Nothing was '
        'loaded. An ImageNet backbone file goes in model.backbone.init_cfg=dict(type="Pretrained", '
        'checkpoint=...); to fine-tune a whole detector/segmentor on other classes, pass '
        '--partial-load to tools/train.py.')


#: the backbone settings that change what a trained model computes without changing its keys
FUNCTION_KEYS = ('attn_type', 'attn_cfg', 'window_size', 'inline_window')


def attention_functions(backbone: torch.nn.Module) -> List[str]:
    """What each attention module of ``backbone`` computes, one line each (and literal windows)."""
    out = []
    for name, m in backbone.named_modules():
        if all(hasattr(m, a) for a in ('core', 'kernel', 'core_options', 'core_entry')):
            extra = f', window {m.window_size}' if hasattr(m, 'window_size') else ''
            out.append(f'{name}: {type(m).__name__} core={m.core} kernel={m.kernel} '
                       f'options={dict(sorted(m.core_options.items()))}{extra}')
        elif getattr(m, 'inline_window', None) is not None:
            out.append(f'{name}: inline_window={m.inline_window}')
    return out


def _literal(node):
    """The value of a literal expression (as mmengine's config dump writes); nothing is run."""
    import ast
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id == 'dict' and not node.args:
        if any(k.arg is None for k in node.keywords):
            raise ValueError('**kwargs')
        return {k.arg: _literal(k.value) for k in node.keywords}
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError('**kwargs')
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_literal(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand)
    return ast.literal_eval(node)  # constants; raises ValueError for names, calls, ...


def _recorded_backbone(obj):
    """``(model.backbone of the recorded meta.cfg, '')`` or ``(None, why not)``; never run."""
    import ast
    meta = obj.get('meta') if isinstance(obj, dict) else None
    text = meta.get('cfg') if isinstance(meta, dict) else None
    if not isinstance(text, str):
        return None, 'it records no config (meta.cfg)'
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError) as e:
        return None, f'its recorded config does not parse ({type(e).__name__})'
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and [getattr(t, 'id', None) for t in stmt.targets] == \
                ['model']:
            node = _keyword(stmt.value, 'backbone')
            if node is None:
                return None, 'its recorded config has no model.backbone'
            try:
                backbone = _literal(node)
            except (ValueError, TypeError, SyntaxError):
                return None, "its recorded model.backbone is not plain data (mmengine's dump)"
            if isinstance(backbone, dict):
                return backbone, ''
            return None, 'its recorded model.backbone is not a dict'
    return None, 'its recorded config has no model'


def _keyword(node, key: str):
    """The expression of ``key`` in a ``dict(key=...)`` call or a ``{'key': ...}``, or None."""
    import ast
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'dict':
        return next((k.value for k in node.keywords if k.arg == key), None)
    if isinstance(node, ast.Dict):
        return next((v for k, v in zip(node.keys, node.values)
                     if isinstance(k, ast.Constant) and k.value == key), None)
    return None


def _overrides(key: str, value) -> str:
    """``--cfg-options`` items that set ``key`` to ``value`` (a non-empty dict: one per leaf)."""
    if isinstance(value, dict) and value:
        return ' '.join(_overrides(f'{key}.{k}', v) for k, v in value.items())
    return f'{key}={value!r}'.replace(' ', '')


def check_trained_function(model: torch.nn.Module, path: str, obj, backbone_cfg=None, *,
                           allow: bool = False, what: str = 'checkpoint',
                           logger: Optional[logging.Logger] = None) -> None:
    """Refuse a whole-model checkpoint whose recorded backbone has the same keys but another
    attention function (MAViT's softmax and MALA stages share parameters); ``allow``: a warning."""
    logger = logger or logging.getLogger('mmlinattn')
    own = getattr(_unwrap(model), 'backbone', None)
    if own is None or not attention_functions(own):
        return  # no backbone of ours: nothing this check knows
    recorded, why = _recorded_backbone(obj)
    if recorded is not None and 'type' not in recorded:
        recorded, why = None, 'its recorded model.backbone has no type'
    if recorded is None:
        logger.warning(f'{what} {path}: the attention function it was trained as is not checked: '
                       f'{why}')
        return
    from mmengine.registry import MODELS  # the root registry, where ours are registered
    try:
        with torch.device('meta'):
            theirs = MODELS.build(dict(recorded, init_cfg=None))
    except Exception as e:  # not one of ours, or not buildable here (any error)
        logger.warning(f'{what} {path}: the attention function it was trained as is not checked: '
                       f'its recorded model.backbone does not build here ({type(e).__name__}: '
                       f'{str(e)[:120]})')
        return
    if type(theirs) is not type(own):
        return  # another class: the key check names it
    a, b = by_module(attention_functions(theirs)), by_module(attention_functions(own))
    if a == b:
        return
    diff = [f'{name}: {a.get(name, "(none)")} (checkpoint) vs {b.get(name, "(none)")} (config)'
            for name in list(a) + [n for n in b if n not in a] if a.get(name) != b.get(name)][:2]
    current = dict(backbone_cfg or {})
    settings = [k for k in FUNCTION_KEYS if recorded.get(k) != current.get(k)]
    fix = ' '.join(_overrides(f'model.backbone.{k}', recorded.get(k)) for k in settings)
    def shown(cfg, k):
        return f'{k}={cfg.get(k)!r}' + (' (the default)' if cfg.get(k) is None else '')
    trained = ', '.join(shown(recorded, k) for k in settings) or 'its defaults'
    here = ', '.join(shown(current, k) for k in settings) or 'its defaults'
    msg = (f'{what} {path} was trained as another attention function than the config builds '
           f'(checkpoint: {trained}; config: {here}): {"; ".join(diff)}')
    if allow:
        logger.warning(msg + ' - loaded anyway (allow_attention_change=True)')
        return
    raise CheckpointError(
        msg + f'. To run it as trained, set {fix or "the checkpoint config settings"} (tools/'
        'train.py and test.py: --cfg-options; elsewhere in the config file); to run these weights '
        'with the other function on purpose, add allow_attention_change=True to the config.')


def by_module(lines):
    """:func:`attention_functions` lines as ``{module name: its settings}``."""
    return dict(line.split(': ', 1) if ': ' in line else (line, '') for line in lines)
