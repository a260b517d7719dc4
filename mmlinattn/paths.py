"""Where the configs and the model index are: beside the package in a source checkout, or in the
package's ``.mim`` folder (a wheel install, where OpenMMLab's tools look)."""
import os.path as osp

_HERE = osp.dirname(osp.abspath(__file__))


def resource_root() -> str:
    """The folder holding ``configs/``, ``tools/`` and ``model-index.yml``."""
    checkout = osp.dirname(_HERE)
    if osp.isfile(osp.join(checkout, 'model-index.yml')) and osp.isdir(osp.join(checkout,
                                                                                 'configs')):
        return checkout
    return osp.join(_HERE, '.mim')


def config_path(relative: str) -> str:
    """``relative`` (``'configs/mavit/x.py'`` or ``'mavit/x.py'``) as a path to the file."""
    if not relative.startswith('configs/'):
        relative = osp.join('configs', relative)
    return osp.join(resource_root(), relative)
