"""tests/warm.py, the suite's tool runner, behaves as subprocess.run / Popen on both of its paths
(the warm fork server and a new interpreter): exit codes, the two streams, a timeout that leaves
no process behind."""
import subprocess
import sys
import time

import pytest

import warm

SCRIPT = '''
import os, sys, time
print('out', os.getpid(), flush=True)
print('err', file=sys.stderr, flush=True)
if sys.argv[1:] == ['sleep']:
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
'''


@pytest.mark.parametrize('fresh', [False, True], ids=['warm', 'new-interpreter'])
def test_runs_as_subprocess_does(fresh, tmp_path):
    script = tmp_path / 'tool.py'
    script.write_text(SCRIPT)
    cmd = [sys.executable, str(script)]
    want = subprocess.run(cmd + ['3'], capture_output=True, text=True)  # the oracle
    got = warm.run(cmd + ['3'], cwd=tmp_path, fresh=fresh)
    assert (got.returncode, got.stderr) == (want.returncode, want.stderr) == (3, 'err\n')
    assert got.stdout.split()[0] == want.stdout.split()[0] == 'out'
    merged = warm.run(cmd, cwd=tmp_path, fresh=fresh, merge=True)
    assert merged.returncode == 0 and merged.stderr is None
    assert merged.stdout.split('\n')[1:] == ['err', '']
    with pytest.raises(subprocess.TimeoutExpired) as e:
        warm.run(cmd + ['sleep'], cwd=tmp_path, fresh=fresh, timeout=3)
    pid = int(e.value.output.split()[1])
    assert not _alive(pid), 'the timed-out run is still there'


def _alive(pid, grace=5.0):
    """Whether ``pid`` still runs after ``grace`` seconds (a zombie, ended and not yet reaped,
    does not)."""
    end = time.time() + grace
    while time.time() < end:
        try:
            with open(f'/proc/{pid}/stat') as f:
                if f.read().rsplit(')', 1)[1].split()[0] == 'Z':
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.1)
    return True
