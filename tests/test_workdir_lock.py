"""One run per work dir at a time: a second training into a work dir where a run is alive stops
in one line before any work; a lock whose owner is gone (killed: same host, dead pid or a reused
one; another host: not refreshed) never blocks; other work dirs, a later run and the ranks of one
DDP run are unaffected. (A finished training gives the lock back: test_edges.py; a refusal on one
rank stops every rank: test_hook_cost.py.)"""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from mmlinattn.training.workdir_lock import LOCK_NAME, WorkDirBusy, lock_work_dir

from helpers import toy_seg_options, work_dir_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEG_CFG = os.path.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')


def _write_lock(work, **info):
    work.mkdir(parents=True, exist_ok=True)
    (work / LOCK_NAME).write_text(json.dumps(info))
    return work / LOCK_NAME


def _other_process():
    """A live process of this host that is not us (and its pid)."""
    return subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])


def test_a_live_owner_blocks_and_is_named(toy_data, tmp_path, capsys):
    """A training into a work dir whose run is alive (another process holds the lock, taken by
    lock_work_dir as a training takes it): the Runner stops in one line (exit 2) before any data is
    read, naming that process, and the work dir's contents are as it found them."""
    from mmengine.registry import RUNNERS

    from tools import train as train_tool
    work = tmp_path / 'w'
    work.mkdir()
    (work / 'iter_12.pth').write_bytes(b'the running run\'s checkpoint')
    (work / 'last_checkpoint').write_text(str(work / 'iter_12.pth'))
    holder = ('import sys, time\nfrom mmlinattn.training.workdir_lock import lock_work_dir\n'
              f'lock_work_dir({str(work)!r})\nprint("locked", flush=True)\ntime.sleep(120)\n')
    p = subprocess.Popen([sys.executable, '-c', holder], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == 'locked'
        before = work_dir_files(work)
        host = socket.gethostname()
        busy = rf'work dir .*w is in use by another run \(pid {p.pid} on host {host}'
        with pytest.raises(WorkDirBusy, match=busy):
            lock_work_dir(str(work))
        cfg = train_tool.build_cfg(train_tool.parse_args(
            [SEG_CFG, '--work-dir', str(work), '--cfg-options', *toy_seg_options(toy_data)]))
        cfg.experiment_name = 'lock_busy'
        capsys.readouterr()
        with pytest.raises(WorkDirBusy, match=busy) as e:
            RUNNERS.build(cfg).train()
        err = [ln for ln in capsys.readouterr().err.splitlines() if ': error: ' in ln]
        assert e.value.code == 2 and len(err) == 1 and f'pid {p.pid}' in err[0], err
        assert work_dir_files(work) == before
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
    monkeypatch.delenv('MMLINATTN_LOCK_STALE_S', raising=False)  # the default, 600 s
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


def test_a_refusal_keeps_the_log_folder_of_a_run_started_in_the_same_second(tmp_path,
                                                                           monkeypatch):
    """Two runs started in one second into one work dir share mmengine's timestamped log folder:
    the one refused removes its own things, not the running one's log."""
    import mmengine.runner.runner as mmengine_runner
    from mmengine.config import Config

    from mmlinattn.training.config import ConfigError

    from helpers import run_checks
    fixed = time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1))
    monkeypatch.setattr(mmengine_runner.time, 'time', lambda: fixed)
    work = tmp_path / 'w'
    running = work / '20260102_030405'  # the other run's log folder, its log in it
    running.mkdir(parents=True)
    (running / '20260102_030405.log').write_text('the first run logs here\n')
    cfg = Config.fromfile(SEG_CFG)
    cfg.work_dir = str(work)
    for k in ('train', 'val', 'test'):  # missing here whatever the checkout holds (make demo)
        cfg[f'{k}_dataloader'].dataset.data_root = str(tmp_path / 'nowhere')
    with pytest.raises(ConfigError, match='dataset paths do not exist'):  # any refusal
        run_checks(cfg)
    assert not any(p.name.endswith('.py') for p in work.iterdir())  # its own things: gone
    assert (running / '20260102_030405.log').read_text().startswith('the first run logs here')


