"""Every tool that runs our configs builds our Runner from the config it was given: ours
(tools/train.py, tools/test.py) and mmdet's, mmseg's and mmpretrain's own train.py and test.py
(the copies their wheels carry under ``<pkg>/.mim/tools``, what ``mim train`` / ``mim test`` run;
mim itself: tests/test_wheel.py). Each runs, as a user runs it, from an empty folder with nothing
of ours on its path but the test-only probe (tests/probe_runner.py): ``--cfg-options
runner_type=probe_runner.ProbeRunner`` makes it a LinAttnRunner that records what it got when the
tool starts the run, and exits before any data is read. mmseg 1.2.2's test.py builds mmengine's
plain Runner whatever ``runner_type`` says: there the runtime's RunChecksHook runs (it says so in
one log line) and a hook of the probe records after it.

What a run then does is the Runner's, tested once in-process (tests/test_runner_seams.py,
test_one_run.py, test_workdir_lock.py, ...), whichever tool started it."""
import importlib
import json
import os
import os.path as osp
import shutil
import sys

import pytest
from mmengine.config import Config

import warm

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET = osp.join(ROOT, 'configs/toy/retinanet_mavit-t_fpn_toy-coco.py')
SEG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
CLS = osp.join(ROOT, 'configs/toy/inline-pvt-t_toy-cls.py')
#: --cfg-options that every case passes: the probe, and one value the config has otherwise
PROBE = 'runner_type=probe_runner.ProbeRunner'
INTERVAL = 'default_hooks.logger.interval=7'

# (tool: 'ours' or the toolbox whose own script it is, script, toy config of its task)
CASES = [('ours', 'train', SEG), ('ours', 'test', DET),
         ('mmdet', 'train', DET), ('mmdet', 'test', DET),
         ('mmseg', 'train', SEG), ('mmseg', 'test', SEG),
         ('mmpretrain', 'train', CLS), ('mmpretrain', 'test', CLS)]


def probe_path(tmp_path) -> str:
    """A folder holding the probe module alone (what the tool's PYTHONPATH gets)."""
    folder = tmp_path / 'probe'
    folder.mkdir()
    shutil.copy(osp.join(osp.dirname(osp.abspath(__file__)), 'probe_runner.py'), folder)
    return str(folder)


def script(tool, name) -> str:
    if tool == 'ours':
        return osp.join(ROOT, 'tools', f'{name}.py')
    return osp.join(osp.dirname(importlib.import_module(tool).__file__), '.mim', 'tools',
                    f'{name}.py')


def plain_runner_config(tmp_path) -> str:
    """The toy segmentation config with the probe's hook after the runtime's own hooks (mmseg's
    test.py builds the plain Runner, which never sees ``runner_type``)."""
    hooks = Config.fromfile(SEG).custom_hooks + [dict(type='probe_runner.ProbeHook')]
    path = tmp_path / 'seg_probe.py'
    path.write_text(f'_base_ = [{SEG!r}]\ncustom_hooks = {hooks!r}\n')
    return str(path)


@pytest.mark.parametrize('tool, name, config', CASES, ids=[f'{t}-{n}' for t, n, _ in CASES])
def test_the_tool_builds_our_runner_from_the_config_it_was_given(tool, name, config, tmp_path,
                                                                request):
    empty, work, out = tmp_path / 'empty', tmp_path / 'work', tmp_path / 'got.json'
    empty.mkdir()
    plain = (tool, name) == ('mmseg', 'test')
    opts = [PROBE, INTERVAL]
    if name == 'train':
        # --amp: every toolbox's train.py has it (ours refuses it on a CPU, before the Runner)
        flags = ['--resume'] + (['--amp'] if tool != 'ours' else [])
        args = [config, '--work-dir', work, *flags]
        checkpoint = None
    elif not plain:
        checkpoint = str(tmp_path / 'given.pth')  # not read: the probe stops before the load
        args = [config, checkpoint, '--work-dir', work]
    else:  # the plain Runner builds the test set, and RunChecksHook checks the checkpoint
        data, checkpoint = request.getfixturevalue('toy_data'), \
            request.getfixturevalue('toy_checkpoints').seg
        config = plain_runner_config(tmp_path)
        args = [config, checkpoint, '--work-dir', work]
        opts.append(f'test_dataloader.dataset.data_root={data}/toy_ade')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env.update(PYTHONPATH=probe_path(tmp_path), PROBE_RUNNER_OUT=str(out), MPLBACKEND='Agg')
    r = warm.run([sys.executable, script(tool, name), *args, '--cfg-options', *opts], cwd=empty,
                 env=env, timeout=600)
    assert r.returncode == 0 and out.is_file(), r.stdout[-3000:] + r.stderr[-3000:]
    assert 'Traceback' not in r.stderr, r.stderr[-3000:]
    got = json.loads(out.read_text())
    safety = ('NonFiniteLossHook', 'PreemptionHook', 'RunChecksHook')
    assert all(h in got['hooks'] for h in safety), got['hooks']
    assert got['work_dir'] == str(work) and got['launcher'] == 'none'
    assert got['cfg']['default_hooks']['logger']['interval'] == 7
    if plain:
        # mmengine's own Runner; the runtime's RunChecksHook ran before the probe's hook, and said
        # in one line what this Runner leaves off
        assert got['runner'] == ['Runner', 'object'] and got['run'] == 'before_run', got
        assert got['hooks'].index('RunChecksHook') < got['hooks'].index('ProbeHook')
        off = [ln for ln in r.stdout.splitlines() if 'Runner is not LinAttnRunner' in ln]
        assert len(off) == 1 and 'the checkpoint\'s checks run here' in off[0], r.stdout[-3000:]
    else:
        assert got['runner'][:3] == ['ProbeRunner', 'LinAttnRunner', 'Runner'], got['runner']
        assert got['run'] == name
    if name == 'train':  # --resume (no file): the newest checkpoint of the work dir
        assert got['resume'] is True and got['load_from'] is None, got
        if tool != 'ours':
            assert got['cfg']['optim_wrapper']['type'] == 'AmpOptimWrapper'
    else:
        assert got['load_from'] == checkpoint and not got['resume'], got
    assert not os.listdir(empty)  # nothing written where the tool was started


@pytest.mark.parametrize('tool', ['mmdet', 'mmseg'])
def test_a_refusal_under_a_toolboxs_own_tool_is_one_line_and_exit_2(tool, tmp_path):
    """Our Runner's refusal (here the probe's, raised as every check of ours raises it) inside
    another toolbox's train.py, in a fresh interpreter as a user starts it: one line naming that
    script, exit 2, no traceback."""
    empty = tmp_path / 'empty'
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env.update(PYTHONPATH=probe_path(tmp_path), PROBE_RUNNER_OUT=str(tmp_path / 'got.json'),
               PROBE_RUNNER_REFUSE='the probe refuses this run', MPLBACKEND='Agg')
    config = DET if tool == 'mmdet' else SEG
    r = warm.run([sys.executable, script(tool, 'train'), config, '--work-dir', tmp_path / 'work',
                  '--cfg-options', PROBE], cwd=empty, env=env, timeout=600, fresh=True)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ': error: ' in ln]
    assert errors == ['train.py: error: the probe refuses this run'], r.stderr[-3000:]
    assert 'Traceback' not in r.stderr, r.stderr[-3000:]
