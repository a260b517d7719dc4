"""Bad input and faults: clear errors, nothing lost (a preempted job: test_stop_and_resume.py)."""
import errno
import hashlib
import json
import os
import os.path as osp
import re

import pytest
import torch

from mmlinattn.core.weights import CheckpointError, read_checkpoint
from mmlinattn.training.config import ConfigError
from mmlinattn.training.preflight import check_coco_annotations
from mmlinattn.training.resume import latest_intact_checkpoint
from mmlinattn.training.runs import ToolFailed, run_script
from tools import train as train_tool
from tools.misc import make_toy_datasets as toy

from helpers import read_last_checkpoint, toy_seg_options

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
DET_CFG = osp.join(ROOT, 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py')


# -------------------- a tool that fails
def test_failing_tool_run_names_command_exit_code_and_the_end_of_its_output(tmp_path, capsys):
    script = tmp_path / 'tool.py'
    script.write_text('import sys\n'
                      'for i in range(50):\n    print(f"line {i}")\n'
                      'print("Epoch(val) [1] mIoU: 3.0")\n'
                      'raise SystemExit("tool: error: the data is missing")\n')
    log = tmp_path / 'logs' / 'tool.log'
    with pytest.raises(ToolFailed) as e:
        run_script(str(script), ['--x', 1], cwd=str(tmp_path), log=str(log), echo=('Epoch(val',),
                   tail=5)
    msg = str(e.value)
    assert e.value.returncode == 1
    assert msg.splitlines()[0].endswith(' tool.py --x 1')  # the command, the script relative to cwd
    assert 'exit code 1' in msg and str(log) in msg
    assert 'tool: error: the data is missing' in msg and 'line 48' in msg and 'line 40' not in msg
    out = capsys.readouterr().out
    assert out.startswith('$ ') and 'tool.py --x 1' in out
    assert '   Epoch(val) [1] mIoU: 3.0' in out and 'line 3\n' not in out  # only the echoed lines
    assert log.read_text().count('\n') == 52  # the whole output, stderr included, in order
    assert log.read_text().endswith('mIoU: 3.0\ntool: error: the data is missing\n')
    r = run_script(str(script), cwd=str(tmp_path), show=False, check=False)
    assert r.returncode == 1 and r.stdout.splitlines()[-1] == 'tool: error: the data is missing'


# -------------------- malformed COCO
def _coco(tmp_path, data):
    path = tmp_path / 'ann.json'
    path.write_text(json.dumps(data))
    return str(path)


def test_bad_records_are_reported_and_skipped(tmp_path):
    data = dict(images=[dict(id=1, file_name='a.jpg', width=64, height=64)],
                categories=[dict(id=1, name='x')],
                annotations=[
                    dict(id=7, image_id=1, category_id=1, bbox=[1, 1, 10, 10], area=100,
                         segmentation=[[1, 1, 5, 5]]),                      # 2-point polygon
                    dict(id=8, image_id=1, category_id=1, bbox=[3, 3, 0, 5], area=0,
                         segmentation=[[3, 3, 3, 8, 3, 3]]),                # zero-area box
                    dict(id=9, image_id=1, category_id=1, bbox=[1, 1, 10, 10], area=100,
                         segmentation=[[1, 1, 11, 1, 11, 11]])])            # fine
    warnings = check_coco_annotations(_coco(tmp_path, data))
    assert len(warnings) == 2
    assert 'annotation 7' in warnings[0] and 'fewer than 3 points' in warnings[0]
    assert 'annotation 8' in warnings[1] and 'zero area' in warnings[1]


def test_annotation_without_bbox_is_an_error(tmp_path):
    data = dict(images=[dict(id=1, file_name='a.jpg', width=64, height=64)],
                categories=[dict(id=1, name='x')],
                annotations=[dict(id=5, image_id=1, category_id=1)])
    with pytest.raises(ConfigError, match='annotation 5 has no "bbox"'):
        check_coco_annotations(_coco(tmp_path, data))


# -------------------- images
def test_missing_image_names_the_file(toy_data, tmp_path):
    """(An image that does not decode: test_data_faults.py.)"""
    import shutil

    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    root = tmp_path / 'toy_coco'
    shutil.copytree(toy_data / 'toy_coco', root)
    victim = root / 'train' / 'train_00000.jpg'
    victim.unlink()
    cfg = Config.fromfile(DET_CFG)
    init_default_scope('mmdet')
    from mmdet.registry import DATASETS
    ds_cfg = cfg.train_dataloader.dataset
    ds_cfg.data_root = str(root) + '/'
    ds = DATASETS.build(ds_cfg)
    from mmlinattn.training.datafaults import name_unreadable_files_in
    name_unreadable_files_in(ds)  # what the runner of our tools does to its datasets
    idx = next(i for i in range(len(ds))
               if ds.get_data_info(i)['img_path'].endswith('train_00000.jpg'))
    # mmcv's LoadImageFromFile raises FileNotFoundError: one message with the dataset key
    from mmlinattn.training.datafaults import DataFileError
    with pytest.raises(DataFileError, match=r'train_dataloader\.dataset \(CocoDataset, sample '
                       r'\d+\): cannot read the image .*train_00000\.jpg: file not found') as e:
        ds.prepare_data(idx)
    assert isinstance(e.value.__cause__, FileNotFoundError)


# -------------------- checkpoints
def test_untrusted_checkpoint_runs_no_code(tmp_path):
    marker = tmp_path / 'pwned'

    class Evil:
        def __reduce__(self):
            return (os.system, (f'touch {marker}',))
    path = tmp_path / 'evil.pth'
    torch.save({'model': {'w': torch.ones(1)}, 'payload': Evil()}, path)
    obj = read_checkpoint(str(path))
    assert not marker.exists()
    assert torch.equal(obj['model']['w'], torch.ones(1))
    assert 'system' in repr(obj['payload'])  # kept as an inert placeholder


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / 'x.pth'
    path.write_text('<html>403 Forbidden</html>')
    with pytest.raises(CheckpointError, match='x.pth is not a readable torch checkpoint'):
        read_checkpoint(str(path))


# -------------------- sizes
@pytest.mark.parametrize('hw', [(16, 16), (8, 24), (31, 9)])
def test_tiny_inputs_work(hw):
    from mmlinattn.core.models import InLinePVT, InLineSwin, MAViT
    for cls in (InLinePVT, InLineSwin, MAViT):
        # PVT v1 drops patch remainders (needs >= 32 px); pad_patches=True handles any size
        m = cls(arch='tiny', **(dict(pad_patches=True) if cls is InLinePVT else {})).eval()
        with torch.no_grad():
            outs = m(torch.randn(1, 3, *hw))
        assert all(torch.isfinite(o).all() and min(o.shape[-2:]) >= 1 for o in outs)


# -------------------- low precision
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_mala_training_with_vanishing_normaliser_stays_finite(dtype):
    """50 steps of an all-MALA MAViT under autocast on inputs that drive phi(q), phi(k) and the
    normaliser z towards 0 (very negative activations). --amp itself needs a GPU; this is the CPU
    equivalent of its numerics."""
    from mmlinattn.core.models import MAViT
    torch.manual_seed(0)
    m = MAViT(arch=dict(embed_dims=[32, 64, 64, 64], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1]),
              attn_type='MMMM', out_norm=True)
    m.init_weights()
    with torch.no_grad():  # push q and k far negative: ELU+1 -> ~exp(-40)
        for layer in m.layers:
            for blk in layer.blocks:
                c = blk.attn.dim
                blk.attn.qkvo.bias[:2 * c] = -40.0
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    m.train()
    # the first step's loss agrees with fp32 (stated tolerance: 2 % bf16, 0.5 % fp16)
    x = torch.randn(2, 3, 32, 32) * 5
    with torch.no_grad():
        ref = sum(o.square().mean() for o in m(x))
        with torch.autocast('cpu', dtype=dtype):
            low = sum(o.float().square().mean() for o in m(x))
    tol = {torch.bfloat16: 2e-2, torch.float16: 5e-3}[dtype]
    assert abs(low - ref) / ref < tol, (low.item(), ref.item())
    for _ in range(50):
        x = torch.randn(2, 3, 32, 32) * 5
        with torch.autocast('cpu', dtype=dtype):
            loss = sum(o.float().square().mean() for o in m(x))
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
        opt.step()


