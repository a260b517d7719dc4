"""Install only what you use: ``pip install mmlinattn`` brings mmengine, mmcv and torch (and what
our own code imports), the toolboxes come with the extras ``[det]`` (mmdet), ``[seg]``
(mmsegmentation), ``[cls]`` (mmpretrain) and ``[all]``. Where mmseg and mmpretrain are not
installed, ``import mmlinattn`` says nothing and registers the backbones, a detection config builds
and trains, and a segmentation or classification config stops in one line naming the extra.

"Not installed" is simulated, not approximated: the child interpreter starts without its
site-packages (``python -S``) and gets instead a folder of links to every entry there except
mmseg's and mmpretrain's modules and distribution metadata, so neither the import system nor
mmengine's package lookup (``pkg_resources``, for ``_base_ = 'mmseg::...'``) finds them."""
import json
import os
import os.path as osp
import re
import runpy
import subprocess
import sys
import sysconfig
import textwrap

import pytest
from packaging.requirements import Requirement

from helpers import toy_coco_options

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: what `pip install mmlinattn` installs besides the package: mmcv, mmengine and torch, and what our
#: code imports itself or the OpenMMLab base configs need (requirements/runtime.txt's comments)
CORE = {'mmcv', 'mmengine', 'torch', 'numpy', 'opencv-python', 'setuptools', 'pillow',
        'matplotlib'}
#: each extra's toolbox with today's supported range (docs/install.md's table)
TOOLBOX_RANGES = {'det': ('mmdet', '>=3.2.0,<3.4'),
                  'seg': ('mmsegmentation', '>=1.2.1,<1.3'),
                  'cls': ('mmpretrain', '>=1.1.1,<1.3')}
#: what the simulated environment lacks: module names and distribution names
HIDDEN = ('mmseg', 'mmsegmentation', 'mmpretrain')
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
CLS_CFG = osp.join(ROOT, 'configs/toy/mavit-t_toy-cls.py')
DET_CFG = osp.join(ROOT, 'configs/toy/retinanet_mavit-t_fpn_toy-coco.py')


