"""The edges of a run: a checkpoint without class names in the inferencers and tools/image_demo.py,
a second Ctrl-C during training (stops at once), a work dir that cannot be written, and the
preemption checkpoint counted in ``max_keep_ckpts``. On data and checkpoints the
tests make (the toy sets, freshly built models)."""
import errno
import os
import os.path as osp
import re
import signal
import time
import warnings

import pytest
import torch
from mmengine.config import Config

from tools import train as train_tool

from helpers import (
    assert_resumed_from,
    read_last_checkpoint,
    signal_after_iter,
    toy_seg_options,
    train_resumed,
)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
ADE_CFG = osp.join(ROOT, 'configs/mavit/fpn_mavit-t_80k_ade20k-512x512.py')
DET_CFG = osp.join(ROOT, 'configs/toy/retinanet_mavit-t_fpn_toy-coco.py')


def _iter_files(work):
    return sorted((f for f in os.listdir(work) if re.fullmatch(r'iter_\d+\.pth', f)),
                  key=lambda f: int(f[5:-4]))


# ------------------------------------------------------- 1. a checkpoint without dataset_meta
def _build(cfg):
    import importlib

    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    registry = importlib.import_module(cfg.default_scope + '.registry')
    torch.manual_seed(0)
    return registry.MODELS.build(cfg.model).eval()


def _image(path, h=96, w=128):
    import cv2
    import numpy as np
    img = np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)
    cv2.imwrite(str(path), img)
    return str(path)


def _records(caught, text):
    return [str(w.message) for w in caught if text in str(w.message)]


def test_image_demo_seg_checkpoint_without_dataset_meta_uses_the_configs_classes(tmp_path, capsys):
    """The ADE20K Semantic FPN (150 classes) with a checkpoint holding weights only, as the authors'
    and converted files do: mmseg's inferencer would fall back to Cityscapes' 19 classes and
    image_demo would fail on the first pixel of class >= 19. Its classifier bias makes every pixel
    class 149, so that failure is certain; the names must be ADE20K's (mmseg's ADE20KDataset)."""
    import json

    from mmseg.datasets import ADE20KDataset

    from tools import image_demo
    config = tmp_path / 'ade_small.py'  # the real config, its test resize at 128 px
    config.write_text(
        f"_base_ = [{ADE_CFG!r}]\n"
        "test_dataloader = dict(dataset=dict(pipeline=[dict(type='LoadImageFromFile'), "
        "dict(type='Resize', scale=(128, 128), keep_ratio=True), dict(type='PackSegInputs')]))\n")
    state = _build(Config.fromfile(str(config))).state_dict()
    state['decode_head.conv_seg.bias'][:] = 0
    state['decode_head.conv_seg.bias'][149] = 100.0
    ckpt = tmp_path / 'weights_only.pth'
    torch.save({'state_dict': state}, ckpt)
    image = _image(tmp_path / 'a.png')
    out = tmp_path / 'out'
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        rc = image_demo.main([image, str(config), str(ckpt), '--out-dir', str(out)])
    assert rc == 0, capsys.readouterr().err[-2000:]
    classes = list(ADE20KDataset.METAINFO['classes'])
    with open(out / 'preds' / 'a.json') as f:
        pred = json.load(f)
    assert pred['classes'] == classes
    assert pred['pixels'] == {classes[149]: 96 * 128}
    said = _records(caught, 'dataset_meta')
    assert len(said) == 1, said  # ours only, not mmseg's Cityscapes one
    assert str(ckpt) in said[0] and '150 classes' in said[0] and 'ADE20KDataset' in said[0], said