# -------------------- what a killed run leaves behind
def test_taking_over_removes_the_dead_runs_temporary_checkpoints(tmp_path, capsys):
    """``kill -9`` while saving leaves ``NAME.tmp-<pid>`` (the atomic write's temporary file): the
    run that takes over the dead run's lock removes those of that pid, and says so with the
    takeover in one line; another pid's files and the finished checkpoints stay."""
    p = subprocess.Popen([sys.executable, '-c', 'pass'])
    p.wait()
    work = tmp_path / 'w'
    _write_lock(work, host=socket.gethostname(), pid=p.pid, started='1', since='t0',
                command='train')
    (work / f'epoch_3.pth.tmp-{p.pid}').write_bytes(b'\0' * (3 << 20))
    (work / f'last_checkpoint.tmp-{p.pid}').write_text('x')
    keep = [work / 'epoch_2.pth', work / f'epoch_9.pth.tmp-{os.getpid()}']
    for f in keep:
        f.write_bytes(b'x')
    lock_work_dir(str(work)).release()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f'took over the run lock of a run that is gone (pid {p.pid}' in err[0]
    assert 'removed the 2 unfinished checkpoint file(s)' in err[0] and '3.0 MiB' in err[0]
    assert sorted(x.name for x in work.iterdir()) == sorted(f.name for f in keep)


def test_a_resumed_run_finishes_the_rotation_a_killed_save_left_undone(tmp_path):
    """mmengine takes the oldest checkpoint off keep_ckpt_ids (saved with the new checkpoint)
    before deleting it: killed in between, that file would escape the rotation for ever. The hook
    records the deletions it holds back in the message hub saved with the new checkpoint (checked
    here on a save whose rotation removes epoch_3.pth), and a resumed run removes exactly those:
    not the checkpoints an earlier run kept on purpose (epoch_1.pth, max_keep_ckpts=-1 then)."""
    import logging
    from types import SimpleNamespace

    from mmengine.fileio import LocalBackend
    from mmengine.logging import MessageHub

    from mmlinattn.training.safe_checkpoint import PENDING, SafeCheckpointHook
    work = tmp_path / 'w'
    work.mkdir()
    for n in ('epoch_1.pth', 'epoch_3.pth', 'epoch_4.pth', 'best_coco_bbox_mAP_epoch_3.pth'):
        (work / n).write_bytes(b'x')
    records = []
    logger = logging.getLogger('rotation-test')
    logger.addHandler(type('H', (logging.Handler,), {'emit': lambda s, r: records.append(
        r.getMessage())})())
    # a save: what the checkpoint is written with, and what is left after it
    hub = MessageHub.get_instance('rotation-save')
    saved_with = []

    def save_checkpoint(out_dir, filename, *args, **kwargs):
        saved_with.append(list(hub.get_info(PENDING)))
        (tmp_path / 'w' / filename).write_bytes(b'x')

    runner = SimpleNamespace(work_dir=str(work), message_hub=hub, logger=logger,
                             save_checkpoint=save_checkpoint)
    hook = SafeCheckpointHook(interval=1, max_keep_ckpts=2)
    hook.out_dir, hook.file_backend = str(work), LocalBackend()

    def rotation_then_save(r):  # what mmengine's _save_checkpoint_with_step does, in order
        hook.file_backend.remove(str(work / 'epoch_3.pth'))
        r.save_checkpoint(str(work), 'epoch_5.pth')

    def stat_record(path):  # a file's name, size, mtime (ns) and inode, from os.stat
        st = os.stat(path)
        return [path.name, st.st_size, st.st_mtime_ns, st.st_ino]

    held = stat_record(work / 'epoch_3.pth')
    hook._holding_deletions(rotation_then_save, runner)
    assert saved_with == [[held]] and hub.get_info(PENDING) == []
    assert not (work / 'epoch_3.pth').exists()

    def resume_with(record):
        resumed = MessageHub.get_instance(f'rotation-resume-{len(records)}-{record[0][2]}')
        resumed.update_info('keep_ckpt_ids', [4, 5])
        resumed.update_info(PENDING, record)
        hook = SafeCheckpointHook(interval=1, max_keep_ckpts=2)
        hook.before_train(SimpleNamespace(work_dir=str(work), message_hub=resumed, logger=logger))
        assert resumed.get_info(PENDING) == []

    # killed between the save and the deletion: the resumed run's hub holds the saved record of
    # the file that is still there
    (work / 'epoch_3.pth').write_bytes(b'x')
    resume_with([stat_record(work / 'epoch_3.pth')])
    assert sorted(x.name for x in work.iterdir()) == sorted(
        ['epoch_1.pth', 'epoch_4.pth', 'epoch_5.pth', 'best_coco_bbox_mAP_epoch_3.pth'])
    said = [r for r in records if 'rotation' in r]
    assert len(said) == 1 and 'removed epoch_3.pth' in said[0], records
    # a later resume from a checkpoint with that record, after the user put a file of that name
    # back: another file (inode, mtime), kept, and said so
    (work / 'epoch_3.pth').write_bytes(b'put back')
    resume_with([held])
    assert (work / 'epoch_3.pth').read_bytes() == b'put back'
    assert any('kept epoch_3.pth' in r for r in records), records


