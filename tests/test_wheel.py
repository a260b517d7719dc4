"""``pip install .`` (not editable), as from a package index: the wheel carries the configs, the
tools and the model index under ``mmlinattn/.mim`` as mmdet's and mmseg's wheels do, so OpenMMLab's
tools (``mim search``, mmengine's config lookup) and ours that read ``configs/`` find them from the
installed package, and the documented tools run on it. Built here from a copy of the checkout,
installed into a folder of its own and run by a python of its own (:func:`fresh`) that has neither
the checkout nor the editable install on its path, from the checkout's ``tools/`` and from an empty
folder."""
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
MIM = shutil.which('mim', path=osp.dirname(sys.executable))


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp('wheel')
    src = base / 'src'
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        '.git', '.venv*', 'build', 'dist', '*.egg-info', '__pycache__', '.mim', 'work_dirs',
        'data', 'outputs', 'wheels'))
    wheels = base / 'wheels'
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation',
                    '-w', str(wheels), str(src)], check=True, capture_output=True, timeout=600)
    (wheel,) = list(wheels.glob('mmlinattn-*.whl'))
    site = base / 'site'
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--target',
                    str(site), str(wheel)], check=True, capture_output=True, timeout=600)
    empty = base / 'empty'
    empty.mkdir()
    return site, empty


@pytest.fixture(scope='module')
def fresh(installed):
    """A python of its own, as a user's with the wheel installed: a venv (no pip) whose path holds
    the wheel's folder, then this environment's site-packages as plain folders. Their ``.pth``
    files do not run, so neither the editable install nor the checkout (``make install`` puts it
    on this environment's path) can stand in for what the wheel lacks; no ``PYTHONPATH``."""
    site, _ = installed
    venv = site.parent / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True,
                   capture_output=True, timeout=300)
    python = venv / 'bin' / 'python'
    own = subprocess.run([str(python), '-c', 'import sysconfig; print(sysconfig.get_paths()'
                          '["purelib"])'], check=True, capture_output=True, text=True).stdout
    ours = dict.fromkeys([str(site), sysconfig.get_paths()['purelib'],
                          sysconfig.get_paths()['platlib']])
    with open(osp.join(own.strip(), 'wheel_under_test.pth'), 'w') as f:
        f.write('\n'.join(ours) + '\n')
    r = run_fresh(python, '-c', 'import importlib.util as u, mmlinattn; '
                  'print(mmlinattn.__file__, u.find_spec("tools"))', cwd=site.parent / 'empty')
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [str(site / 'mmlinattn' / '__init__.py'), 'None'], r.stdout
    return python


def run_fresh(python, *args, cwd):
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    return subprocess.run([str(python), *map(str, args)], cwd=str(cwd), capture_output=True,
                          text=True, timeout=600, env=dict(env, PYTHONNOUSERSITE='1'))


def run_installed(fresh, code):
    r = run_fresh(fresh, '-c', textwrap.dedent(code), cwd=fresh.parents[2] / 'empty')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def checkout_configs():
    return sorted(osp.relpath(osp.join(d, f), ROOT)
                  for d, _, fs in os.walk(osp.join(ROOT, 'configs'))
                  for f in fs if f.endswith(('.py', '.yml', '.md')))


def model_index_names():
    """The model names of the checkout's metafiles (read as plain YAML)."""
    import yaml
    with open(osp.join(ROOT, 'model-index.yml')) as f:
        index = yaml.safe_load(f)
    names = set()
    for meta in index['Import']:
        with open(osp.join(ROOT, meta)) as f:
            names |= {m['Name'] for m in yaml.safe_load(f)['Models']}
    return names


def test_the_wheel_carries_configs_tools_and_the_model_index(installed):
    site, _ = installed
    mim = site / 'mmlinattn' / '.mim'
    assert (mim / 'model-index.yml').read_text() == open(osp.join(ROOT, 'model-index.yml')).read()
    carried = sorted(osp.relpath(osp.join(d, f), mim) for d, _, fs in os.walk(mim / 'configs')
                     for f in fs if f.endswith(('.py', '.yml', '.md')))
    assert carried == checkout_configs()
    assert (mim / 'tools' / 'train.py').is_file() and (mim / 'tools' / 'test.py').is_file()
    assert (mim / 'tools' / 'dist_train.sh').is_file()
    # the documented tools a user runs, and no installer (setup.py's DEV_ONLY)
    for tool in ('deployment/export_onnx.py', 'analysis_tools/get_flops.py', 'image_demo.py',
                 'misc/download_checkpoints.py', 'analysis_tools/benchmark_step.py'):
        assert (mim / 'tools' / tool).is_file(), tool
    assert not (mim / 'tools' / 'install.sh').exists()


