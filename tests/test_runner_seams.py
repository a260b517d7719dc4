"""The run layer at mmengine's own seams, in-process: ``LinAttnRunner``'s checks run in
``build_train_loop`` / ``build_test_loop`` (before a loop builds its dataloader), the safety hooks
are the runtime's ``custom_hooks`` (put back, with one log line, where a child config's own list
dropped them), and mmengine's plain Runner (``runner_type='Runner'``, what mmseg 1.2.2's test.py
builds) runs the same hooks and says in one line what it leaves off."""
import ast
import os
import os.path as osp

import pytest
from mmengine.config import Config

from helpers import TOY_SEG_64, work_dir_files

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
SAFETY = ('NonFiniteLossHook', 'PreemptionHook', 'RunChecksHook')


def _cfg(toy_data, tmp_path, name, *options):
    cfg = Config.fromfile(SEG_CFG)
    opts = {f'{k}_dataloader.dataset.data_root': f'{toy_data}/toy_ade'
            for k in ('train', 'val', 'test')}
    for item in TOY_SEG_64 + list(options):
        key, value = item.split('=', 1)
        opts[key] = ast.literal_eval(value) if value[:1] in '([{0123456789-' else value
    cfg.merge_from_dict(opts)
    cfg.work_dir = str(tmp_path / 'work')
    cfg.experiment_name = name  # a logger and visualizer of its own in this process
    cfg.train_cfg.max_iters, cfg.train_cfg.val_interval = 2, 1000
    cfg.train_dataloader.batch_size = 2
    return cfg


def _log(runner) -> str:
    with open(osp.join(runner.log_dir, f'{runner.timestamp}.log')) as f:
        return f.read()


def test_the_checks_run_before_the_loop_builds_its_dataloader(toy_data, tmp_path, monkeypatch):
    """A missing data folder stops train() at build_train_loop, naming its config key and path:
    no dataloader was built, and the work dir holds nothing but mmengine's log folder (no config
    dump)."""
    from mmengine.registry import RUNNERS

    from mmlinattn.training.config import ConfigError
    from mmlinattn.training.runner import LinAttnRunner
    built = []
    real = LinAttnRunner.build_dataloader
    monkeypatch.setattr(LinAttnRunner, 'build_dataloader',
                        staticmethod(lambda *a, **k: built.append(1) or real(*a, **k)))
    nowhere = tmp_path / 'nowhere'
    cfg = _cfg(toy_data, tmp_path, 'seams_missing', f'train_dataloader.dataset.data_root={nowhere}')
    runner = RUNNERS.build(cfg)
    assert type(runner) is LinAttnRunner
    with pytest.raises(ConfigError, match='dataset paths do not exist') as e:
        runner.train()
    assert e.value.code == 2 and built == []
    assert 'train_dataloader.dataset.data_root' in str(e.value) and str(nowhere) in str(e.value)
    assert work_dir_files(cfg.work_dir) == {}


def test_a_child_list_that_drops_the_safety_hooks_gets_them_back_in_one_line(toy_data,
                                                                          tmp_path):
    from mmengine.hooks import EmptyCacheHook
    from mmengine.registry import RUNNERS
    cfg = _cfg(toy_data, tmp_path, 'seams_child_hooks')
    cfg.custom_hooks = [dict(type='EmptyCacheHook'), dict(type='NonFiniteLossHook', interval=0)]
    runner = RUNNERS.build(cfg)
    names = [type(h).__name__ for h in runner.hooks]
    assert all(n in names for n in SAFETY) and EmptyCacheHook.__name__ in names, names
    (check,) = [h for h in runner.hooks if type(h).__name__ == 'NonFiniteLossHook']
    assert check.interval == 0  # the child's own setting is kept
    lines = [ln for ln in _log(runner).splitlines() if 'custom_hooks lacks' in ln]
    assert len(lines) == 1 and 'PreemptionHook, RunChecksHook' in lines[0], lines
    assert 'NonFiniteLossHook' not in lines[0]


def test_a_plain_runner_says_what_is_off_and_still_stops_on_a_non_finite_loss(toy_data,
                                                                               tmp_path):
    """runner_type='Runner' (mmengine's own) on a config of ours with a diverging loss: the
    runtime's hooks are there, so the run stops in one line (exit 2) at the first non-finite
    iteration and writes no checkpoint of the broken weights; one log line names what that Runner
    leaves off."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    from mmlinattn.training.hooks import NonFiniteLossError
    cfg = _cfg(toy_data, tmp_path, 'seams_plain', 'optim_wrapper.optimizer.lr=1e12',
               'default_hooks.checkpoint.interval=1')
    cfg.runner_type = 'Runner'
    cfg.train_cfg.max_iters = 6
    runner = RUNNERS.build(cfg)
    assert type(runner) is Runner
    with pytest.raises(NonFiniteLossError) as e:
        runner.train()
    assert e.value.code == 2
    off = [ln for ln in _log(runner).splitlines() if 'is not LinAttnRunner' in ln]
    assert len(off) == 1 and 'the work dir\'s lock' in off[0], off
    import torch

    from mmlinattn.training.hooks import non_finite_tensors
    for name in work_dir_files(cfg.work_dir):
        if name.endswith('.pth'):
            state = torch.load(osp.join(cfg.work_dir, name), weights_only=False)['state_dict']
            assert non_finite_tensors(state)[1] == 0, name  # no broken weights saved


def test_a_finished_runs_logger_writes_to_the_stream_of_now(toy_data, tmp_path, capsys):
    """The stream a run's logger started with (a notebook cell's, a test's capture) is closed when
    a later line of that logger comes (mmengine's current logger, an earlier run's): the line goes
    to the process's stdout of now, not to 'Logging error' on a closed stream."""
    import io
    import sys

    from mmengine.registry import RUNNERS
    first = io.StringIO()
    real = sys.stdout
    sys.stdout = first
    try:
        runner = RUNNERS.build(_cfg(toy_data, tmp_path, 'seams_streams'))
    finally:
        sys.stdout = real
    first.close()
    runner.logger.info('a line after the run')
    captured = capsys.readouterr()
    assert 'a line after the run' in captured.out
    assert 'Logging error' not in captured.err


