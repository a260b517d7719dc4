"""tools/analysis_tools/gpu_check.py on a bare node: a fresh virtual environment holding only
torch (and what torch itself requires), no mmengine, mmcv, mmdet, mmseg or mmpretrain, runs the
whole check on the CPU at small sizes from the wheels folder, leaves the environment and the temp
dir as they were, and writes a report that says what it checked."""
import importlib.metadata as md
import json
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch

from mmlinattn.core.ops import CORES
from tools.analysis_tools import gpu_check

# torch.compile of the backbones fails in torch < 2.3's dynamo (seen on 2.1.2, even with the
# aot_eager backend: an AssertionError, 'SymNodeVariable() is not a constant',
# BackendCompilerFailed); torch.compiler.is_compiling, which our probes use, arrived with 2.3's
# dynamo (2.2 is untested; 2.14 compiles). There the check must report part e as failed, and
# nothing else.
OLD_DYNAMO = not hasattr(getattr(torch, 'compiler', None), 'is_compiling')


def _cpu_autocast_takes(dtype):
    try:
        with torch.autocast('cpu', dtype=dtype):
            return True
    except RuntimeError:  # torch 2.1's CPU autocast takes bfloat16 only
        return False


def _torch_closure():
    """torch's distribution and those it requires here (markers evaluated), recursively."""
    from packaging.markers import Marker
    todo, found = ['torch'], {}
    while todo:
        name = re.sub(r'[-_.]+', '-', todo.pop()).lower()
        if name in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        found[name] = dist
        for req in dist.requires or []:
            spec, _, marker = req.partition(';')
            if marker and not Marker(marker).evaluate():
                continue
            todo.append(re.match(r'[A-Za-z0-9_.\-]+', spec.strip()).group(0))
    return found


