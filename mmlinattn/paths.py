"""Where the configs and the model index are: beside the package in a source checkout (an editable
install), or in the package's ``.mim`` folder when it was installed from a wheel (``pip install
.``), where OpenMMLab's tools look for a package's configs (as for mmdet's and mmseg's)."""
import os.path as osp

_HERE = osp.dirname(osp.abspath(__file__))


def resource_root() -> str:
    """The folder holding ``configs/``, ``tools/`` and ``model-index.yml``: the checkout when the
    package is imported from one, else the installed package's ``.mim`` folder."""
    checkout = osp.dirname(_HERE)
    if osp.isfile(osp.join(checkout, 'model-index.yml')) and osp.isdir(osp.join(checkout,
                                                                                 'configs')):
        return checkout
    return osp.join(_HERE, '.mim')


def config_path(relative: str) -> str:
    """``relative`` (e.g. ``'configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py'`` or
    ``'mavit/mask-rcnn_mavit-t_fpn_1x_coco.py'``) as a path to the file."""
    if not relative.startswith('configs/'):
        relative = osp.join('configs', relative)
    return osp.join(resource_root(), relative)
