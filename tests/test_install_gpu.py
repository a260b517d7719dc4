"""tools/install_lib.sh on a GPU node, with the GPU faked: a fake ``nvidia-smi`` printing a driver
version and a fake python whose torch answers what a CUDA 13.0 torch answers on a too-old driver.
Each test sources install_lib.sh in bash and calls one function; nothing is installed.

The driver each CUDA major version needs is NVIDIA's (CUDA Compatibility guide, "Minor Version
Compatibility": CUDA 11.x >= 450, 12.x >= 525, 13.x >= 580)."""
import os
import os.path as osp
import subprocess
import textwrap

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: NVIDIA's table, not the scripts'
MIN_DRIVER = {'11.8': '450', '12.1': '525', '12.8': '525', '13.0': '580'}


def _exe(path, body: str) -> str:
    with open(path, 'w') as f:
        f.write('#!/bin/sh\n' + textwrap.dedent(body))
    os.chmod(path, 0o755)
    return str(path)


def _bash(tmp_path, call: str, env=None):
    """Source install_lib.sh as tools/install.sh does (VENV under tmp_path) and run ``call``."""
    venv = tmp_path / 'venv'
    (venv / 'bin').mkdir(parents=True, exist_ok=True)
    script = (f'set -euo pipefail; ROOT={ROOT}; VENV={venv}; STAMP={venv}/.stamp; TAG=install; '
              f'STAMP_SCRIPT={ROOT}/tools/install.sh; PYTHON=python3; '
              f'source {ROOT}/tools/install_lib.sh; {call}')
    e = {k: v for k, v in os.environ.items() if k not in ('CUDA_VISIBLE_DEVICES', 'MAX_JOBS')}
    e['PATH'] = f'{tmp_path / "bin"}:{e["PATH"]}'
    e.update(env or {})
    (tmp_path / 'bin').mkdir(exist_ok=True)
    return subprocess.run(['bash', '-c', script], env=e, capture_output=True, text=True,
                          timeout=60)


def _fake_smi(tmp_path, out='535.104.05', rc=0):
    (tmp_path / 'bin').mkdir(exist_ok=True)
    return _exe(tmp_path / 'bin' / 'nvidia-smi', f'echo "{out}"\nexit {rc}\n')


def _fake_torch(tmp_path, line: str) -> str:
    """A python whose every ``-c`` prints ``line`` (what the function asks torch)."""
    return _exe(tmp_path / 'fakepy', f'echo "{line}"\n')


@pytest.mark.parametrize('cuda', sorted(MIN_DRIVER))
def test_cuda_min_driver_is_nvidias_table(cuda, tmp_path):
    r = _bash(tmp_path, f'cuda_min_driver {cuda}')
    assert r.stdout.strip() == MIN_DRIVER[cuda], r.stderr


def test_gpu_that_torch_cannot_see_stops_the_install(tmp_path):
    _fake_smi(tmp_path, '535.104.05')
    py = _fake_torch(tmp_path, 'False 13.0 2.14.1+cu130 ')
    r = _bash(tmp_path, 'torch_sees_the_gpu; echo REACHED', env={'VPY': py})
    assert r.returncode != 0 and 'REACHED' not in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr          # one line
    msg = lines[0]
    assert 'torch.version.cuda 13.0' in msg and 'driver 535.104.05' in msg
    assert 'driver >= 580' in msg and 'docs/install.md' in msg
    assert 'CUDA_VISIBLE_DEVICES= make install' in msg


def test_cpu_only_torch_beside_a_gpu_stops_the_install(tmp_path):
    _fake_smi(tmp_path, '590.48.01')
    py = _fake_torch(tmp_path, 'False None 2.14.1+cpu ')
    r = _bash(tmp_path, 'torch_sees_the_gpu', env={'VPY': py})
    assert r.returncode != 0
    assert 'CPU-only build' in r.stderr and 'torch.version.cuda None' in r.stderr


def test_new_enough_driver_that_torch_cannot_use_names_torchs_reason(tmp_path):
    _fake_smi(tmp_path, '590.48.01')
    py = _fake_torch(tmp_path, 'False 13.0 2.14.1+cu130 No CUDA GPUs are available')
    r = _bash(tmp_path, 'torch_sees_the_gpu', env={'VPY': py})
    assert r.returncode != 0
    assert 'No CUDA GPUs are available' in r.stderr
    assert 'builds need an NVIDIA driver' not in r.stderr


@pytest.mark.parametrize('case', ['torch-sees-it', 'no-nvidia-smi', 'smi-fails', 'smi-no-gpu',
                                  'cpu-on-purpose'])
