"""mmlinattn: InLine and MALA linear attention for OpenMMLab detection and segmentation."""
import os
import os.path as osp
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = osp.dirname(osp.abspath(__file__))
#: what the wheel carries under mmlinattn/.mim, the folder OpenMMLab's tools read for a package
#: (mim search / train / test, mmengine's config lookup), as mmdet and mmseg ship theirs
MIM_FILES = ('configs', 'tools', 'model-index.yml')
#: what of tools/ stays in the repository (the installers of the checkout's environment): a
#: wheel's .mim/tools holds the tools a user runs (train, test, launchers, demos, converters,
#: downloads, analysis_tools/, deployment/); what they share is the package's (mmlinattn.analysis)
DEV_ONLY = ('install*.sh',)


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


class BuildWithMimFiles(build_py):
    """build_py that also places :data:`MIM_FILES` in ``mmlinattn/.mim``: copies in a wheel, links
    to the checkout in an editable install (as mmdet's setup.py does)."""

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            self._link(osp.join(HERE, 'mmlinattn', '.mim'))
        else:
            self._copy(osp.join(self.build_lib, 'mmlinattn', '.mim'))

    @staticmethod
    def _copy(mim):
        os.makedirs(mim, exist_ok=True)
        for name in MIM_FILES:
            src, dst = osp.join(HERE, name), osp.join(mim, name)
            if osp.isdir(dst) and not osp.islink(dst):
                shutil.rmtree(dst)
            elif osp.lexists(dst):
                os.remove(dst)
            if osp.isdir(src):
                skip = ('__pycache__', '*.pyc') + (DEV_ONLY if name == 'tools' else ())
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*skip))
            else:
                shutil.copyfile(src, dst)

    @staticmethod
    def _link(mim):
        os.makedirs(mim, exist_ok=True)
        for name in MIM_FILES:
            dst = osp.join(mim, name)
            if not osp.lexists(dst):
                os.symlink(osp.join('..', '..', name), dst)


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
    # The toolboxes are extras: [det] mmdet, [seg] mmsegmentation, [cls] mmpretrain, [all] the three
    # (requirements/det.txt, seg.txt, cls.txt); `import mmlinattn` needs none of them.
    install_requires=['mmcv>=2.0.0,<2.2.0'] + read_requirements('runtime.txt'),
    extras_require={'det': read_requirements('det.txt'), 'seg': read_requirements('seg.txt'),
                    'cls': read_requirements('cls.txt'),
                    'all': read_requirements('det.txt') + read_requirements('seg.txt')
                    + read_requirements('cls.txt'),
                    'tests': read_requirements('tests.txt'),
                    'deploy': read_requirements('deploy.txt')},
    license='Apache-2.0',
    cmdclass={'build_py': BuildWithMimFiles},
    zip_safe=False,
)
