import inspect
from typing import List

from .inline_pvt import InLinePVT
from .inline_swin import InLineSwin
from .mavit import MAViT

# family name (the converter's and the classifier helpers') -> backbone class
FAMILIES = {'inline_pvt': InLinePVT, 'inline_swin': InLineSwin, 'mavit': MAViT}
LAYOUTS = {name: cls.authors_layout for name, cls in FAMILIES.items()}

__all__ = ['InLinePVT', 'InLineSwin', 'MAViT', 'FAMILIES', 'LAYOUTS', 'family_facts',
           'out_channels']


def out_channels(backbone_cfg: dict) -> List[int]:
    """Channels of the maps an mmlinattn backbone config returns (its ``out_indices``), read from
    the backbone class's arch table without building it, e.g.
    ``out_channels(dict(type='MAViT', arch='tiny'))`` -> ``[64, 128, 256, 512]``.

    Raises ``KeyError`` for a ``type`` that is not one of ours."""
    cfg = dict(backbone_cfg)
    name = str(cfg.get('type', '')).split('.')[-1]
    families = {c.__name__: c for c in FAMILIES.values()}
    if name not in families:
        raise KeyError(f'{name!r} is not an mmlinattn backbone; choose one of {sorted(families)}')
    cls = families[name]
    defaults = inspect.signature(cls.__init__).parameters
    arch = cfg.get('arch', defaults['arch'].default)
    out_indices = cfg.get('out_indices', defaults['out_indices'].default)
    out_indices = list(out_indices) if isinstance(out_indices, (list, tuple)) else [out_indices]
    channels = cls.stage_channels(arch)
    return [channels[i] for i in out_indices]


def family_facts() -> dict:
    """Per family, what configs and tools name and size from the classes' arch tables: ``type`` (the
    class name), ``prefix`` (in config names, ``inline-pvt``), ``archs`` ({letter: arch name}),
    ``channels`` and ``drop_path`` ({letter: the arch's stage channels / drop-path rate})."""
    facts = {}
    for family, cls in FAMILIES.items():
        archs = {name[0]: name for name in cls.arch_zoo}
        facts[family] = dict(
            type=cls.__name__, prefix=family.replace('_', '-'), archs=archs,
            channels={a: cls.stage_channels(n) for a, n in archs.items()},
            drop_path={a: cls.resolve_arch(n)['drop_path_rate'] for a, n in archs.items()})
    return facts