def test_image_demo_refuses_images_whose_predictions_share_a_name(tmp_path, capsys):
    """x.jpg and x.png both write preds/x.json (mmdet's naming): refused before any work, listing
    both; with --no-save-pred (nothing named by stem) the check does not apply."""
    from tools import image_demo
    folder = tmp_path / 'imgs'
    folder.mkdir()
    for name in ('x.jpg', 'x.png', 'y.png'):
        _image(folder / name)
    out = tmp_path / 'out'
    rc = image_demo.main([str(folder), SEG_CFG, str(tmp_path / 'none.pth'), '--out-dir', str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and 'x.jpg, x.png' in err[0] and 'y.png' not in err[0], err
    assert not out.exists()
    rc = image_demo.main([str(folder), SEG_CFG, str(tmp_path / 'none.pth'), '--out-dir', str(out),
                          '--no-save-pred'])
    assert rc == 2 and 'checkpoint not found' in capsys.readouterr().err  # the next check


@pytest.mark.parametrize('device, gpus, said', [
    ('cuda', 0, 'torch sees no CUDA GPU here'),
    ('cuda:0', 0, 'torch sees no CUDA GPU here'),
    ('cuda:3', 1, 'torch sees 1 CUDA GPU(s), cuda:0 ... cuda:0'),
    ('gpu', 0, 'not a device name torch knows'),
])
def test_image_demo_refuses_a_device_it_cannot_use_before_any_work(device, gpus, said, tmp_path,
                                                                   monkeypatch, capsys):
    """--device cuda on a machine where torch sees no GPU (or an index past the last GPU, or a
    name torch does not know): one line naming the flag, its value and what to use, exit 2, before
    the image, config or checkpoint is read (none of them exists here). Was: a traceback from the
    inferencer after reading all of them."""
    from tools import image_demo
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: gpus)
    out = tmp_path / 'out'
    rc = image_demo.main([str(tmp_path / 'none.jpg'), str(tmp_path / 'none.py'),
                          str(tmp_path / 'none.pth'), '--device', device, '--out-dir', str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f'image_demo.py: error: --device {device}: {said}'), err
    if gpus == 0 and device != 'gpu':
        assert '--device cpu' in err[0]
    assert not out.exists()


@pytest.mark.parametrize('with_meta', [False, True])
def test_det_inferencer_classes_from_the_config_when_the_checkpoint_has_none(tmp_path, with_meta):
    """DetInferencer with a checkpoint without dataset_meta: the toy COCO's three classes and
    palette (the config's metainfo), not COCO's 80; one warning. A checkpoint with dataset_meta
    keeps its own, with no warning."""
    from mmlinattn.apis.inference import build_inferencer
    cfg = Config.fromfile(DET_CFG)
    want = cfg.test_dataloader.dataset.metainfo
    ckpt = tmp_path / 'det.pth'
    saved = dict(state_dict=_build(cfg).state_dict())
    own = dict(classes=['a', 'b', 'c'], palette=[(1, 2, 3), (4, 5, 6), (7, 8, 9)])
    if with_meta:
        saved['meta'] = dict(dataset_meta=own)
    torch.save(saved, ckpt)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        inferencer = build_inferencer(DET_CFG, str(ckpt))
    said = _records(caught, 'dataset_meta')
    meta = inferencer.model.dataset_meta
    if with_meta:
        assert list(meta['classes']) == own['classes'] and not said, said
        return
    assert list(meta['classes']) == list(want['classes'])
    assert [tuple(p) for p in meta['palette']] == [tuple(p) for p in want['palette']]
    assert inferencer.visualizer.dataset_meta['classes'] == meta['classes']
    assert len(said) == 1 and '3 classes' in said[0] and str(ckpt) in said[0], said


# ------------------------------------------------------------------ 2. a second Ctrl-C
# (a first Ctrl-C during training, and the resume after it: test_stop_and_resume.py)
def test_second_ctrl_c_stops_at_once(capfd):
    """Real SIGINTs to this process: the first sets the stop and says so; the second, while the stop
    is pending, raises KeyboardInterrupt at once; Python's own handler is back afterwards."""
    from mmengine.logging import MessageHub, MMLogger

    from mmlinattn.training.hooks import PreemptionHook

    class Runner:  # what before_train reads
        message_hub = MessageHub.get_current_instance()
        logger = MMLogger.get_current_instance()
    before = signal.getsignal(signal.SIGINT)
    hook = PreemptionHook(signals=['SIGTERM'])
    hook.before_train(Runner())
    try:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here
        except KeyboardInterrupt:
            pytest.fail('the first Ctrl-C raised KeyboardInterrupt instead of a pending stop')
        assert hook.received == 'SIGINT'
        assert 'press Ctrl-C again to stop at once' in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        hook.after_train(None)
        signal.signal(signal.SIGINT, before)


# ----------------------------------------------------------------- 3. an unwritable work dir
def test_unwritable_work_dir_is_one_line_before_the_runner(toy_data, tmp_path, capsys, monkeypatch):
    """A work dir under a regular file cannot be created, also as root (ENOTDIR): one line naming
    it and the reason, exit code 2, before mmengine's Runner is built (its OSError traceback). The
    check is LinAttnRunner.from_cfg's, which every tool's run goes through."""
    import mmengine.runner
    blocker = tmp_path / 'file'
    blocker.write_text('a file, not a folder')
    work = blocker / 'sub' / 'work'
    built = []

    def from_cfg(cls, cfg):
        built.append(cfg)
        raise RuntimeError('the Runner was built')
    monkeypatch.setattr(mmengine.runner.Runner, 'from_cfg', classmethod(from_cfg))
    rc = train_tool.main([SEG_CFG, '--work-dir', str(work), '--cfg-options',
                          *toy_seg_options(toy_data)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and not built, err
    line = [ln for ln in err if ln.startswith('tools/train.py: error: ')]
    assert len(line) == 1 and line[0] == err[-1], err
    assert line[0].startswith(f'tools/train.py: error: work dir {work} cannot be created: '), line
    assert f'{blocker} is a file' in line[0] and os.strerror(errno.ENOTDIR) in line[0], line


@pytest.mark.parametrize('code', [errno.EROFS, errno.EACCES])
def test_work_dir_on_a_read_only_or_forbidden_folder(tmp_path, monkeypatch, code):
    """A read-only file system / no permission (as root neither stops a write here, so the folder
    creation the check tries is made to fail with that errno): the message names the work dir, the
    folder tried and the reason."""
    from mmlinattn.training.config import ConfigError
    from mmlinattn.training.runs import check_work_dir
    work = tmp_path / 'new' / 'work'

    def mkdir(path, mode=0o777):
        raise OSError(code, os.strerror(code), path)
    monkeypatch.setattr(os, 'mkdir', mkdir)
    with pytest.raises(ConfigError) as e:
        check_work_dir(str(work))
    assert str(e.value).startswith(f'work dir {work} is not writable: {os.strerror(code)} ')
    assert f'in {tmp_path}' in str(e.value)


@pytest.mark.skipif(os.geteuid() == 0, reason='root writes into a chmod 0o500 folder')
def test_work_dir_in_a_folder_without_write_permission(tmp_path):
    from mmlinattn.training.config import ConfigError
    from mmlinattn.training.runs import check_work_dir
    locked = tmp_path / 'locked'
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match=os.strerror(errno.EACCES)):
            check_work_dir(str(locked / 'work'))
    finally:
        locked.chmod(0o700)


def test_writable_work_dir_passes_and_leaves_nothing(tmp_path):
    from mmlinattn.training.runs import check_work_dir
    check_work_dir(str(tmp_path / 'a' / 'b'))
    check_work_dir(str(tmp_path))
    assert os.listdir(tmp_path) == []


# ---------------------------------------------- 4. the preemption checkpoint in max_keep_ckpts
def test_ctrl_c_during_validation_stops_the_validation_there(toy_data, tmp_path, capfd):
    """A real SIGINT during the first batch of the validation after iteration 2: the line says the
    validation stops, and it does after that batch (not the whole validation, then one more
    training iteration); the checkpoint of iteration 2 is the resume point; exit code 130."""
    from mmengine.hooks import Hook
    from mmengine.registry import RUNNERS

    from mmlinattn.training.hooks import Interrupted
    seen = {'val': 0, 'train': 0}

    class CtrlCInValidation(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            seen['train'] += 1

        def before_val_iter(self, runner, batch_idx, data_batch=None):
            seen['val'] += 1
            if seen['val'] == 1:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs here

    work = tmp_path / 'work'
    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(work), '--cfg-options',
                                  *toy_seg_options(toy_data, 'default_hooks.checkpoint.interval=2',
                                                   'train_cfg.val_interval=2',
                                                   'train_cfg.max_iters=4')])
    cfg = train_tool.build_cfg(args)
    cfg.experiment_name = 'edges_ctrl_c_in_val'
    runner = RUNNERS.build(cfg)
    runner.register_hook(CtrlCInValidation(), priority='NORMAL')
    with pytest.raises(Interrupted, match=r'SIGINT \(Ctrl-C\) received: stopped the validation '
                                          r'after iteration 2, saved .*iter_2\.pth') as e:
        runner.train()
    assert e.value.exit_code == 130
    assert 'stopping the validation after this batch' in capfd.readouterr().err
    assert seen == {'val': 1, 'train': 2}  # no more validation batches, no iteration 3
    assert read_last_checkpoint(work) == str(work / 'iter_2.pth')


# 3 + 1 toy iterations in two runs
def test_preemption_checkpoint_counts_in_max_keep_ckpts_and_resume_continues(toy_data, tmp_path):
    """CheckpointHook every 2 iterations keeping 1; SIGTERM during iteration 3 (sent by a hook of
    this test, so the iteration is certain): mmengine's rotation alone would keep iter_2 beside
    it, so the iter_3 of the preemption must replace iter_2. The resumed run starts at 3 and
    rotates on (iter_4 replaces iter_3)."""
    from mmengine.registry import RUNNERS

    from mmlinattn.training.hooks import Preempted
    work = tmp_path / 'work'
    opts = toy_seg_options(toy_data, 'default_hooks.checkpoint.interval=2',
                           'default_hooks.checkpoint.max_keep_ckpts=1')

    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(work), '--cfg-options', *opts,
                                  'train_cfg.max_iters=20'])
    cfg = train_tool.build_cfg(args)
    cfg.experiment_name = 'edges_preempted'
    runner = RUNNERS.build(cfg)
    runner.register_hook(signal_after_iter(3), priority='NORMAL')
    with pytest.raises(Preempted, match='SIGTERM received: finished iteration 3') as e:
        runner.train()
    assert e.value.code == os.EX_TEMPFAIL  # 75: a scheduler requeues the job
    assert _iter_files(work) == ['iter_3.pth']
    assert read_last_checkpoint(work) == str(work / 'iter_3.pth')

    # our own file; torch 2.1 cannot read mmengine's HistoryBuffer weights-only (no safe globals)
    saved = torch.load(work / 'iter_3.pth', map_location='cpu', weights_only=False)
    assert saved['meta']['iter'] == 3
    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(work), '--resume', '--cfg-options',
                                  *opts, 'train_cfg.max_iters=4'])
    cfg = train_tool.build_cfg(args)
    cfg.experiment_name = 'edges_resumed'
    _, captured = train_resumed(cfg)
    assert captured['iter'] == 3
    assert_resumed_from(captured, saved)
    assert _iter_files(work) == ['iter_4.pth']  # iter_3 rotated out on the way
    assert read_last_checkpoint(work) == str(work / 'iter_4.pth')
    # in one process (a notebook, a script): a finished training gives the work dir's lock back
    from mmlinattn.training.workdir_lock import LOCK_NAME
    assert not (work / LOCK_NAME).exists()


