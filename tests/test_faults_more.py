"""Training faults that must stop clearly and lose nothing: a diverging run, a checkpoint
write failing while CheckpointHook rotates, a config whose _base_ is missing (a preempted job:
test_stop_and_resume.py). Each on data the test makes (a few iterations of the toy Semantic
FPN, MAViT-T)."""
import errno
import os
import os.path as osp
import re

import pytest
import torch

from mmlinattn.training.resume import latest_intact_checkpoint
from tools import train as train_tool

from helpers import (
    read_last_checkpoint,
    toy_seg_options,
)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')


# --------------------------------------------------------------------------- 1. non-finite loss
@pytest.mark.slow
def test_nan_loss_stops_at_its_iteration_and_saves_no_broken_weights(toy_data, tmp_path, capsys):
    """One line, exit 2, the broken iteration not saved. (Under mmengine's plain Runner:
    test_runner_seams.py; a test of a diverged checkpoint: test_one_run.py.)"""
    work = tmp_path / 'work'
    rc = train_tool.main([SEG_CFG, '--work-dir', str(work), '--cfg-options', *toy_seg_options(
        toy_data, 'optim_wrapper.optimizer.lr=1000.0', 'param_scheduler=[]',
        'train_cfg.max_iters=6',
        'default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=100',
        'experiment_name=nan_run')])
    err, prog = capsys.readouterr().err, 'tools/train.py'
    assert rc == 2, err[-2000:]
    line = [ln for ln in err.splitlines() if ln.startswith(f'{prog}: error: non-finite')]
    assert len(line) == 1 and err.strip().splitlines()[-1] == line[0], err[-2000:]
    m = re.search(r'non-finite (loss|weights)\D+ iteration (\d+)\W+(.*?); .*\blr=([\d.e+-]+?)\. ',
                  line[0])
    assert m, line[0]
    n = int(m.group(2))
    if m.group(1) == 'loss':  # the non-finite terms are named
        assert re.search(r'\bloss\w*=(nan|inf)', m.group(3)), m.group(3)
    else:  # finite loss, weights broken by the update (caught at the checkpoint): named
        assert re.search(r'\d+ of \d+ state-dict tensors, e.g. backbone\.', m.group(3)), \
            m.group(3)
    assert float(m.group(4)) == 1000.0
    assert n < 6
    files = os.listdir(work)
    assert f'iter_{n}.pth' not in files, files  # the broken weights were not saved
    if n > 1:  # the last good checkpoint stays the resume point
        assert osp.basename(read_last_checkpoint(work)) == f'iter_{n - 1}.pth'
        good = torch.load(work / f'iter_{n - 1}.pth', map_location='cpu', weights_only=True)
        assert all(torch.isfinite(v).all() for v in good['state_dict'].values()
                   if v.is_floating_point())


# --------------------------------------------------------------------------- 2. rotation, disk full
@pytest.mark.slow
def test_disk_full_during_rotation_keeps_the_last_good_checkpoint(toy_data, tmp_path, monkeypatch,
                                                                  capsys):
    """max_keep_ckpts=1: mmengine deletes iter_1.pth before writing iter_2.pth; the write fails with
    ENOSPC (a failing writer). iter_1.pth must survive, last_checkpoint must name it, and the error
    is one line naming the work dir, the bytes needed and the bytes free."""
    from mmengine.fileio.backends import LocalBackend
    real_put = LocalBackend.put

    def disk_full_at_iter_2(self, obj, filepath):
        if 'iter_2' in str(filepath):
            with open(filepath, 'wb') as f:
                f.write(obj[:1000])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_put(self, obj, filepath)

    monkeypatch.setattr(LocalBackend, 'put', disk_full_at_iter_2)
    work = tmp_path / 'work'
    rc = train_tool.main([SEG_CFG, '--work-dir', str(work), '--cfg-options', *toy_seg_options(
        toy_data, 'train_cfg.max_iters=3', 'default_hooks.checkpoint.interval=1',
        'default_hooks.checkpoint.max_keep_ckpts=1',
        'default_hooks.checkpoint.save_optimizer=False',
        'experiment_name=disk_full')])
    err = capsys.readouterr().err
    assert rc == 2
    line = [ln for ln in err.splitlines() if ln.startswith('tools/train.py: error:')]
    assert len(line) == 1 and err.strip().splitlines()[-1] == line[0], err[-2000:]  # one line, last
    assert 'iter_2.pth' in line[0] and f'work dir {work}' in line[0]
    assert 'No space left on device' in line[0]
    assert re.search(r'needs [\d,]+ bytes, [\d,]+ bytes free', line[0]), line[0]
    files = os.listdir(work)
    assert 'iter_1.pth' in files and 'iter_2.pth' not in files, files
    assert not [f for f in files if '.tmp' in f], files
    last = read_last_checkpoint(work)
    assert osp.isfile(last) and last.endswith('iter_1.pth')
    assert latest_intact_checkpoint(str(work)).endswith('iter_1.pth')


# --------------------------------------------------------------------------- 3. a missing _base_
def test_missing_base_file_is_named_with_both_paths(tmp_path, capsys):
    from mmengine.config import Config

    from mmlinattn.training.cli import load_config
    from mmlinattn.training.config import ConfigError
    (tmp_path / 'inner.py').write_text("_base_ = ['./no_such_base.py']\nx = 1\n")
    outer = tmp_path / 'outer.py'
    outer.write_text("_base_ = ['./inner.py']\ndefault_scope = 'mmseg'\n")
    with pytest.raises(FileNotFoundError):  # mmengine alone: the resolved path only, deep down
        Config.fromfile(str(outer))
    with pytest.raises(ConfigError) as e:
        load_config(str(outer))
    msg = str(e.value)
    assert msg.startswith(f'{tmp_path / "inner.py"}: _base_ entry ' + "'./no_such_base.py' not "
                          "found")
    assert str(tmp_path / 'no_such_base.py') in msg
    rc = train_tool.main([str(outer), '--work-dir', str(tmp_path / 'w')])
    assert rc == 2 and 'no_such_base.py' in capsys.readouterr().err