def bare_env(path):
    """A venv (no pip) whose site-packages links to this torch and its requirements only."""
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(path)], check=True)
    py = osp.join(str(path), 'bin', 'python')
    site = subprocess.run([py, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                          check=True, capture_output=True, text=True).stdout.strip()
    for dist in _torch_closure().values():
        for top in {str(f).split('/')[0] for f in dist.files or [] if not str(f).startswith('..')}:
            src = osp.join(str(dist.locate_file('')), top)
            if osp.exists(src) and not osp.lexists(osp.join(site, top)):
                os.symlink(src, osp.join(site, top))
    return py, site


def test_wheel_tags_pick_what_this_python_runs():
    """The tags of PEP 425 / 600 read from wheel names: py3-none-any everywhere, cpXY-abi3 from 3.Y
    on, cpXY-cpXY on 3.Y only, linux wheels on their machine and on a glibc at least as new as
    their manylinux tag names (manylinux2014 = glibc 2.17), none on musl."""
    def fits(name, version, machine, glibc=(2, 31)):
        return gpu_check.wheel_fits(name, version, machine, glibc)
    assert fits('mmengine-0.10.7-py3-none-any.whl', (3, 10), 'x86_64', None)
    assert fits('mmcv_lite-2.1.0-py2.py3-none-any.whl', (3, 12), 'aarch64')
    cv = 'opencv_python_headless-4.14.0.94-cp37-abi3-manylinux_2_28_x86_64.whl'
    assert fits(cv, (3, 11), 'x86_64', (2, 28)) and not fits(cv, (3, 11), 'aarch64', (2, 28))
    assert not fits(cv, (3, 11), 'x86_64', (2, 27)) and not fits(cv, (3, 11), 'x86_64', None)
    numpy = 'numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl'
    assert fits(numpy, (3, 11), 'x86_64', (2, 27)) and not fits(numpy, (3, 12), 'x86_64')
    yaml = 'pyyaml-6.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl'
    assert fits(yaml, (3, 11), 'x86_64', (2, 17)) and not fits(yaml, (3, 11), 'x86_64', (2, 12))
    assert not fits('x-1.0-cp313-abi3-manylinux_2_28_x86_64.whl', (3, 11), 'x86_64')
    assert not fits('x-1.0-cp311-cp311-musllinux_1_2_x86_64.whl', (3, 11), 'x86_64')
    assert not fits('not a wheel.whl', (3, 11), 'x86_64')


AUTHORS_STAND_IN = '''
import torch


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 4, 4)
        self.head = torch.nn.Linear(16, 10)

    def forward_features(self, x):
        return self.stem(x)

    def forward(self, x):
        return self.head(self.forward_features(x).mean((2, 3)))


def MALA_T():
    return Classifier()
'''


@pytest.fixture(scope='module')
def bare_run(tmp_path_factory):
    wheels = gpu_check.WHEELS
    if not osp.isdir(wheels) or not any(f.startswith('mmengine-') for f in os.listdir(wheels)):
        pytest.fail(f'{wheels} holds no wheels: `make install` fetches them '
                    '(python tools/analysis_tools/gpu_check.py fetch)')
    root = tmp_path_factory.mktemp('bare')
    py, site = bare_env(root / 'env')
    before = sorted(os.listdir(site))
    tmp, work = root / 'tmp', root / 'elsewhere'
    tmp.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'VIRTUAL_ENV'))}
    env.update(TMPDIR=str(tmp), PYTHONNOUSERSITE='1')
    out = work / 'report'
    # a stand-in for the authors' MALA file (the suite never has their code): their constructor's
    # name, a classifier with forward_features
    mala = root / 'MALA' / 'classfication_release'
    mala.mkdir(parents=True)
    (mala / 'model.py').write_text(AUTHORS_STAND_IN)
    proc = subprocess.run([py, osp.join(gpu_check.ROOT, 'tools', 'analysis_tools', 'gpu_check.py'),
                           'run', '--device', 'cpu', '--small', '--compile-backend', 'aot_eager',
                           '--mala-repo', str(root / 'MALA'), '--out', str(out)],
                          cwd=work, env=env, capture_output=True, text=True, timeout=900)
    return dict(proc=proc, py=py, site=site, before=before, tmp=tmp, out=out)


def test_the_bare_environment_lacks_what_the_check_brings(bare_run):
    """The environment is what a GPU image with only python + torch offers: none of the
    OpenMMLab packages, no numpy."""
    probe = ('import importlib.util as u; print([m for m in ("torch", "mmengine", "mmcv", "mmdet", '
             '"mmseg", "mmpretrain", "numpy", "mmlinattn") if u.find_spec(m)])')
    found = subprocess.run([bare_run['py'], '-c', probe], capture_output=True, text=True,
                           check=True, cwd=str(bare_run['tmp'])).stdout.strip()
    assert found == "['torch']"


