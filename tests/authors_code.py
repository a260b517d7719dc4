"""The authors' own model code, built from a local clone of their repositories, beside ours
(``tests/data/authors_keys/make_manifests.py``, tests/test_authors_code.py). Nothing of theirs
ships or is copied: their model files are imported from the path given (a clone of
LeapLabTHU/InLine or qhfan/MALA; ``pip install timm einops fvcore``). :func:`build_authors` builds
their ImageNet classifier, :func:`build_ours` ours (``configs/classification/``), and
:func:`load_authors_weights` loads theirs into ours through the family's key layout, as a
downloaded file would be. (Moved from tools/workshop/authors_code.py when the tool comparing the
two, benchmark_authors.py, left the repository: docs/benchmarks.md section 12.)
"""
import importlib.util
import os.path as osp
import sys
from typing import Dict, Tuple

from torch import nn

from mmlinattn.core.families import FAMILIES

#: family -> (repository, model file in it, {arch: (constructor, keyword arguments)}): the
#: constructors and arguments the authors' READMEs and configs list for the released classifiers
SOURCES: Dict[str, Tuple[str, str, Dict[str, Tuple[str, dict]]]] = {
    'inline_swin': ('LeapLabTHU/InLine', 'models/inline_swin.py', {
        'tiny': ('InLineSwin', dict(img_size=224, window_size=56, embed_dim=96, depths=[2, 2, 6, 2],
                                    num_heads=[3, 6, 12, 24], attn_type='IIIS')),
        'small': ('InLineSwin', dict(img_size=224, window_size=56, embed_dim=96,
                                     depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24],
                                     attn_type='IISS')),
        'base': ('InLineSwin', dict(img_size=224, window_size=56, embed_dim=128,
                                    depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
                                    attn_type='IIMS2')),
    }),
    'inline_pvt': ('LeapLabTHU/InLine', 'models/inline_pvt.py', {
        arch: (f'inline_pvt_{arch}', dict(la_sr_ratios='1111'))
        for arch in ('tiny', 'small', 'medium', 'large')}),
    'mavit': ('qhfan/MALA', 'classfication_release/model.py', {
        arch: (f'MALA_{arch[0].upper()}', {}) for arch in ('tiny', 'small', 'base', 'large')}),
}
#: the authors' model files need these (imported by the files themselves)
REQUIREMENTS = ('timm', 'einops', 'fvcore')


class AuthorsCodeError(RuntimeError):
    """The authors' code could not be found or imported from the path given."""


def load_file(path: str, name: str):
    """Import the Python file ``path`` as module ``name`` (their files are not a package)."""
    if not osp.isfile(path):
        raise AuthorsCodeError(f'{path}: no such file; the repository option must point at a '
                               'clone of the authors\' repository (its root folder)')
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as err:
        if sys.modules.get(name) is module:  # no half-run module left behind under its name
            del sys.modules[name]
        if isinstance(err, ImportError):
            raise AuthorsCodeError(
                f'{path}: importing the authors\' model file failed ({err}); their files import '
                f'{", ".join(REQUIREMENTS)}: pip install {" ".join(REQUIREMENTS)}') from err
        raise
    return module


def build_authors(family: str, arch: str, repo: str, drop_path: float = 0.0) -> nn.Module:
    """The authors' classifier ``family``/``arch`` from their file in the clone ``repo``, with
    every stochastic-depth rate set to ``drop_path`` (MALA's constructors take no rate, so the
    modules' rates are set after building)."""
    if family not in SOURCES:
        raise KeyError(f'no authors\' code known for {family!r}; choose one of {sorted(SOURCES)}')
    _, rel, archs = SOURCES[family]
    if arch not in archs:
        raise KeyError(f'{family}: no released arch {arch!r}; choose one of {sorted(archs)}')
    path = osp.join(repo, rel)
    module = load_file(path, f'authors_{family}')
    ctor, kwargs = archs[arch]
    if not callable(getattr(module, ctor, None)):
        raise AuthorsCodeError(f'{path} has no {ctor}(): not the authors\' file this tool '
                               'knows (a different commit of their repository?)')
    model = getattr(module, ctor)(**kwargs)
    for m in model.modules():
        if hasattr(m, 'drop_prob'):  # timm's DropPath
            m.drop_prob = drop_path
        elif 'DropPath' in type(m).__name__:
            raise AuthorsCodeError(f'{path}: a {type(m).__name__} without drop_prob; cannot set '
                                   'its stochastic depth rate')
    return model


def our_classifier_cfg(family: str, arch: str, drop_path: float = 0.0) -> dict:
    """Our mmpretrain ImageClassifier of ``family``/``arch``: the tiny config of
    ``configs/classification/`` with the arch (and its channels) swapped in."""
    from mmengine.config import Config

    from mmlinattn.core.families import out_channels
    from mmlinattn.paths import resource_root
    fam = FAMILIES[family]
    path = osp.join(resource_root(), 'configs', 'classification', f'{fam.prefix}-t_in1k.py')
    model = Config.fromfile(path).model
    model.backbone.update(arch=arch, drop_path_rate=drop_path)
    channels = out_channels(dict(type=model.backbone.type, arch=arch))[-1]
    if model.neck.type == 'MAViTClsNeck':  # the releases' projection: 2560 for L, 2048 else
        projection = 2560 if arch == 'large' else 2048
        model.neck.update(in_channels=channels, projection=projection)
        model.head.in_channels = projection
    else:
        model.head.in_channels = channels
    return model.to_dict()


def build_ours(family: str, arch: str, drop_path: float = 0.0) -> nn.Module:
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    from mmpretrain.utils import register_all_modules

    import mmlinattn  # noqa: F401  (registers our modules)
    register_all_modules(init_default_scope=False)
    # mmpretrain's scope whatever scope the caller runs in (a detector's leaves 'mmdet' current)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(our_classifier_cfg(family, arch, drop_path))


def load_authors_weights(ours: nn.Module, theirs: nn.Module, family: str) -> None:
    """Load the authors' model's weights into ours through the family's layout (the path their
    released files take); raises if any tensor is left over or missing."""
    from mmlinattn.core.models.classification import authors_to_classifier
    state = authors_to_classifier(dict(theirs.state_dict()), family)
    missing, unexpected = ours.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise AuthorsCodeError(f'{family}: the authors\' weights do not fit our classifier: '
                               f'missing {missing[:8]}, unexpected {unexpected[:8]}')