def test_install_goes_on(case, tmp_path):
    env = {'VPY': _fake_torch(tmp_path, 'True 13.0 2.14.1+cu130 ' if case == 'torch-sees-it'
                              else 'False 13.0 2.14.1+cu130 ')}
    if case == 'no-nvidia-smi':
        env['NVIDIA_SMI'] = str(tmp_path / 'absent' / 'nvidia-smi')
    elif case == 'smi-fails':
        _fake_smi(tmp_path, 'NVIDIA-SMI has failed because it could not communicate with the '
                  'NVIDIA driver.', rc=9)
    elif case == 'smi-no-gpu':
        _fake_smi(tmp_path, 'No devices were found', rc=6)
    else:
        _fake_smi(tmp_path, '535.104.05')
        if case == 'cpu-on-purpose':
            env['CUDA_VISIBLE_DEVICES'] = ''
    r = _bash(tmp_path, 'torch_sees_the_gpu; echo REACHED', env=env)
    assert r.returncode == 0 and 'REACHED' in r.stdout, r.stderr


def _stamped_venv(tmp_path, kinds: str) -> None:
    """A venv whose stamp matches and whose python answers '<machine kind> <mmcv ops kind>'."""
    venv = tmp_path / 'venv'
    (venv / 'bin').mkdir(parents=True, exist_ok=True)
    _exe(venv / 'bin' / 'python', f'echo "{kinds}"\n')
    r = _bash(tmp_path, f'echo "$want_stamp" > {venv}/.stamp')
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize('kinds,fresh', [('cpu cpu', True), ('cuda cuda', True),
                                         ('cpu cuda', True), ('cuda cpu', False)])
def test_stamp_needs_cuda_ops_where_torch_sees_a_gpu(kinds, fresh, tmp_path):
    """A .venv built on a GPU-less login node (CPU-only mmcv) is stale on a GPU node; a CUDA build
    serves a CPU node too (it holds the CPU ops)."""
    _stamped_venv(tmp_path, kinds)
    r = _bash(tmp_path, 'if stamp_up_to_date; then echo FRESH; else echo STALE; fi')
    assert r.stdout.strip() == ('FRESH' if fresh else 'STALE'), r.stderr
    if not fresh:
        assert 'CPU-only ops but torch sees a GPU' in r.stderr


def test_stamp_reads_the_ops_kind_from_mmcv(tmp_path):
    """stamp_up_to_date asks mmcv which ops it was compiled with (mmcv.ops'
    get_compiling_cuda_version: 'not available' in a CPU-only build)."""
    venv = tmp_path / 'venv'
    (venv / 'bin').mkdir(parents=True)
    log = tmp_path / 'asked.py'
    _exe(venv / 'bin' / 'python', f'printf "%s" "$2" > {log}\necho "cpu cpu"\n')
    _bash(tmp_path, f'echo "$want_stamp" > {venv}/.stamp; stamp_up_to_date')
    asked = log.read_text()
    assert 'get_compiling_cuda_version' in asked and "'not available'" in asked.replace('"', "'")
    assert 'torch.cuda.is_available()' in asked and 'mmlinattn' in asked


def _jobs(tmp_path, kind, mem_gib, cpus=16, max_jobs=None):
    (tmp_path / 'bin').mkdir(exist_ok=True)
    _exe(tmp_path / 'bin' / 'nproc', f'echo {cpus}\n')
    meminfo = tmp_path / 'meminfo'
    meminfo.write_text(f'MemTotal:       {256 * 1024 * 1024} kB\n'
                       f'MemAvailable:   {int(mem_gib * 1024 * 1024)} kB\n')
    env = {'_MEMINFO': str(meminfo)}
    if max_jobs is not None:
        env['MAX_JOBS'] = str(max_jobs)
    r = _bash(tmp_path, f'mmcv_build_jobs {kind}', env=env)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


@pytest.mark.parametrize('kind,mem_gib,cpus,want', [
    ('cuda13.0-sm90', 22, 16, 4),     # 22 GiB available / 5 GiB per nvcc job
    ('cuda13.0-sm90', 3, 16, 1),      # at least one
    ('cuda13.0-sm90', 500, 16, 16),   # at most nproc
    ('cpu', 3, 16, 16),               # CPU ops: nproc, as before
])
def test_cuda_build_jobs_follow_memory(kind, mem_gib, cpus, want, tmp_path):
    assert _jobs(tmp_path, kind, mem_gib, cpus) == want


def test_max_jobs_overrides(tmp_path):
    assert _jobs(tmp_path, 'cuda13.0-sm90', 3, 16, max_jobs=7) == 7


def test_install_checks_the_gpu_on_both_paths():
    """tools/install.sh calls the check after installing torch and on the up-to-date path."""
    text = open(osp.join(ROOT, 'tools', 'install.sh')).read()
    fast, _, slow = text.partition('make_venv\n')
    assert 'torch_sees_the_gpu' in fast.split('if stamp_up_to_date; then', 1)[1]
    torch_at = slow.index('requirements/torch.txt')
    assert torch_at < slow.index('torch_sees_the_gpu') < slow.index('mmcv_wheel')


def test_gpu_check_target_needs_no_install():
    """`make gpu-check` runs with the system python3 and its torch: no .venv is built first."""
    r = subprocess.run(['make', '--no-print-directory', '-n', '-C', ROOT, 'gpu-check'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert 'install.sh' not in r.stdout and '.venv' not in r.stdout, r.stdout
    assert r.stdout.strip().startswith('python3 tests/gpu_suite.py'), r.stdout
