"""`make gpu-check` (tests/gpu_suite.py) where no GPU is: its one line and exit
status, and the CUDA cases the oracle tests get where torch sees a GPU (tests/helpers.py,
``on_devices``), collected with torch's answer faked and nothing run."""
import os
import os.path as osp
import subprocess
import sys

import torch

from helpers import on_devices

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: the tests `make gpu-check` runs on CUDA (pytest -m gpu), with their number of cuda cases: each
#: case of the test's other parameters once (test_autocast_matches_fp32: bf16, fp16 and TF32 for
#: each of the three backbones)
CUDA_CASES = {
    'tests/test_cores.py::test_every_core_linear_equals_its_matrix_times_v': 4,
    'tests/test_core_grads.py::test_inline_grads_equal_the_quadratic_reference': 10,
    'tests/test_core_grads.py::test_mala_grads_equal_the_quadratic_reference': 24,
    'tests/test_core_grads.py::test_half_inputs_promoted_output_and_grads_in_their_dtype': 4,
    'tests/test_core_grads.py::test_autocast_float32_inputs': 4,
    'tests/test_ops.py::test_low_precision_matches_float64': 6,
    'tests/test_ops.py::test_chunked_and_whole_sequence_agree': 6,
    'tests/test_backbones.py::test_autocast_matches_fp32': 9,
    'tests/test_amp.py::test_bf16_autocast_cores_keep_half_activations': 3,
    'tests/test_amp.py::test_amp_step_matches_fp32': 3,  # CUDA's alone: no device parameter
}


def test_without_cuda_one_line_and_exit_status_2(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='')  # no GPU for this torch, on any machine
    r = subprocess.run([sys.executable, 'tests/gpu_suite.py', '--out',
                        str(tmp_path / 'report')], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == '', (r.returncode, r.stdout)
    assert r.stderr.startswith('make gpu-check: no CUDA device visible to torch '), r.stderr
    assert r.stderr.count('\n') == 1 and 'run it on a GPU node' in r.stderr
    assert not (tmp_path / 'report').exists()


def test_cuda_cases_absent_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert on_devices() == ['cpu']
    assert on_devices(('bf16',), cuda_only=[('tf32',)]) == [('cpu', 'bf16')]
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    cases = on_devices(('bf16',), cuda_only=[('tf32',)])
    assert [tuple(getattr(c, 'values', c)) for c in cases] == [
        ('cpu', 'bf16'), ('cuda', 'bf16'), ('cuda', 'tf32')]
    assert [[m.name for m in getattr(c, 'marks', ())] for c in cases] == [[], ['gpu'], ['gpu']]


def test_with_a_gpu_pytest_m_gpu_selects_the_cuda_cases():
    """The collection `make gpu-check` makes, in a python whose torch says it sees a GPU: the
    cuda case of each oracle test, and nothing else."""
    from gpu_suite import TESTS
    code = ('import sys, torch, pytest; torch.cuda.is_available = lambda: True; '
            'sys.exit(pytest.main(sys.argv[1:]))')
    r = subprocess.run([sys.executable, '-c', code, '--collect-only', '-q', '-m', 'gpu',
                        '-p', 'no:cacheprovider', *TESTS], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = [line for line in r.stdout.splitlines() if '::' in line]
    found = {}
    for i in ids:
        found[i.split('[')[0]] = found.get(i.split('[')[0], 0) + 1
    assert found == CUDA_CASES
    assert all('cuda' in i.split('[')[1] for i in ids if 'amp_step' not in i), ids
