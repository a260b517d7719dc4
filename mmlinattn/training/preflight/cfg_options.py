"""``--cfg-options``: the argparse action, and the overrides checked against the config."""
import difflib
import importlib
import inspect
import warnings

from mmengine.config import Config, DictAction

from ..config import ConfigError

_MISSING = object()


class CfgOptionsAction(DictAction):
    """mmengine's ``--cfg-options`` parser, with an argparse error naming an item without ``=``."""

    def __call__(self, parser, namespace, values, option_string=None):
        for kv in values if isinstance(values, list) else [values]:
            if '=' not in kv or kv.startswith('='):
                parser.error(f'{option_string or "--cfg-options"} {kv!r}: expected key=value '
                             '(e.g. train_dataloader.batch_size=4)')
        super().__call__(parser, namespace, values, option_string)


def _lookup(cfg, dotted: str):
    node = cfg
    for part in dotted.split('.'):
        if isinstance(node, (dict, Config)) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


# the registry each top-level config key builds its ``type`` dicts from (mmengine's root registries;
# the config's default_scope selects the toolbox's child)
_REGISTRY_OF = {'default_hooks': 'HOOKS', 'custom_hooks': 'HOOKS', 'model': 'MODELS',
                'optim_wrapper': 'OPTIM_WRAPPERS', 'param_scheduler': 'PARAM_SCHEDULERS',
                'train_cfg': 'LOOPS', 'val_cfg': 'LOOPS', 'test_cfg': 'LOOPS',
                'visualizer': 'VISUALIZERS', 'train_dataloader': 'DATASETS',
                'val_dataloader': 'DATASETS', 'test_dataloader': 'DATASETS',
                'val_evaluator': 'METRICS', 'test_evaluator': 'METRICS'}
# classes that take ``**kwargs`` only to pass them to one other callable, which rejects the rest
_FORWARDS = {'CheckpointHook': ('mmengine.runner', 'Runner', 'save_checkpoint')}
# keys that the code building the object takes out of its dict before calling the class (mmengine's
# Runner: a hook's priority, a loop's by_epoch, a scheduler's convert_to_iter_based; the optimizer
# wrapper builder: paramwise_cfg and constructor), per registry; ``_scope_`` everywhere
_BUILDER_KEYS = {'HOOKS': {'priority'}, 'LOOPS': {'by_epoch'},
                 'PARAM_SCHEDULERS': {'convert_to_iter_based'},
                 'OPTIM_WRAPPERS': {'paramwise_cfg', 'constructor'}}


def _registry_of(parent: str):
    """The registry name the dict at ``parent`` is built from, or None (not checked)."""
    top = parent.split('.')[0]
    if parent == 'optim_wrapper.optimizer':
        return 'OPTIMIZERS'
    if top.endswith('_dataloader') and parent != top + '.dataset':
        return None  # the DataLoader's own arguments, samplers: not checked
    return _REGISTRY_OF.get(top)


def _built_class(cfg, parent: str, node):
    """The class the dict ``node`` at ``parent`` is built into, or None if unknown: a dict with a
    ``type`` (looked up in its registry, under the config's scope), or a runner loop (``train_cfg``
    without ``type``: mmengine picks the epoch- or iteration-based loop from ``by_epoch``)."""
    registry = _registry_of(parent)
    kind = node.get('type') if isinstance(node, (dict, Config)) else None
    if kind is None and parent in ('train_cfg', 'val_cfg', 'test_cfg'):
        from mmengine import runner as loops
        if parent != 'train_cfg':
            return loops.ValLoop if parent == 'val_cfg' else loops.TestLoop
        return loops.EpochBasedTrainLoop if node.get('by_epoch', True) else loops.IterBasedTrainLoop
    if kind is None or registry is None:
        return None
    if inspect.isclass(kind):
        return kind
    if not isinstance(kind, str):
        return None  # a function or another callable: no class signature to check against
    import mmengine.registry as registries
    root = getattr(registries, registry)  # our table names mmengine's registries
    try:
        with root.switch_scope_and_registry(cfg.get('default_scope')) as reg:
            cls = reg.get(kind)
    except ImportError as e:  # a module the registry imports for the lookup (a toolbox's) fails
        _not_checked(parent, kind, f'cannot be looked up ({type(e).__name__}: {e})')
        return None
    if cls is None:  # the Runner stops at it with the registry's own error
        _not_checked(parent, kind, f'is not in the {registry} registry')
    return cls if inspect.isclass(cls) else None


def _not_checked(parent: str, kind: str, why: str) -> None:
    from mmengine.logging import MMLogger
    MMLogger.get_current_instance().warning(
        f'--cfg-options: the keys given under {parent} are not checked against its class: '
        f'{parent}.type={kind!r} {why}')


def _accepted_keys(cls):
    """The keyword names ``cls(...)`` takes, or None if it takes any (``**kwargs`` that are not
    known to go on to one other callable) or has no signature to read."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return None
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        target = next((_FORWARDS[c.__name__] for c in cls.__mro__ if c.__name__ in _FORWARDS), None)
        if target is None:
            return None
        module, owner, fn = target
        forwarded = inspect.signature(getattr(getattr(importlib.import_module(module), owner), fn))
        names |= {p for p in forwarded.parameters if p != 'self'}
    names.discard('type')
    return names


def _rejected(cfg, key: str):
    """A message if the object built from the dict that ``key`` adds to would refuse the new key
    (checked against the class's signature), else None."""
    parent, _, leaf = key.rpartition('.')
    if not parent:
        return None
    node = _lookup(cfg, parent)
    if not isinstance(node, (dict, Config)):
        return None
    cls = _built_class(cfg, parent, node)
    accepted = _accepted_keys(cls) if cls is not None else None
    if accepted is None:
        return None
    accepted |= _BUILDER_KEYS.get(_registry_of(parent), set()) | {'_scope_'}
    if leaf in accepted:
        return None
    close = difflib.get_close_matches(leaf, sorted(accepted | set(node.keys())), n=1, cutoff=0.6)
    hint = f'did you mean {parent}.{close[0]}? ' if close else ''
    return (f'--cfg-options {key}: {parent} builds {cls.__name__}, which takes no {leaf!r}; {hint}'
            f'({cls.__name__} takes: {", ".join(sorted(accepted))})')


def check_cfg_options(cfg: Config, cfg_options: dict) -> None:
    """An override whose value cannot replace the config's (a word where the config has a number or
    a bool; mmengine parses what is not a number, bool, None or list as a string) is a
    :class:`ConfigError` naming the key, the value and the type expected; a key the config does not
    have, but that is close to one it has, gets a did-you-mean warning."""
    for key, new in cfg_options.items():
        old = _lookup(cfg, key)
        if old is _MISSING:
            rejected = _rejected(cfg, key)
            if rejected:
                raise ConfigError(rejected)
            parent, _, leaf = key.rpartition('.')
            node = _lookup(cfg, parent) if parent else cfg
            if isinstance(node, (dict, Config)):
                close = difflib.get_close_matches(leaf, list(node.keys()), n=1, cutoff=0.8)
                if close:
                    warnings.warn(f'--cfg-options {key}: the config has no such key (added as '
                                  f'new); did you mean '
                                  f'{(parent + ".") if parent else ""}{close[0]}?',
                                  stacklevel=2)
            continue
        bad = None
        if isinstance(new, str) and isinstance(old, bool):
            bad = 'True or False'
        elif isinstance(new, str) and isinstance(old, (int, float)):
            bad = 'a number'
        if bad:
            raise ConfigError(f'--cfg-options {key}={new!r}: expected {bad} (the config has '
                              f'{key}={old!r})')
