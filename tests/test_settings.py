"""The environment the tools read: every ``MMLINATTN_*`` variable the docs name is checked before
any work (one line, exit 2, naming the variable, its value and what it takes), units are read as the
docs state them, and a launcher started outside its launcher is one line naming what is missing.
"""
import os
import os.path as osp
import subprocess
import sys

import pytest

from mmlinattn.core import settings

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET = osp.join(ROOT, 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py')
LAUNCH_VARS = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'LOCAL_RANK', 'SLURM_PROCID',
               'SLURM_NTASKS', 'SLURM_NODELIST', 'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE',
               'OMPI_COMM_WORLD_LOCAL_RANK')


@pytest.mark.parametrize('name, value, read', [
    ('MMLINATTN_LOCK_STALE_S', '10m', 600.0),
    ('MMLINATTN_LOCK_STALE_S', '90', 90.0),
    ('MMLINATTN_LOCK_STALE_S', '2m', 120.0),
    ('MMLINATTN_LOCK_STALE_S', '1h', 3600.0),
    ('MMLINATTN_FULL_LOGITS_BUDGET', '2G', 2 * 1024 ** 3),
    ('MMLINATTN_FULL_LOGITS_BUDGET', '512MiB', 512 * 1024 ** 2),
    ('MMLINATTN_FULL_LOGITS_BUDGET', '1000', 1000),
    ('MMLINATTN_UPSTREAM_FIXES', 'off', False),
    ('MMLINATTN_UPSTREAM_FIXES', 'YES', True),
    ('MMLINATTN_CHECKPOINT_BASE_URL', 'https://mirror.example/ckpt/', 'https://mirror.example/ckpt'),
])
def test_values_are_read_in_the_documented_units(name, value, read, monkeypatch):
    monkeypatch.setenv(name, value)
    assert settings.get(name) == read


def test_the_readers_take_their_values_from_the_settings(monkeypatch):
    from mmlinattn.apis.large_image import full_logits_budget
    from mmlinattn.training.workdir_lock import stale_after_s
    monkeypatch.delenv('MMLINATTN_LOCK_STALE_S', raising=False)
    monkeypatch.delenv('MMLINATTN_FULL_LOGITS_BUDGET', raising=False)
    assert stale_after_s() == 600 and full_logits_budget() == 1 << 30  # the documented defaults
    monkeypatch.setenv('MMLINATTN_LOCK_STALE_S', '10m')
    monkeypatch.setenv('MMLINATTN_FULL_LOGITS_BUDGET', '2G')
    assert stale_after_s() == 600 and full_logits_budget() == 2 << 30


# each value once (the message is settings.check_all's), each tool at least once (train and test
# check in LinAttnRunner.check_config, image_demo on its own)
@pytest.mark.parametrize('tool, name, value, expected', [
    ('train', 'MMLINATTN_UPSTREAM_FIXES', 'disabled', 'expected 1, on, true or yes'),
    ('test', 'MMLINATTN_LOCK_STALE_S', 'ten', 'expected seconds'),
    ('image_demo', 'MMLINATTN_LOCK_STALE_S', '30', 'expected seconds, at least 90'),
    ('train', 'MMLINATTN_FULL_LOGITS_BUDGET', '2 gigs', 'expected bytes'),
    ('test', 'MMLINATTN_CHECKPOINT_BASE_URL', 'mirror.example',
     'expected an http:// or https:// URL'),
])
def test_a_bad_value_is_one_line_before_any_work(tool, name, value, expected, monkeypatch,
                                                  tmp_path, capsys):
    monkeypatch.setenv(name, value)
    work = tmp_path / 'w'
    if tool == 'train':
        from tools import train as t
        rc = t.main([DET, '--work-dir', str(work)])
    elif tool == 'test':
        from tools import test as t
        rc = t.main([DET, str(tmp_path / 'none.pth'), '--work-dir', str(work)])
    else:
        from tools import image_demo as t
        rc = t.main([str(tmp_path), DET, str(tmp_path / 'none.pth'), '--out-dir', str(work)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f'error: {name}={value}: {expected}' in err[0]
    assert not work.exists() or not any(work.iterdir())


def test_upstream_tools_get_a_warning_and_keep_the_fixes():
    """mmdet's own tools import mmlinattn.upstream_fixes through the config: a bad switch there is
    a warning naming it, and the fixes stay on (the default)."""
    env = {'MMLINATTN_UPSTREAM_FIXES': 'disabled', 'PATH': '/usr/bin:/bin'}
    code = ('import warnings; warnings.simplefilter("always")\n'
            'import mmlinattn.upstream_fixes\n'
            'from mmlinattn.training import compat\n'
            'print(sorted(set(str(v).split()[0] for v in compat.STATUS.values())))')
    r = subprocess.run([sys.executable, '-c', code], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert 'MMLINATTN_UPSTREAM_FIXES=disabled: expected' in r.stderr
    assert 'the fixes stay on' in r.stderr and "'off" not in r.stdout


@pytest.mark.parametrize('launcher, missing, how', [
    ('slurm', 'SLURM_PROCID, SLURM_NTASKS, SLURM_NODELIST are not set', 'under srun'),
    ('pytorch', 'RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not set', 'torchrun'),
    ('mpi', 'OMPI_COMM_WORLD_RANK', 'mpirun'),
])
def test_a_launcher_outside_its_launcher_is_one_line(launcher, missing, how, monkeypatch,
                                                     tmp_path, capsys):
    """mmengine's init_dist reads these with os.environ[...]: a KeyError traceback before."""
    from tools import train
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    rc = train.main([DET, '--work-dir', str(tmp_path / 'w'), '--launcher', launcher])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f'--launcher {launcher}: {missing}' in err[0] and how in err[0]


def test_a_tool_start_prints_no_upstream_deprecation_noise(tmp_path):
    """mmengine 0.10 resolves config paths through pkg_resources, which setuptools >= 81 deprecates
    with a warning at each import: four per config, at every start of every tool. The tools read
    configs without them (the check can only fail where this setuptools warns at all)."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONWARNINGS'}  # a user's defaults
    r = subprocess.run([sys.executable, osp.join(ROOT, 'tools/train.py'), DET, '--work-dir',
                        str(tmp_path / 'w'), '--cfg-options',
                        'train_dataloader.dataset.data_root=/nowhere'],
                       env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and '/nowhere' in r.stderr, r.stderr[-2000:]
    assert 'pkg_resources is deprecated' not in r.stderr + r.stdout
