"""``--cfg-options``: the argparse action, and the overrides checked against the config."""
import difflib
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


def check_cfg_options(cfg: Config, cfg_options: dict) -> None:
    """An override whose value cannot replace the config's (a word where the config has a number or
    a bool; mmengine parses what is not a number, bool, None or list as a string) is a
    :class:`ConfigError` naming the key, the value and the type expected; a key the config does not
    have, but that is close to one it has, gets a did-you-mean warning."""
    for key, new in cfg_options.items():
        old = _lookup(cfg, key)
        if old is _MISSING:
            parent, _, leaf = key.rpartition('.')
            node = _lookup(cfg, parent) if parent else cfg
            if isinstance(node, (dict, Config)):
                close = difflib.get_close_matches(leaf, list(node.keys()), n=1, cutoff=0.8)
                if close:
                    warnings.warn(f'--cfg-options {key}: the config has no such key (added as new); '
                                  f'did you mean {(parent + ".") if parent else ""}{close[0]}?',
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