# about 12 s (idle 2-core CPU): 3 + 2 toy iterations in two runs
def test_mid_epoch_preemption_checkpoint_is_removed_after_the_next_epoch_checkpoint(toy_data,
                                                                                   tmp_path):
    """Epoch-based loop, CheckpointHook by epoch keeping 1: SIGTERM in the first iteration of epoch
    2 writes iter_3.pth beside epoch_1.pth; the resumed run repeats epoch 2 and, once epoch_2.pth is
    written (epoch_1 rotated out by mmengine), removes iter_3.pth: one file again."""
    from mmengine.registry import RUNNERS

    from mmlinattn.training.hooks import Preempted
    work = tmp_path / 'work'

    def run(name, resume, hook=None):
        argv = [SEG_CFG, '--work-dir', str(work)] + (['--resume'] if resume else []) + [
            '--cfg-options', *toy_seg_options(toy_data, 'default_hooks.checkpoint.by_epoch=True',
                                       'default_hooks.checkpoint.interval=1',
                                       'default_hooks.checkpoint.max_keep_ckpts=1')]
        cfg = train_tool.build_cfg(train_tool.parse_args(argv))
        cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=2, val_interval=1000)
        cfg.train_dataloader.sampler = dict(type='DefaultSampler', shuffle=True)
        cfg.experiment_name = name
        runner = RUNNERS.build(cfg)
        if hook:
            runner.register_hook(hook, priority='NORMAL')
        runner.train()

    with pytest.raises(Preempted, match='finished iteration 3'):
        run('edges_epoch_preempted', False, signal_after_iter(3))
    assert sorted(f for f in os.listdir(work) if f.endswith('.pth')) == ['epoch_1.pth',
                                                                         'iter_3.pth']
    assert read_last_checkpoint(work) == str(work / 'iter_3.pth')
    run('edges_epoch_resumed', True)
    assert sorted(f for f in os.listdir(work) if f.endswith('.pth')) == ['epoch_2.pth']


