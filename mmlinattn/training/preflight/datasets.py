"""The datasets a config's dataloaders read, each as one :class:`DatasetView` computed once: what
every pre-flight check needs to know about it (its class and classes resolved, its paths joined to
its ``data_root``, whether it must carry labels), so that no check looks any of it up again."""
import importlib
import os.path as osp
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from mmengine.config import Config

from ..config import ConfigError


@dataclass
class DatasetView:
    """One dataset config of one loader, as the checks see it (built by :func:`dataset_views`).

    ``key`` is the config key of the dataset (``train_dataloader.dataset``, past any
    RepeatDataset / ClassBalancedDataset wrapper: ``...dataset.dataset``; a ConcatDataset's parts:
    ``...datasets.0``), ``loader`` the dataloader's key. ``cls`` is the dataset type looked up in
    the toolbox's registry (``None`` if it cannot be found); ``classes`` its ``metainfo.classes``,
    else the type's default ``METAINFO`` classes, else ``None``. ``ann_path`` and ``folders``
    (``data_prefix`` entry -> ``(as written, joined to data_root)``) are the paths as the dataset
    will open them. ``evaluators``: ``(key, config)`` of the evaluators scoring its loader;
    ``labels``: whether the set must carry labels - always for training, and for a val / test set
    unless every evaluator of its loader only formats results for a test server
    (``format_only=True``, as for COCO test-dev or the ADE20K test set) or dumps them."""
    key: str
    loader: str
    cfg: dict
    scope: Optional[str]
    cls: Optional[type]
    classes: Optional[List[str]]
    data_root: str
    ann_file: Optional[str]
    ann_path: Optional[str]
    folders: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    test_mode: bool = False
    filter_cfg: Optional[dict] = None
    evaluators: List[Tuple[str, dict]] = field(default_factory=list)
    labels: bool = True

    @property
    def type_name(self) -> str:
        return getattr(self.cls, '__name__', None) or str(self.cfg.get('type', ''))

    @property
    def is_coco_json(self) -> bool:
        """A COCO-format annotation file (``Coco*`` dataset type, a ``.json`` ann_file)."""
        return 'Coco' in str(self.cfg.get('type', '')) and bool(self.ann_path) and \
            self.ann_path.endswith('.json')

    @property
    def coco_image_dir(self) -> Optional[str]:
        """The folder a COCO file's ``file_name``s are relative to, if it exists."""
        path = self._join(self.folders.get('img', ('', ''))[0])
        return path if osp.isdir(path or '.') else None

    def _join(self, path: str) -> str:
        return path if osp.isabs(path) or not self.data_root else osp.join(self.data_root, path)


def dataset_cfgs(cfg: Config, which: Sequence[str]):
    """``(config key, dataset config)`` of every dataset the loaders ``which`` read, looking through
    RepeatDataset / ClassBalancedDataset / ConcatDataset wrappers."""
    for name in which:
        loader = cfg.get(name)
        if not loader:
            continue
        ds = loader.get('dataset')
        key = f'{name}.dataset'
        while isinstance(ds, dict) and 'dataset' in ds and 'data_root' not in ds:
            ds, key = ds['dataset'], key + '.dataset'
        if isinstance(ds, dict) and 'datasets' in ds:
            for i, sub in enumerate(ds['datasets']):
                yield f'{key}.datasets.{i}', sub
        elif isinstance(ds, dict):
            yield key, ds


def dataset_class(cfg: Config, ds: dict, key: str = 'dataset'):
    """The class of a dataset config (``key``: where it is, for the message) in the config's
    toolbox. ``None`` if it cannot be found - the toolbox's registry does not import, or does not
    know the type - and a warning says that the dataset's checks are skipped (the Runner stops at
    it with the registry's own error)."""
    kind = ds.get('type')
    if not isinstance(kind, str):
        return kind  # a class (or nothing) given in the config itself
    scope = cfg.default_scope
    try:
        reg = importlib.import_module(scope + '.registry').DATASETS
    except ImportError as e:  # the toolbox not installed, or broken
        _skipped(key, f'{scope}.registry does not import ({type(e).__name__}: {e})')
        return None
    from mmengine.registry import init_default_scope
    init_default_scope(scope)
    cls = reg.get(kind)
    if cls is None:
        _skipped(key, f"type={kind!r} is not in {scope}'s DATASETS registry")
    return cls


def _skipped(key: str, why: str) -> None:
    from mmengine.logging import MMLogger
    MMLogger.get_current_instance().warning(
        f'pre-flight: {key}: {why}; its arguments, classes and annotation files are not checked '
        'before the Runner builds it')