# ----------------------------------------------------------------------------------- metadata
def _setup_kwargs(monkeypatch) -> dict:
    """What setup.py hands to setuptools.setup (setup.py run, setup() captured)."""
    import setuptools
    captured = {}
    monkeypatch.setattr(setuptools, 'setup', lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(ROOT)
    runpy.run_path(osp.join(ROOT, 'setup.py'), run_name='__main__')
    return captured


def _names(reqs) -> dict:
    return {Requirement(r).name.lower(): Requirement(r) for r in reqs}


def test_install_requires_hold_no_toolbox_and_each_extra_brings_one(monkeypatch):
    kwargs = _setup_kwargs(monkeypatch)
    core = _names(kwargs['install_requires'])
    assert set(core) == CORE, sorted(set(core) ^ CORE)
    extras = {name: _names(reqs) for name, reqs in kwargs['extras_require'].items()}
    for extra, (package, spec) in TOOLBOX_RANGES.items():
        assert str(extras[extra][package].specifier) == str(Requirement(f'x{spec}').specifier), \
            (extra, extras[extra][package])
        others = {p for e, (p, _) in TOOLBOX_RANGES.items() if e != extra}
        assert not others & set(extras[extra]), (extra, sorted(extras[extra]))
    # [all]: every toolbox extra's requirements, nothing else
    union = {n for e in TOOLBOX_RANGES for n in extras[e]}
    assert set(extras['all']) == union
    assert {p for p, _ in TOOLBOX_RANGES.values()} <= union
    # the lower ends are the oldest stack make test-compat runs
    oldest = _names(line.split('#', 1)[0].strip() for line in
                    open(osp.join(ROOT, 'requirements', 'oldest.txt'))
                    if line.split('#', 1)[0].strip())
    for package, _ in TOOLBOX_RANGES.values():
        (pin,) = [s.version for s in oldest[package].specifier]
        assert extras['all'][package].specifier.contains(pin), (package, pin)


# ------------------------------------------------------------------ without mmseg and mmpretrain
@pytest.fixture(scope='module')
def without_seg_and_cls(tmp_path_factory):
    """``(argv prefix, env)`` of a python whose environment lacks mmseg and mmpretrain (module
    docstring); the checkout is on its path, as ``pip install -e`` puts it."""
    view = tmp_path_factory.mktemp('site_without_seg_and_cls')
    paths = sysconfig.get_paths()
    for site in dict.fromkeys((paths['purelib'], paths['platlib'])):
        for entry in os.listdir(site):
            top = re.split(r'[-.]', entry, maxsplit=1)[0].lower()
            if top in HIDDEN or entry.endswith('.pth') or osp.lexists(view / entry):
                continue
            (view / entry).symlink_to(osp.join(site, entry))
    env = {k: v for k, v in os.environ.items() if not k.startswith('PYTHON')}
    env['PYTHONPATH'] = os.pathsep.join([ROOT, str(view)])
    env['PYTHONUNBUFFERED'] = '1'
    return [sys.executable, '-S'], env


def _run(prefix_env, args, cwd, timeout=600):
    prefix, env = prefix_env
    return subprocess.run(prefix + args, cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow  # a fresh interpreter importing torch, mmengine and mmdet: 15-30 s on 2 cores
def test_without_seg_and_cls_import_is_silent_and_a_detector_builds(without_seg_and_cls,
                                                                     tmp_path):
    """One child: ``import mmlinattn`` writes nothing (file descriptors 1 and 2 captured), our
    backbones are registered, a toy detection config loads through our tools' loader and its
    model builds with our backbone, and the seg / cls configs (through their ``mmseg::`` /
    ``mmpretrain::`` bases; mmengine alone says ``mmsegmentation is not installed, please install
    mmsegmentation manually`` in a traceback) and a config setting ``default_scope='mmseg'`` each
    get the one line naming their extra, also from tools/train.py (exit 2, no work dir)."""
    code = textwrap.dedent(r'''
        import importlib.util, json, os, sys, tempfile
        hidden = {m: importlib.util.find_spec(m) is None for m in ('mmseg', 'mmpretrain')}
        sink = tempfile.TemporaryFile()
        saved = os.dup(1), os.dup(2)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            import mmlinattn
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        sink.seek(0)
        printed = sink.read().decode(errors='replace')
        from mmengine.registry import MODELS
        registered = {n: MODELS.get(n) is not None for n in ('InLinePVT', 'InLineSwin', 'MAViT')}
        from mmlinattn.core.registry import model_registry
        from mmlinattn.training.cli import load_config
        from mmlinattn.training.config import ConfigError
        cfg = load_config(sys.argv[1])
        model = model_registry(cfg).build(cfg.model)
        said = {}
        for name, path in (('seg', sys.argv[2]), ('cls', sys.argv[3]), ('scope', sys.argv[4])):
            try:
                load_config(path)
                said[name] = None
            except ConfigError as e:
                said[name] = str(e)
        loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mmseg', 'mmpretrain'))
        import contextlib, io, runpy
        tool, err = runpy.run_path(sys.argv[5], run_name='train_tool'), io.StringIO()
        with contextlib.redirect_stderr(err):
            code = tool['main']([sys.argv[2], '--work-dir', sys.argv[6]])
        print(json.dumps(dict(hidden=hidden, printed=printed, registered=registered,
                              detector=type(model).__name__,
                              backbone=type(model.backbone).__name__, said=said, loaded=loaded,
                              tool=[code, err.getvalue()])))
    ''')
    scope_cfg = tmp_path / 'own_seg.py'
    scope_cfg.write_text("default_scope = 'mmseg'\nmodel = dict(type='EncoderDecoder')\n")
    work = tmp_path / 'work'
    r = _run(without_seg_and_cls, ['-c', code, DET_CFG, SEG_CFG, CLS_CFG, str(scope_cfg),
                                   osp.join(ROOT, 'tools', 'train.py'), str(work)], ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out['hidden'] == {'mmseg': True, 'mmpretrain': True}, 'the simulation did not hide them'
    assert out['printed'] == ''
    assert out['registered'] == {'InLinePVT': True, 'InLineSwin': True, 'MAViT': True}
    assert (out['detector'], out['backbone']) == ('RetinaNet', 'MAViT')
    assert out['loaded'] == []
    for name, package, extra in (('seg', 'mmsegmentation', 'seg'), ('cls', 'mmpretrain', 'cls')):
        said = out['said'][name]
        assert said is not None and '\n' not in said, said
        assert said.endswith(f'needs {package}, which is not installed: '
                             f'pip install "mmlinattn[{extra}]"'), said
        assert '::' in said and said.startswith(ROOT), said  # the config file and its entry
    assert out['said']['scope'] == (f"{scope_cfg}: default_scope='mmseg' needs mmsegmentation, "
                                    'which is not installed: pip install "mmlinattn[seg]"')
    code, err = out['tool']
    assert code == 2 and 'Traceback' not in err, err
    (line,) = [line for line in err.splitlines() if ': error: ' in line]
    assert line == f'tools/train.py: error: {out["said"]["seg"]}', (line, err)
    assert not work.exists()
    assert 'Traceback' not in r.stderr and 'mmseg' not in r.stderr, r.stderr[-3000:]


@pytest.mark.slow  # a fresh interpreter, one toy epoch and its validation: 20-40 s on 2 cores
def test_without_seg_and_cls_a_detector_trains(without_seg_and_cls, toy_data, tmp_path):
    """tools/train.py trains a toy detector (RetinaNet, MAViT-T) for an epoch and saves it, with
    no import failure logged."""
    work = tmp_path / 'work'
    r = _run(without_seg_and_cls,
             [osp.join(ROOT, 'tools', 'train.py'), DET_CFG, '--work-dir', str(work),
              '--cfg-options', *toy_coco_options(toy_data / 'toy_coco', 'train_cfg.max_epochs=1',
                                                 'default_hooks.logger.interval=1')],
             tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (work / 'epoch_1.pth').is_file(), sorted(os.listdir(work))
    log = r.stdout + r.stderr
    assert re.search(r'Epoch\(train\) \[1\]\[(\d+)/\1\] .*loss: \d', log), log[-3000:]
    assert 'No module named' not in log and 'Failed to import' not in log, log[-3000:]