def test_second_run_in_one_process_gets_its_own_visualizer_and_logger(toy_data, tmp_path,
                                                                     monkeypatch):
    """mmengine hands back an existing visualizer when its name (``visualizer``) is taken, and an
    existing logger when its name (the config's name and the second the run started) is, so a
    second run in the same process wrote its scalars and drawings into the first run's folder, and
    one started in the same second logged into the first run's log file and streams (in the suite:
    an earlier test's closed capture, 'Logging error'). Each Runner we build now has its own of
    both, under its own work dir."""
    import mmengine.runner.runner as mmengine_runner
    from mmengine.registry import RUNNERS
    fixed = time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1))  # both runs start in one second
    monkeypatch.setattr(mmengine_runner.time, 'time', lambda: fixed)
    dirs = []
    for name in ('first', 'second'):
        work = tmp_path / name
        args = train_tool.parse_args([SEG_CFG, '--work-dir', str(work), '--cfg-options',
                                      *toy_seg_options(toy_data), 'train_cfg.max_iters=1'])
        runner = RUNNERS.build(train_tool.build_cfg(args))
        dirs.append(runner.visualizer._vis_backends['LocalVisBackend']._save_dir)
        runner.logger.info(f'a line of the {name} run')
    assert dirs[0].startswith(str(tmp_path / 'first')), dirs
    assert dirs[1].startswith(str(tmp_path / 'second')), dirs
    for name, other in (('first', 'second'), ('second', 'first')):
        log = (tmp_path / name / '20260102_030405' / '20260102_030405.log').read_text()
        assert f'a line of the {name} run' in log and f'a line of the {other} run' not in log, name
