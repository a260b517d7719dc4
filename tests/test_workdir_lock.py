"""One run per work dir at a time (issue 39): a second tools/train.py into a work dir where a run is
alive stops in one line before any work; a lock whose owner is gone (killed: same host, dead pid or
a reused one; another host: not refreshed) never blocks; other work dirs, a later run and the ranks
of one DDP run are unaffected."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from mmlinattn.training.apis.workdir_lock import LOCK_NAME, WorkDirBusy, lock_work_dir

from helpers import make_toy_sets, toy_seg_options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEG_CFG = os.path.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')


def _write_lock(work, **info):
    work.mkdir(parents=True, exist_ok=True)
    (work / LOCK_NAME).write_text(json.dumps(info))
    return work / LOCK_NAME


def _other_process():
    """A live process of this host that is not us (and its pid)."""
    return subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])


def test_a_live_owner_blocks_and_is_named(tmp_path):
    p = _other_process()
    try:
        with open(f'/proc/{p.pid}/stat') as f:
            started = f.read().rsplit(')', 1)[1].split()[19]
        _write_lock(tmp_path / 'w', host=socket.gethostname(), pid=p.pid, started=started,
                    since='2026-01-01 00:00:00', command='tools/train.py cfg.py')
        with pytest.raises(WorkDirBusy, match=rf'work dir .*w is in use by another run \(pid '
                           rf'{p.pid} on host {socket.gethostname()}.*tools/train.py cfg.py'):
            lock_work_dir(str(tmp_path / 'w'))
        # another work dir is not affected
        lock = lock_work_dir(str(tmp_path / 'other'))
        assert (tmp_path / 'other' / LOCK_NAME).is_file()
        lock.release()
        assert not (tmp_path / 'other' / LOCK_NAME).exists()
    finally:
        p.kill()
        p.wait()


def test_a_lock_whose_owner_is_gone_never_blocks(tmp_path):
    p = subprocess.Popen([sys.executable, '-c', 'pass'])
    p.wait()  # its pid is free now
    host = socket.gethostname()
    cases = {
        'dead pid': dict(host=host, pid=p.pid, started='1'),
        'reused pid': dict(host=host, pid=os.getppid(), started='-1'),  # alive, another start time
        'unreadable': None,
        'no pid': dict(host=host),
        'not a dict': [1, 2],
    }
    for name, info in cases.items():
        work = tmp_path / name.replace(' ', '_')
        path = _write_lock(work)
        path.write_text('{not json' if info is None else json.dumps(info))
        if info is None or 'pid' not in info:  # garbage is judged by its age
            old = time.time() - 60
            os.utime(path, (old, old))
        lock = lock_work_dir(str(work))
        assert json.loads(path.read_text())['pid'] == os.getpid(), name
        lock.release()


def test_another_hosts_lock_expires_unless_refreshed(tmp_path, monkeypatch):
    path = _write_lock(tmp_path / 'w', host='node-elsewhere', pid=1, started='1', since='x',
                       command='train')
    with pytest.raises(WorkDirBusy, match='node-elsewhere'):
        lock_work_dir(str(tmp_path / 'w'))  # refreshed just now (written): alive
    old = time.time() - 600 - 5  # the documented default of MMLINATTN_LOCK_STALE_S
    os.utime(path, (old, old))
    lock_work_dir(str(tmp_path / 'w')).release()


def test_only_rank_0_of_a_ddp_run_takes_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv('RANK', '1')
    assert lock_work_dir(str(tmp_path / 'w')) is None
    assert not (tmp_path / 'w' / LOCK_NAME).exists()


@pytest.mark.slow  # two short toy trainings side by side, ~40 s on 2 cores
def test_two_train_runs_in_one_work_dir(tmp_path):
    """Two tools/train.py started into one work dir: the second stops in one line (exit 2) while
    the first is alive, before it writes anything; the first run's checkpoints and log are its own;
    a third run after the first ended resumes there."""
    data = make_toy_sets(tmp_path / 'data', seed=4, size=64, train=4, val=2)
    work = tmp_path / 'work'
    opts = toy_seg_options(data, 'train_cfg.max_iters=6', 'default_hooks.checkpoint.interval=3')
    cmd = [sys.executable, 'tools/train.py', SEG_CFG, '--work-dir', str(work), '--cfg-options',
           *opts]
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.time() + 300
    while not (work / LOCK_NAME).exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    out_first, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out_first[-3000:]
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    err = second.stderr.strip().splitlines()
    assert err[-1].startswith('tools/train.py: error: work dir ') and \
        f'pid {first.pid} on host' in err[-1], err[-3:]
    logs = [d for d in os.listdir(work) if d[:2].isdigit()]  # mmengine's timestamped folders
    assert len(logs) == 1, sorted(os.listdir(work))
    assert sorted(p for p in os.listdir(work) if p.endswith('.pth')) == ['iter_3.pth', 'iter_6.pth']
    assert not (work / LOCK_NAME).exists()  # released at the end of the run
    resumed = subprocess.run(cmd + ['train_cfg.max_iters=7', '--resume'], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'resumed' in (resumed.stdout + resumed.stderr).lower()
    assert (work / 'iter_7.pth').is_file() and not (work / LOCK_NAME).exists()
