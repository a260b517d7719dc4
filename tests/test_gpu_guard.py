"""mmlinattn.training.gpu_guard: a training run refuses to fall back to the CPU where nvidia-smi
lists a GPU that torch does not see, with the GPU faked (a fake ``nvidia-smi`` on PATH, torch's
answers patched). The driver each CUDA major version needs is NVIDIA's table (CUDA Compatibility
guide, "Minor Version Compatibility"), written out here."""
import os
import shutil
import time

import pytest
import torch
from mmengine.config import Config

from mmlinattn.training import gpu_guard


def _path_with(tmp_path, monkeypatch, smi_out=None, rc=0, sleep_s=0):
    """PATH holding only a fake nvidia-smi (or nothing, ``smi_out`` None); it logs its calls."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    calls = tmp_path / 'calls'
    if smi_out is not None:
        smi = bin_dir / 'nvidia-smi'
        smi.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                       + (f'exec {shutil.which("sleep")} {sleep_s}\n' if sleep_s else '')
                       + f'echo "{smi_out}"\nexit {rc}\n')
        smi.chmod(0o755)
    monkeypatch.setenv('PATH', str(bin_dir))
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    return calls


def _torch(monkeypatch, available=False, cuda='13.0', version='2.14.1+cu130'):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: available)
    monkeypatch.setattr(torch.version, 'cuda', cuda)
    monkeypatch.setattr(torch, '__version__', version)


def test_gpu_torch_cannot_see_refuses_a_cpu_run(tmp_path, monkeypatch):
    _path_with(tmp_path, monkeypatch, '535.104.05')
    _torch(monkeypatch)
    with pytest.raises(ValueError) as err:
        gpu_guard.check_gpu_visible_to_torch(Config(dict(model=dict(type='X'))))
    msg = str(err.value)
    assert '\n' not in msg
    assert 'driver 535.104.05' in msg and 'torch.version.cuda 13.0' in msg
    assert 'driver >= 580' in msg and '--cfg-options allow_cpu=True' in msg


def test_cpu_only_torch_beside_a_gpu_says_so(tmp_path, monkeypatch):
    _path_with(tmp_path, monkeypatch, '590.48.01')
    _torch(monkeypatch, cuda=None, version='2.14.1+cpu')
    with pytest.raises(ValueError, match='CPU-only build'):
        gpu_guard.check_gpu_visible_to_torch({})


def test_new_enough_driver_asks_for_the_gpu_access(tmp_path, monkeypatch):
    _path_with(tmp_path, monkeypatch, '590.48.01')
    _torch(monkeypatch)
    with pytest.raises(ValueError) as err:
        gpu_guard.check_gpu_visible_to_torch({})
    assert 'torch.cuda.init()' in str(err.value) and 'driver >=' not in str(err.value)


@pytest.mark.parametrize('case', ['allow_cpu', 'hidden', 'no-nvidia-smi', 'smi-fails',
                                  'no-gpu-listed', 'smi-hangs'])
def test_cpu_run_goes_on(case, tmp_path, monkeypatch):
    smi = {'no-nvidia-smi': None, 'smi-fails': 'NVIDIA-SMI has failed because it could not '
           'communicate with the NVIDIA driver.', 'no-gpu-listed': 'No devices were found'}
    _path_with(tmp_path, monkeypatch, smi.get(case, '535.104.05'),
               rc=9 if case in ('smi-fails', 'no-gpu-listed') else 0,
               sleep_s=5 if case == 'smi-hangs' else 0)
    _torch(monkeypatch)
    if case == 'hidden':
        monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    if case == 'smi-hangs':
        monkeypatch.setattr(gpu_guard, 'TIMEOUT_S', 0.5)
    cfg = Config(dict(allow_cpu=True)) if case == 'allow_cpu' else Config({})
    start = time.monotonic()
    gpu_guard.check_gpu_visible_to_torch(cfg)
    assert time.monotonic() - start < 3   # a hanging nvidia-smi is cut off (0.5 s here)


def test_nvidia_smi_is_not_asked_where_torch_sees_a_gpu(tmp_path, monkeypatch):
    calls = _path_with(tmp_path, monkeypatch, '535.104.05')
    _torch(monkeypatch, available=True)
    gpu_guard.check_gpu_visible_to_torch({})
    assert not calls.exists()
    _torch(monkeypatch, available=False)
    with pytest.raises(ValueError):
        gpu_guard.check_gpu_visible_to_torch({})
    assert calls.read_text().split() == ['--query-gpu=driver_version', '--format=csv,noheader']


@pytest.mark.parametrize('cuda,need', [('11.8', 450), ('12.1', 525), ('12.8', 525),
                                       ('13.0', 580), (None, None), ('14.0', None)])
def test_cuda_min_driver_is_nvidias_table(cuda, need):
    assert gpu_guard.cuda_min_driver(cuda) == need


def test_the_real_machine_passes_or_says_why():
    """Here, unpatched: a machine whose torch sees its GPU (or that has none) passes."""
    if torch.cuda.is_available() or gpu_guard.nvidia_driver_version() is None \
            or os.environ.get('CUDA_VISIBLE_DEVICES') == '':
        gpu_guard.check_gpu_visible_to_torch({})
    else:
        with pytest.raises(ValueError, match='nvidia-smi lists a GPU'):
            gpu_guard.check_gpu_visible_to_torch({})


def test_every_tool_that_trains_a_config_of_ours_refuses(toy_data, tmp_path, monkeypatch):
    """The check is the Runner's (LinAttnRunner, named by our runtimes), before any data is read:
    under our tools, mmdet's / mmseg's own and mim alike; allow_cpu=True lets the run go on."""
    from mmlinattn.training.config import ConfigError
    from tools import train as train_tool

    from helpers import run_checks, toy_seg_options
    seg = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       'configs/toy/fpn_mavit-t_toy-ade.py')
    cfg = train_tool.build_cfg(train_tool.parse_args(
        [seg, '--work-dir', str(tmp_path / 'w'), '--cfg-options', *toy_seg_options(toy_data)]))
    _path_with(tmp_path, monkeypatch, '535.104.05')
    _torch(monkeypatch)
    with pytest.raises(ConfigError, match=r'allow_cpu=True'):
        run_checks(cfg)
    cfg.allow_cpu = True
    run_checks(cfg)