def dataset_views(cfg: Config, which: Sequence[str]) -> List[DatasetView]:
    """One :class:`DatasetView` per dataset config the loaders ``which`` read, in loader order; the
    only place the pre-flight resolves a dataset's class and classes."""
    views = []
    for key, ds in dataset_cfgs(cfg, which):
        cls = dataset_class(cfg, ds, key)
        meta = ds.get('metainfo') or {}
        classes = list(meta['classes']) if meta.get('classes') else \
            list(getattr(cls, 'METAINFO', {}).get('classes', ())) or None
        root = ds.get('data_root') or ''
        prefix = ds.get('data_prefix') or {}
        if isinstance(prefix, str):  # mmpretrain: data_prefix='train'
            prefix = dict(img_path=prefix)
        view = DatasetView(key=key, loader=key.split('.', 1)[0], cfg=ds,
                           scope=cfg.get('default_scope'), cls=cls, classes=classes,
                           data_root=root, ann_file=ds.get('ann_file') or None, ann_path=None,
                           test_mode=bool(ds.get('test_mode')),
                           evaluators=loader_evaluators(cfg, key))
        view.ann_path = view._join(view.ann_file) if view.ann_file else None
        view.folders = {sub: (folder, view._join(folder)) for sub, folder in prefix.items()
                        if folder and isinstance(folder, str)}
        view.filter_cfg = None if view.test_mode else ds.get('filter_cfg')
        view.labels = not view.evaluators or any(_needs_labels(e) for _, e in view.evaluators)
        views.append(view)
    return views


def loader_evaluators(cfg: Config, key: str) -> list:
    """``(config key, evaluator config)`` of the evaluator that scores the loader a dataset key
    (``test_dataloader.dataset...``) belongs to; ``[]`` for a training loader."""
    loader = key.split('.', 1)[0]
    if not loader.endswith('_dataloader'):
        return []
    name = loader[:-len('_dataloader')] + '_evaluator'
    ev = cfg.get(name)
    if isinstance(ev, (list, tuple)):
        return [(f'{name}.{i}', e) for i, e in enumerate(ev) if isinstance(e, dict)]
    return [(name, ev)] if isinstance(ev, dict) else []


def _needs_labels(ev: dict) -> bool:
    kind = str(ev.get('type', ''))
    return not ev.get('format_only', False) and not kind.endswith('DumpResults') and \
        not kind.endswith('DumpDetResults')


def check_format_only(views: Sequence[DatasetView]) -> None:
    """A ``format_only`` evaluator must say where its files go, else they are lost: mmdet's
    CocoMetric would write them to a temporary folder it deletes (an assert), mmseg's IoUMetric
    would fail after the whole run (``osp.dirname(None)``). Names the key to set."""
    seen = set()
    for view in views:
        if view.loader in seen:  # a ConcatDataset's parts share their loader's evaluators
            continue
        seen.add(view.loader)
        for ev_key, ev in view.evaluators:
            if not ev.get('format_only'):
                continue
            kind = str(ev.get('type', ''))
            if kind.endswith('CocoMetric') and not ev.get('outfile_prefix'):
                raise ConfigError(
                    f'{ev_key}: format_only=True writes the results json for a test server but '
                    f'no outfile_prefix is set; set {ev_key}.outfile_prefix=DIR/NAME (or '
                    'tools/test.py --json-prefix DIR/NAME)')
            if kind.endswith('IoUMetric') and not ev.get('output_dir'):
                raise ConfigError(
                    f'{ev_key}: format_only=True writes PNG predictions for a test server but no '
                    f'output_dir is set; set {ev_key}.output_dir=DIR (or tools/test.py --out DIR)')


def dataset_init_keys(cls) -> Optional[set]:
    """The keyword arguments ``cls(...)`` takes: the names of each ``__init__`` along its MRO as
    long as each passes ``**kwargs`` on (mmpretrain's ``CustomDataset`` to mmpretrain's
    ``BaseDataset``, mmdet's datasets to mmengine's); None when every ``__init__`` takes
    ``**kwargs`` (anything goes) or one cannot be read."""
    import inspect
    if not inspect.isclass(cls):  # a function registered as a dataset builder: not checked
        return None
    names = set()
    for klass in cls.__mro__:
        init = vars(klass).get('__init__')
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            return None
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            names.discard('self')
            return names
    return None


def check_dataset_args(views: Sequence[DatasetView]) -> None:
    """Every key of every dataset config is an argument of its dataset class; else one
    :class:`ConfigError` naming each key, the class and what it takes (mmengine's
    ``BaseDataset.__init__() got an unexpected keyword argument`` otherwise, as a traceback that
    names neither the config key nor where the key came from: typically a base config's dataset
    with only its ``type`` changed, such as mmpretrain's ImageNet ``split`` under
    ``CustomDataset``)."""
    import difflib
    problems = []
    for view in views:
        if view.cls is None:
            continue
        takes = dataset_init_keys(view.cls)
        if takes is None:
            continue
        for k in view.cfg:
            if k in ('type', '_scope_') or k in takes:
                continue
            close = difflib.get_close_matches(k, sorted(takes), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ''
            problems.append(f'{view.key}.{k}: {view.cls.__name__} takes no {k!r} ({hint}it takes '
                            f'{", ".join(sorted(takes))})')
    if problems:
        raise ConfigError.listing(
            'dataset arguments the dataset class does not take', problems,
            'A base config written for another dataset type leaves its keys behind when only '
            "'type' changes: replace the whole dataset dict (dataset=dict(_delete_=True, "
            "type=..., ...)) or remove the key.")
