"""The family table: a family is its backbone class plus one :class:`Family` row here, from which
come the config folders and name prefixes, the family names the tools take and the authors'
checkpoint table (:data:`AUTHORS_CHECKPOINTS`). Adding one: its class, its row in :data:`ROWS` (or
:func:`register_family`, before the tools are imported), its configs (``configs/<name>/``: the T
config of each recipe over ``configs/_base_``, the larger archs inheriting it) and FLOP figures
(``mmlinattn.analysis.flops``)."""
import inspect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .models.backbones import InLinePVT, InLineSwin, MAViT


@dataclass(frozen=True)
class AuthorsCheckpoint:
    """One ImageNet file the authors publish: its URL and its name under ``checkpoints/``."""
    url: str
    filename: str
    family: str
    arch: str


@dataclass(frozen=True)
class Family:
    """One backbone family: ``name`` (the config folder, ``inline_pvt``), ``backbone`` (its
    registered class), ``title`` (in docs and metafiles; download keys are ``title`` with ``_`` and
    the arch letter: ``InLine_PVT_T``) and ``checkpoints`` (the authors' files by arch: (URL, local
    name))."""
    name: str
    backbone: type
    title: str
    checkpoints: Dict[str, Tuple[str, str]]

    @property
    def prefix(self) -> str:
        """The family in config names: ``inline-pvt``."""
        return self.name.replace('_', '-')

    @property
    def archs(self) -> Dict[str, str]:
        """{letter: arch name} of the class's arch table, in its order (``{'t': 'tiny', ...}``)."""
        return {name[0]: name for name in self.backbone.arch_zoo}

    def checkpoint_key(self, arch: str) -> str:
        """The download key of ``arch``'s file: ``InLine_PVT_T``."""
        return f"{self.title.replace('-', '_')}_{self.archs.get(arch, arch)[0].upper()}"


_TSINGHUA = 'https://cloud.tsinghua.edu.cn/f/{}/?dl=1'  # the share page's direct-download form
_MALA_HUB = 'https://huggingface.co/aldjalkdf/MAViT/resolve/main/{}'  # the file, not the tree page

#: The rows. The InLine README (LeapLabTHU/InLine) links TsinghuaCloud pages (the file with
#: ``?dl=1``), the MALA README (qhfan/MALA) the Hugging Face repository ``aldjalkdf/MAViT``.
ROWS = (
    Family(
        name='inline_pvt', backbone=InLinePVT, title='InLine-PVT',
        checkpoints={
            'tiny': (_TSINGHUA.format('90ac52b1555b401eb5e6'), 'inline_pvt_t.pth'),
            'small': (_TSINGHUA.format('1ab953b2479d433080a3'), 'inline_pvt_s.pth'),
            'medium': (_TSINGHUA.format('a72aec31e6084bc0a280'), 'inline_pvt_m.pth'),
            'large': (_TSINGHUA.format('efd91318ba964f01b288'), 'inline_pvt_l.pth')}),
    Family(
        name='inline_swin', backbone=InLineSwin, title='InLine-Swin',
        checkpoints={
            'tiny': (_TSINGHUA.format('32810869fcc34410966b'), 'inline_swin_t.pth'),
            'small': (_TSINGHUA.format('e9657fd247c04c7cb1a1'), 'inline_swin_s.pth'),
            'base': (_TSINGHUA.format('bf23564bb64c420aafe1'), 'inline_swin_b.pth')}),
    Family(
        name='mavit', backbone=MAViT, title='MAViT',
        checkpoints={a: (_MALA_HUB.format(f'MAViT_{a[0].upper()}.pth'), f'MAViT_{a[0].upper()}.pth')
                     for a in ('tiny', 'small', 'base', 'large')}),
)

#: family name -> row, in the table's order
FAMILIES: 'OrderedDict[str, Family]' = OrderedDict((row.name, row) for row in ROWS)


def authors_checkpoints(families=None) -> 'OrderedDict[str, AuthorsCheckpoint]':
    """The authors' files by download key (``InLine_PVT_T``); fills ``urls.AUTHORS_NAMES``,
    ``_KEYS``."""
    from .weights.urls import AUTHORS_KEYS, AUTHORS_NAMES
    out = OrderedDict()
    for fam in (FAMILIES if families is None else families).values():
        for arch, (url, filename) in fam.checkpoints.items():
            out[fam.checkpoint_key(arch)] = AuthorsCheckpoint(url, filename, fam.name, arch)
            AUTHORS_NAMES[url] = filename
            AUTHORS_KEYS[url] = fam.checkpoint_key(arch)
    return out


#: the authors' ImageNet files, by download key (``tools/misc/download_checkpoints.py``)
AUTHORS_CHECKPOINTS = authors_checkpoints()


def register_family(row: Family) -> Family:
    """Add ``row`` to :data:`FAMILIES` and :data:`AUTHORS_CHECKPOINTS`; ``ValueError`` if taken."""
    initials = [arch[0] for arch in row.backbone.arch_zoo]
    if len(set(initials)) != len(initials):
        raise ValueError(f'family {row.name!r}: the archs of {row.backbone.__name__} '
                         f'({", ".join(row.backbone.arch_zoo)}) must start with different letters '
                         '(config names and download keys use the first letter)')
    for fam in FAMILIES.values():
        if row.name == fam.name or row.backbone is fam.backbone or row.prefix == fam.prefix:
            raise ValueError(f'family {row.name!r} ({row.backbone.__name__}) collides with the '
                             f'row {fam.name!r} ({fam.backbone.__name__})')
    FAMILIES[row.name] = row
    AUTHORS_CHECKPOINTS.update(authors_checkpoints({row.name: row}))
    return row


def backbone_classes(families=None) -> Dict[str, type]:
    """{class name: class} of every family (``InLinePVT`` ...)."""
    rows = FAMILIES if families is None else families
    return {f.backbone.__name__: f.backbone for f in rows.values()}


def family_of(backbone: str, families=None) -> Optional[Family]:
    """The row whose class is named ``backbone`` (a config's ``type``, scope prefix allowed)."""
    name = str(backbone).split('.')[-1]
    return next((f for f in (FAMILIES if families is None else families).values()
                 if f.backbone.__name__ == name), None)


def out_channels(backbone_cfg: dict, families=None) -> List[int]:
    """Channels of the maps a backbone config returns, without building it."""
    cfg = dict(backbone_cfg)
    fam = family_of(cfg.get('type', ''), families)
    if fam is None:
        raise KeyError(f"{str(cfg.get('type', '')).split('.')[-1]!r} is not an mmlinattn backbone; "
                       f'choose one of {sorted(backbone_classes(families))}')
    defaults = inspect.signature(fam.backbone.__init__).parameters
    arch = cfg.get('arch', defaults['arch'].default)
    out_indices = cfg.get('out_indices', defaults['out_indices'].default)
    out_indices = list(out_indices) if isinstance(out_indices, (list, tuple)) else [out_indices]
    channels = fam.backbone.stage_channels(arch)
    return [channels[i] for i in out_indices]


__all__ = ['AUTHORS_CHECKPOINTS', 'AuthorsCheckpoint', 'FAMILIES', 'Family', 'ROWS',
           'authors_checkpoints', 'backbone_classes', 'family_of', 'out_channels',
           'register_family']