def test_our_tools_and_mmengine_find_the_configs_in_the_installed_package(installed, fresh):
    site, _ = installed
    out = run_installed(fresh, '''
        import json, os, os.path as osp
        import mmlinattn
        from mmengine.config import Config
        from mmengine.config.utils import _get_cfg_metainfo
        from mmengine.utils import get_installed_path
        from mmlinattn.apis.inference import build_inferencer
        from mmlinattn.paths import config_path, resource_root
        pkg = get_installed_path('mmlinattn')
        meta = _get_cfg_metainfo(pkg, 'mavit/mask-rcnn_mavit-t_fpn_1x_coco.py')
        cfg = Config.fromfile(config_path('mavit/mask-rcnn_mavit-t_fpn_1x_coco.py'))
        zoo = [f for d in ('inline_pvt', 'inline_swin', 'mavit')
               for f in os.listdir(osp.join(resource_root(), 'configs', d)) if f.endswith('.py')]
        print(json.dumps(dict(module=mmlinattn.__file__, root=resource_root(), pkg=pkg,
                              zoo=len(zoo), apis=build_inferencer.__module__,
                              meta=meta['Config'], backbone=cfg.model.backbone.type,
                              runner=cfg.runner_type, imports=cfg.custom_imports['imports'])))
    ''')
    assert out['module'].startswith(str(site))
    assert out['root'] == str(site / 'mmlinattn' / '.mim')
    assert out['pkg'] == str(site / 'mmlinattn')
    assert out['apis'] == 'mmlinattn.apis.inference' and out['runner'] == 'LinAttnRunner'
    zoo = [c for c in checkout_configs() if c.endswith('.py') and c.split('/')[1] in
           ('inline_pvt', 'inline_swin', 'mavit')]
    assert out['zoo'] == len(zoo) > 40
    assert out['meta'] == 'configs/mavit/mask-rcnn_mavit-t_fpn_1x_coco.py'
    assert out['backbone'] == 'MAViT' and 'mmlinattn' in out['imports']


def test_the_shipped_train_and_test_tools_start_from_the_installed_package(installed, fresh):
    """``mim train`` / ``mim test`` run the wheel's ``.mim/tools/train.py`` and ``test.py``: they
    start from an empty folder, and what a run needs (the Runner, its pre-flight) is the
    package's."""
    site, empty = installed
    mim = site / 'mmlinattn' / '.mim'
    for tool in ('train.py', 'test.py'):
        r = run_fresh(fresh, mim / 'tools' / tool, '--help', cwd=empty)
        assert r.returncode == 0 and '--cfg-options' in r.stdout, r.stdout[-2000:] + r.stderr
    out = run_installed(fresh, '''
        import json, sys
        from mmlinattn.training.preflight import preflight
        from mmlinattn.training.runner import LinAttnRunner
        print(json.dumps(dict(preflight=sys.modules[preflight.__module__].__file__,
                              runner=sys.modules[LinAttnRunner.__module__].__file__)))
    ''')
    assert out['preflight'].startswith(str(site / 'mmlinattn' / 'training' / 'preflight'))
    assert out['runner'] == str(site / 'mmlinattn' / 'training' / 'runner.py')