# -------------------- dataset generation
def _tree_hash(root):
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            p = osp.join(dirpath, f)
            h.update(osp.relpath(p, root).encode())
            with open(p, 'rb') as fh:
                h.update(fh.read())
    return h.hexdigest()


def test_interrupted_generation_rerun_is_complete_and_identical(tmp_path, monkeypatch):
    clean = tmp_path / 'clean'
    toy.make_toy_ade(str(clean), seed=5, train=6, val=3, size=48)
    calls = {'n': 0}
    real = toy._write_ade

    def crash_on_second_split(*a, **k):
        calls['n'] += 1
        if calls['n'] == 2:
            raise KeyboardInterrupt('simulated interrupt')
        return real(*a, **k)
    monkeypatch.setattr(toy, '_write_ade', crash_on_second_split)
    target = tmp_path / 'interrupted'
    with pytest.raises(KeyboardInterrupt):
        toy.make_toy_ade(str(target), seed=5, train=6, val=3, size=48)
    assert not target.exists()  # nothing half-written in place
    assert not [p for p in os.listdir(tmp_path) if p.startswith('.interrupted')]
    monkeypatch.setattr(toy, '_write_ade', real)
    toy.make_toy_ade(str(target), seed=5, train=6, val=3, size=48)
    assert toy.is_complete(str(target))
    assert _tree_hash(target) == _tree_hash(clean)


# -------------------- a diverging run
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


# -------------------- a checkpoint write failing while CheckpointHook rotates
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


# -------------------- a config whose _base_ is missing
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