def test_the_whole_check_runs_there_and_leaves_nothing_behind(bare_run):
    proc = bare_run['proc']
    assert proc.returncode == (1 if OLD_DYNAMO else 0), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ('FAIL: wrote' if OLD_DYNAMO else 'PASS: wrote') in proc.stdout
    assert sorted(os.listdir(bare_run['site'])) == bare_run['before']
    # the unpacked wheels are gone (torch.compile's own cache may stay, as anywhere)
    assert not [d for d in os.listdir(bare_run['tmp']) if d.startswith('mmlinattn-gpu-check-')]
    report = json.loads(open(str(bare_run['out']) + '.json').read())
    assert report['ok'] != OLD_DYNAMO
    assert all(f.startswith('compile: ') for f in report['failures'])
    assert len(report['failures']) == (len(gpu_check.FAMILIES) if OLD_DYNAMO else 0)
    unpacked = ' '.join(report['environment']['unpacked'])
    assert 'mmengine-0.10.7' in unpacked and 'mmcv_lite-2.1.0' in unpacked
    parts = report['parts']
    # a: every core of the table, three precisions, forward and backward within the limits
    assert {(r['core'], r['precision']) for r in parts['cores']} == \
        {(c, p) for c in CORES for p in ('fp32', 'fp16', 'bf16')}
    fp16 = _cpu_autocast_takes(torch.float16)
    for r in parts['cores']:
        if r['precision'] == 'fp16' and not fp16:
            assert r['ok'] and 'no fp16 autocast on cpu' in r['skipped']
            continue
        assert r['ok'] and r['finite'] and r['out_err'] <= gpu_check.CORE_TOL[r['precision']]
    # b: every backbone, fp16 and bf16 steps finite and near fp32
    assert len(parts['amp_steps']) == 2 * len(gpu_check.FAMILIES)
    for r in parts['amp_steps']:
        if r['precision'] == 'fp16' and not fp16:
            assert r['ok'] and r['skipped']
            continue
        assert r['ok'] and r['finite'] and r['grad_err'] <= gpu_check.GRAD_TOL[r['precision']]
    # c: every core and the floor timed at each size
    for r in parts['core_speed']:
        assert all(f'{c}_train_ms' in r for c in CORES) and r['floor_fp32_train_ms'] > 0
    # d: ours timed; the authors' file given (MALA's) timed beside MAViT, with the ratio; the
    # others and timm named as skipped, with the reason
    rows = {r['model']: r for r in parts['backbone_speed']}
    ours = [r for r in rows.values() if r['who'] == 'ours']
    assert len(ours) == len(gpu_check.FAMILIES) and all(r['fp32_ms'] > 0 for r in ours)
    theirs = rows['MAViT-tiny (authors)']
    assert theirs['fp32_ms'] > 0 and theirs['bf16_ms'] > 0
    assert rows['MAViT-tiny']['speedup_vs_authors'] == pytest.approx(
        theirs['fp32_ms'] / rows['MAViT-tiny']['fp32_ms'])
    assert rows['InLinePVT-tiny (authors)']['skipped'] == '--inline-repo not given'
    assert rows['Swin-T (timm)']['skipped'] == 'timm is not installed'
    # e: every backbone compiles and matches eager
    assert len(parts['compile']) == len(gpu_check.FAMILIES)
    if OLD_DYNAMO:
        assert all(not r['ok'] and r['error'] for r in parts['compile'])
    else:
        assert all(r['ok'] and r['err'] <= gpu_check.COMPILE_TOL for r in parts['compile'])
    # f: skipped, and the report says why
    assert parts['detectors']['skipped'] and parts['detectors']['rows'] == []
    md_text = open(str(bare_run['out']) + '.md').read()
    assert ('**FAIL**' if OLD_DYNAMO else '**PASS**') in md_text and 'Skipped: ' in md_text
    for heading in ('## a.', '## b.', '## c.', '## d.', '## e.', '## f.'):
        assert heading in md_text


def test_without_the_wheels_it_says_where_they_belong(tmp_path):
    """A node without the wheels folder gets one line naming it and the fetch command."""
    py, _ = bare_env(tmp_path / 'env')
    proc = subprocess.run([py, osp.join(gpu_check.ROOT, 'tools', 'analysis_tools', 'gpu_check.py'),
                           'run', '--device', 'cpu', '--small', '--wheels', str(tmp_path / 'none'),
                           '--out', str(tmp_path / 'r')], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 1
    assert 'gpu_check.py fetch' in proc.stderr and str(tmp_path / 'none') in proc.stderr
    assert 'Traceback' not in proc.stderr


def test_cuda_requested_without_a_gpu_exits_2(tmp_path):
    if __import__('torch').cuda.is_available():
        pytest.skip('a GPU is here')
    proc = subprocess.run([sys.executable, osp.join(gpu_check.ROOT, 'tools', 'analysis_tools',
                                                    'gpu_check.py'),
                           'run', '--out', str(tmp_path / 'r')], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and '--device cpu' in proc.stderr