def test_an_empty_last_checkpoint_is_named_with_the_file_resumed(tmp_path):
    import logging

    import torch

    from mmlinattn.training.resume import latest_intact_contents
    work = tmp_path / 'w'
    work.mkdir()
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': {'epoch': 1}}, work / 'epoch_1.pth')
    (work / 'last_checkpoint').write_text('')  # killed while mmengine wrote it
    records = []
    logger = logging.getLogger('empty-pointer-test')
    logger.addHandler(type('H', (logging.Handler,), {'emit': lambda s, r: records.append(
        r.getMessage())})())
    got = latest_intact_contents(str(work), logger)
    assert got.path == str(work / 'epoch_1.pth')
    assert len(records) == 1 and 'last_checkpoint (empty)' in records[0]
    assert 'resuming from ' + str(work / 'epoch_1.pth') in records[0]
    (work / 'epoch_1.pth').unlink()
    assert latest_intact_contents(str(work), logger) is None  # nothing to resume: a fresh start


def test_resume_in_a_copied_work_dir_takes_its_own_checkpoint(tmp_path):
    """An experiment branched by copying its folder (and dropping the later checkpoints): its
    last_checkpoint still names the original's newest file by absolute path (mmengine writes it
    so); --resume continues from the copy's own newest checkpoint, and says why; a work dir with no
    checkpoint of its own (CheckpointHook out_dir elsewhere), or weights only, still follows the
    pointer."""
    import logging
    import shutil

    import torch

    from mmlinattn.core.weights import CheckpointError
    from mmlinattn.training.resume import latest_intact_contents
    orig = tmp_path / 'orig'
    orig.mkdir()
    for it in (4, 8):
        torch.save({'state_dict': {'w': torch.full((1,), float(it))}, 'meta': {'iter': it}},
                   orig / f'iter_{it}.pth')
    (orig / 'last_checkpoint').write_text(str(orig / 'iter_8.pth'))
    copy = tmp_path / 'branch'
    shutil.copytree(orig, copy)
    (copy / 'iter_8.pth').unlink()  # the branch starts from iteration 4
    records = []
    logger = logging.getLogger('copied-work-dir-test')
    logger.addHandler(type('H', (logging.Handler,), {'emit': lambda s, r: records.append(
        r.getMessage())})())
    got = latest_intact_contents(str(copy), logger)
    assert got.path == str(copy / 'iter_4.pth') and got.obj['meta']['iter'] == 4
    assert len(records) == 1 and 'outside this work dir' in records[0], records
    elsewhere = tmp_path / 'pointer_only'
    elsewhere.mkdir()
    (elsewhere / 'last_checkpoint').write_text(str(orig / 'iter_8.pth'))
    assert latest_intact_contents(str(elsewhere), logger).path == str(orig / 'iter_8.pth')
    # ... also where the work dir holds weights only (a backbone file put there by hand): those
    # are no training to resume, the pointer's checkpoint is
    torch.save({'w': torch.zeros(1)}, elsewhere / 'backbone.pth')
    records.clear()
    assert latest_intact_contents(str(elsewhere), logger).path == str(orig / 'iter_8.pth')
    assert 'backbone.pth (no training state' in records[-1], records
    assert 'resuming from ' + str(orig / 'iter_8.pth') in records[-1], records
    # ... but not where the folder's own training checkpoint is damaged: that is said, and the
    # original's later checkpoint (another branch) is not taken instead
    (copy / 'iter_4.pth').write_bytes(b'not a checkpoint')
    with pytest.raises(CheckpointError, match='no intact checkpoint in'):
        latest_intact_contents(str(copy), logger)


def test_resuming_a_finished_run_says_so(toy_data, tmp_path, capsys):
    """mmengine builds everything and trains nothing (exit 0, no word); here one line, exit 0,
    before any data is read."""
    import torch

    from tools import train
    work = tmp_path / 'w'
    work.mkdir()
    ckpt = work / 'iter_4.pth'
    torch.save({'state_dict': {}, 'meta': {'epoch': 0, 'iter': 4}}, ckpt)
    (before,) = work_dir_files(work).values()
    rc = train.main([SEG_CFG, '--work-dir', str(work), '--resume', str(ckpt),
                     '--cfg-options', *toy_seg_options(toy_data, 'train_cfg.max_iters=4')])
    out = capsys.readouterr().out
    assert rc == 0
    assert f'{ckpt} is at iter 4 of train_cfg.max_iters=4: nothing left to train' in out
    assert work_dir_files(work) == {'iter_4.pth': before}  # nothing else written there