def test_the_documented_tools_run_on_the_installed_wheel(installed, fresh, tmp_path):
    """Each tool of the user guide's table, as its doc writes the command (``python tools/...`` in
    the checkout), on small inputs with the wheel's package: what the tools share is the package's
    (``mmlinattn.analysis``), so none needs the checkout on the path (at 0.3.0 export_onnx.py,
    get_flops.py and the benchmarks stopped on ``No module named 'tools'``). The wheel's own
    copies (``.mim/tools``) run from an empty folder."""
    site, empty = installed
    src, out = site.parent / 'src', tmp_path
    seg = 'configs/toy/fpn_mavit-t_toy-ade.py'

    def ok(*args, cwd=src):
        r = run_fresh(fresh, *args, cwd=cwd)
        assert r.returncode == 0, f'{args}\n{r.stdout[-2000:]}{r.stderr[-3000:]}'
        return r.stdout

    said = ok('tools/deployment/export_onnx.py', seg, '--shape', 64, 64, '--part', 'backbone',
              '--exporter', 'jit', '--out', out / 'backbone.onnx')
    assert 'ONNX Runtime matches eager PyTorch' in said and (out / 'backbone.onnx').is_file(), said
    flops = 'MAViT-tiny @ (64, 64): params'  # the line get_flops.py prints for a backbone
    assert flops in ok('tools/analysis_tools/get_flops.py', '--backbone', 'MAViT', 'tiny',
                       '--shape', 64, 64)
    # a trained segmentor stands in: the toy config's model, its weights saved by this process
    import torch
    from mmengine.config import Config
    from PIL import Image

    from mmlinattn.training.config import model_registry
    cfg = Config.fromfile(osp.join(ROOT, seg))
    torch.manual_seed(0)
    torch.save({'state_dict': model_registry(cfg).build(cfg.model).state_dict()}, out / 'seg.pth')
    Image.new('RGB', (64, 48), (120, 60, 30)).save(out / 'img.png')
    ok('tools/image_demo.py', out / 'img.png', seg, out / 'seg.pth', '--out-dir', out / 'demo')
    with open(out / 'demo' / 'preds' / 'img.json') as f:
        assert json.load(f)['height'] == 48
    assert 'MAViT_T' in ok('tools/misc/download_checkpoints.py', '--list')
    ok('tools/analysis_tools/analyze_attention.py', '--backbone', 'InLinePVT', 'tiny', '--size',
       64, '--out', out / 'attention')
    for bench in ('benchmark_step.py', 'benchmark_attention.py'):  # benchmark.py: the same imports
        assert 'usage:' in ok(f'tools/analysis_tools/{bench}', '--help'), bench
    mim_tools = site / 'mmlinattn' / '.mim' / 'tools'
    assert flops in ok(mim_tools / 'analysis_tools' / 'get_flops.py', '--backbone', 'MAViT',
                       'tiny', '--shape', 64, 64, cwd=empty)


@pytest.mark.skipif(MIM is None, reason='openmim (requirements/tests.txt) is not installed')
def test_mim_search_lists_the_zoo_of_the_installed_package(installed):
    site, empty = installed
    r = subprocess.run([MIM, 'search', 'mmlinattn'], cwd=str(empty), capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(site)))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    listed = {line.split(':', 1)[1].strip() for line in r.stdout.splitlines()
              if line.startswith('config id:')}
    assert listed == model_index_names() and len(listed) > 40


@pytest.mark.skipif(MIM is None, reason='openmim (requirements/tests.txt) is not installed')
@pytest.mark.slow  # two mim processes to the Runner's start: 20-40 s on 2 cores
def test_mim_train_and_test_build_our_runner_from_the_installed_package(installed, tmp_path):
    """``mim train mmlinattn CONFIG`` and ``mim test mmlinattn CONFIG --checkpoint ...`` (the
    user guide's commands) from an empty folder: mim finds the config by name in the wheel's
    ``.mim/configs`` and runs its ``.mim/tools``, which build the wheel's LinAttnRunner from that
    config and the flags given. The test-only probe (tests/probe_runner.py, on the path beside the
    wheel's folder) records what the Runner got and exits before any data is read; what a run
    then does is the Runner's, tested once in-process (tests/test_one_run.py and others)."""
    site, empty = installed
    probe = tmp_path / 'probe'
    probe.mkdir()
    shutil.copy(osp.join(ROOT, 'tests', 'probe_runner.py'), probe)
    got = tmp_path / 'got.json'
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(probe)]),
               PROBE_RUNNER_OUT=str(got))
    work, checkpoint = tmp_path / 'work', str(tmp_path / 'given.pth')
    opts = ['--cfg-options', 'runner_type=probe_runner.ProbeRunner',
            'default_hooks.logger.interval=7']
    for run, args in (('train', ['--resume']), ('test', ['--checkpoint', checkpoint])):
        r = subprocess.run([MIM, run, 'mmlinattn', 'fpn_mavit-t_toy-ade.py', *args, '--work-dir',
                            str(work), *opts], cwd=str(empty), env=env, capture_output=True,
                           text=True, timeout=600, stdin=subprocess.DEVNULL)
        assert r.returncode == 0 and got.is_file(), r.stdout[-3000:] + r.stderr[-3000:]
        out = json.loads(got.read_text())
        got.unlink()
        assert out['run'] == run and out['runner'][:2] == ['ProbeRunner', 'LinAttnRunner'], out
        assert out['package'] == str(site / 'mmlinattn' / '__init__.py')
        assert out['work_dir'] == str(work)
        assert out['cfg']['default_hooks']['logger']['interval'] == 7
        assert (out['resume'], out['load_from']) == ((True, None) if run == 'train' else
                                                      (False, checkpoint)), out