@pytest.mark.parametrize('fixes', [False, True], ids=['mmlinattn-only', 'with-upstream-fixes'])
def test_the_upstream_fixes_hint_comes_when_the_model_is_built(fixes):
    """A user's config with custom_imports=['mmlinattn'] only, on a torch that loads weights-only
    by default: building the backbone (before any checkpoint is written) logs one line naming
    mmlinattn.upstream_fixes; with it imported, nothing. A fresh interpreter: the suite imports
    the fixes."""
    import subprocess
    import sys

    import torch
    code = ('import mmlinattn\n' + ('import mmlinattn.upstream_fixes\n' if fixes else '') +
            'from mmlinattn.core.models import MAViT\n'
            "MAViT(arch=dict(embed_dims=[8, 8, 8, 8], depths=[1, 1, 1, 1], num_heads=[1] * 4))\n"
            "MAViT(arch=dict(embed_dims=[8, 8, 8, 8], depths=[1, 1, 1, 1], num_heads=[1] * 4))\n")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, MMLINATTN_UPSTREAM_FIXES='1'))
    assert r.returncode == 0, r.stderr[-2000:]
    said = (r.stdout + r.stderr).count("add 'mmlinattn.upstream_fixes' to the config's "
                                       'custom_imports')
    # torch >= 2.6 loads weights-only by default (the oracle: torch.load's own default)
    import inspect
    default = inspect.signature(torch.load).parameters['weights_only'].default
    weights_only = default is not False  # None from 2.6 on: weights-only unless the env says not
    assert said == (1 if weights_only and not fixes else 0), r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.parametrize('key, value, said', [
    ('optim_wrapper.optimizer.lr', '6e-4x',
     "optim_wrapper.optimizer.lr='6e-4x': a learning rate must be a number"),
    ('train_dataloader', None,
     'train_dataloader=None but train_cfg, optim_wrapper set: a training needs all three'),
], ids=['lr-not-a-number', 'no-train-dataloader'])
def test_a_training_config_mmengine_would_fail_deep_in_is_one_line(key, value, said, toy_data,
                                                                    tmp_path, capsys):
    """Each passed every check (a config file's value, under any tool: mmdet's own train.py
    here is RUNNERS.build(cfg).train()) and failed inside mmengine with a ValueError traceback
    (the optimizer's constructor; the Runner's constructor): one line naming the key, exit 2."""
    from mmengine.registry import RUNNERS
    cfg = _cfg(toy_data, tmp_path, f'seams_deep_{key.split(".")[0]}')
    cfg.merge_from_dict({key: value})
    with pytest.raises(SystemExit) as e:
        RUNNERS.build(cfg).train()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ': error: ' in ln]
    assert e.value.code == 2 and len(err) == 1 and said in err[0], err


@pytest.mark.parametrize('key', ['check_non_finite', 'preemption_signals'])
def test_a_key_removed_in_0_4_is_one_line_naming_the_hook_to_write(key, toy_data, tmp_path,
                                                                   capsys):
    """0.3.0's switches: nothing reads them now, so a config that sets one would get the hook it
    meant to turn off; one line names the custom_hooks entry instead."""
    from mmengine.registry import RUNNERS
    cfg = _cfg(toy_data, tmp_path, f'seams_{key}')
    cfg[key] = False if key == 'check_non_finite' else []
    with pytest.raises(SystemExit) as e:
        RUNNERS.build(cfg)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ': error: ' in ln]
    assert e.value.code == 2 and len(err) == 1 and 'removed in 0.4.0' in err[0], err
    assert ('NonFiniteLossHook' if key == 'check_non_finite' else 'PreemptionHook') in err[0]


def test_a_safety_hook_named_by_its_class_or_given_built_is_not_added_twice():
    """custom_hooks may name a hook by its class (a pure-Python config) or hold a built hook, as
    mmengine's register_hook takes them: that hook is there, and none is added beside it."""
    from mmengine.config import ConfigDict

    from mmlinattn.training.hooks import NonFiniteLossHook, PreemptionHook
    from mmlinattn.training.runner import add_safety_hooks
    cfg = ConfigDict(custom_hooks=[dict(type=NonFiniteLossHook, interval=0),
                                   PreemptionHook(signals=[], ctrl_c=False)])
    assert add_safety_hooks(cfg) == ['RunChecksHook']
    assert len(cfg.custom_hooks) == 3
