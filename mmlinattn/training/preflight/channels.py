"""Channels pre-flight: the neck's (or heads') ``in_channels`` against what our backbone returns."""
from typing import Optional

from mmengine.config import Config

from ..config import ConfigError
from .backbone import MetaBackbone, model_cfg


def check_model_channels(cfg: Config, backbone: Optional[MetaBackbone] = None) -> None:
    """Before the first forward: the neck's ``in_channels`` (or, without a neck, the
    decode/auxiliary heads' ``in_channels`` at their ``in_index``) must equal the channels our
    backbone returns for its ``out_indices``; else :class:`ConfigError` names both keys and both
    values. The backbone is built on the ``meta`` device (no memory, no init; ``backbone``: the
    run's :class:`MetaBackbone`, shared with the checkpoint pre-flight); backbones of other packages
    are left to their heads."""
    model = model_cfg(cfg)
    if model is None:
        return
    backbone = (backbone or MetaBackbone(cfg)).ours()
    if backbone is None:
        return
    channels = list(backbone.num_features)
    out_key = f'model.backbone.out_indices={list(backbone.out_indices)}'
    neck = model.get('neck')
    neck = neck[0] if isinstance(neck, (list, tuple)) and neck else neck
    problems = []
    if isinstance(neck, dict) and 'in_channels' in neck:
        got = neck['in_channels']
        got = list(got) if isinstance(got, (list, tuple)) else got
        want = channels if isinstance(got, list) else channels[-1]  # an int: the last map
        if got != want:
            problems.append(f'model.neck.in_channels={got} but {out_key} of '
                            f'{type(backbone).__name__} gives {want}')
    elif neck is None:
        for name in ('decode_head', 'auxiliary_head'):
            heads = model.get(name)
            for i, head in enumerate(heads if isinstance(heads, (list, tuple)) else [heads]):
                if not isinstance(head, dict) or 'in_channels' not in head:
                    continue
                idx = head.get('in_index', -1)
                try:
                    want = ([channels[j] for j in idx] if isinstance(idx, (list, tuple))
                            else channels[idx])
                except IndexError:
                    problems.append(f'model.{name}.in_index={idx} but {out_key} returns only '
                                    f'{len(channels)} feature maps')
                    continue
                got = head['in_channels']
                got = list(got) if isinstance(got, (list, tuple)) else got
                if got != want:
                    where = f'model.{name}' + (f'[{i}]' if isinstance(heads, (list, tuple)) else '')
                    problems.append(f'{where}.in_channels={got} but {out_key} of '
                                    f'{type(backbone).__name__} gives {want} at in_index={idx}')
    if problems:
        raise ConfigError.listing('the model does not fit together', problems)
