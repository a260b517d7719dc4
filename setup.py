"""mmlinattn: InLine and MALA linear attention for OpenMMLab detection and segmentation."""
import os.path as osp

from setuptools import find_packages, setup


def read_version():
    ns = {}
    with open(osp.join(osp.dirname(__file__), 'mmlinattn', 'version.py')) as f:
        exec(f.read(), ns)
    return ns['__version__']


def read_requirements(name):
    path = osp.join(osp.dirname(__file__), 'requirements', name)
    reqs = []
    with open(path) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line:
                reqs.append(line)
    return reqs


setup(
    name='mmlinattn',
    version=read_version(),
    description='InLine and MALA linear attention backbones for mmdet, mmseg and mmpretrain',
    long_description=open(osp.join(osp.dirname(__file__), 'README.md')).read()
    if osp.exists(osp.join(osp.dirname(__file__), 'README.md')) else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmlinattn', 'mmlinattn.*']),
    include_package_data=True,
    python_requires='>=3.9',
    # RANGES, so that `pip install -e .` into an existing OpenMMLab 3.x environment leaves it as it
    # is (requirements/runtime.txt; the tested ends: requirements/oldest.txt, `make test-compat`,
    # and the pins of requirements/constraints.txt, which tools/install.sh applies for `make test`).
    # mmcv must be the full build with its C++ ops (not mmcv-lite): tools/install.sh builds 2.1.0
    # from source; it is listed so that pip refuses a version mmdet / mmseg reject (>= 2.2.0).
    install_requires=['mmcv>=2.0.0,<2.2.0'] + read_requirements('runtime.txt'),
    extras_require={'tests': read_requirements('tests.txt'),
                    'deploy': read_requirements('deploy.txt')},
    license='Apache-2.0',
    zip_safe=False,
)
