"""The suite's own footprint on disk: what a test wrote under tmp_path goes when the test passes.

One run of ``make test`` wrote about 15 GB of checkpoints under pytest's temp dir, and with every
directory kept to the end CI ran out of disk in the last tests. The repository's pytest.ini and
conftest run here on an inner session (a fresh pytest process in a scratch dir) of one passing and
one failing test; the oracle is the directories pytest leaves behind.
"""
import os
import os.path as osp
import shutil
import subprocess
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

INNER = '''
def test_passes(tmp_path):
    (tmp_path / 'weights.pth').write_bytes(b'0' * 1024)


def test_fails(tmp_path):
    (tmp_path / 'weights.pth').write_bytes(b'0' * 1024)
    assert False, 'fails on purpose'
'''


def _inner_session(tmp_path, tests: str):
    """pytest on ``tests`` (a test file's text) with the repository's pytest.ini and conftest, in a
    fresh process; returns (exit code, output, its --basetemp folder)."""
    proj = tmp_path / 'proj'
    (proj / 'tests').mkdir(parents=True)
    shutil.copy(osp.join(ROOT, 'pytest.ini'), proj / 'pytest.ini')
    for name in ('conftest.py', 'upstream_memo.py'):  # the conftest and what it imports
        shutil.copy(osp.join(ROOT, 'tests', name), proj / 'tests' / name)
    (proj / 'tests' / 'test_inner.py').write_text(tests)
    base = tmp_path / 'base'
    env = {k: v for k, v in os.environ.items() if not k.startswith('PYTEST_')}
    r = subprocess.run([sys.executable, '-m', 'pytest', '-q', f'--basetemp={base}', 'tests'],
                       cwd=proj, env=env, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr, base


def test_passed_tests_leave_no_files_and_failed_ones_keep_theirs(tmp_path):
    rc, out, base = _inner_session(tmp_path, INNER)
    assert rc == 1, out  # one test failed, as written
    assert '1 failed, 1 passed' in out, out
    assert not (base / 'test_passes0').exists(), sorted(os.listdir(base))
    assert (base / 'test_fails0' / 'weights.pth').is_file(), sorted(os.listdir(base))
    # the summary says how low the free space went, and after which test
    assert 'GiB free in the temp dir at the start, lowest' in out, out
    assert 'tests/test_inner.py::test_' in out.split('lowest', 1)[1], out


TWO_RUNS = '''
from mmengine.visualization import Visualizer


def _log_a_scalar(tmp_path):
    # what a Runner built in the test does: the runtime config's visualizer, named 'visualizer'
    vis = Visualizer.get_instance('visualizer', save_dir=str(tmp_path),
                                  vis_backends=[dict(type='LocalVisBackend')])
    vis.add_scalar('loss', 1.0, step=1)
    return vis


def test_first_run(tmp_path):
    _log_a_scalar(tmp_path)


def test_second_run(tmp_path):
    vis = _log_a_scalar(tmp_path)
    assert str(tmp_path) in vis._vis_backends['LocalVisBackend']._save_dir
'''


def test_a_later_test_does_not_write_into_an_earlier_tests_removed_tmp_path(tmp_path):
    """mmengine hands the next Runner the visualizer of the same name, save dir and all; with the
    earlier test's tmp_path deleted, the later test's first scalar failed (FileNotFoundError) -
    two tests of the suite did. The conftest drops visualizers pointing into a removed folder."""
    rc, out, _ = _inner_session(tmp_path, TWO_RUNS)
    assert rc == 0 and '2 passed' in out, out
