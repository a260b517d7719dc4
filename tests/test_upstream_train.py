"""What remains of the toolboxes' own tools once each is shown to build our Runner from the
config it was given (tests/test_tools_build_our_runner.py; mim: tests/test_wheel.py): every flag
of theirs is one of ours; our test scores a checkpoint as mmengine's plain Runner does (what
mmseg 1.2.2's test.py builds); a checkpoint written without ``mmlinattn.upstream_fixes`` resumes
and tests. In-process, on the toy configs.

What makes the resume work on torch >= 2.6: the config's ``custom_imports`` lists
``mmlinattn.upstream_fixes`` (mmengine 0.10 cannot read its own checkpoints weights-only without
it): mmengine's HistoryBuffers in the checkpoint's message hub pickle only their data."""
import importlib
import os
import os.path as osp
import re

import pytest

from mmlinattn.training.runs import read_metrics
from tools import test as test_tool
from tools import train as train_tool

from helpers import make_toy_sets, toy_seg_options, work_dir_files

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
CLS_CFG = osp.join(ROOT, 'configs/toy/inline-pvt-t_toy-cls.py')


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('upstream_train')
    make_toy_sets(root, seed=3, size=64, train=4, val=2)
    from tools.misc import make_toy_datasets as toy
    toy.make_toy_cls(str(root / 'toy_cls'), seed=3, train=8, val=4, size=64)
    return root


def derived(data, out, task='seg'):
    """The toy config of ``task`` ('seg': Semantic FPN MAViT-T, 'cls': InLine-PVT-T) on this
    test's data, one short run (its checkpoint after 2 iterations / 1 epoch); mmengine merges
    these dicts into the base config's."""
    root = f'{data}/toy_{"ade" if task == "seg" else task}/'
    lines = [f'_base_ = {SEG_CFG if task == "seg" else CLS_CFG!r}',
             f'train_dataloader = dict(batch_size=2, dataset=dict(data_root={root!r}))',
             f'val_dataloader = dict(dataset=dict(data_root={root!r}))',
             f'test_dataloader = dict(dataset=dict(data_root={root!r}))']
    lines += (['train_cfg = dict(max_iters=2, val_interval=100)',
               'default_hooks = dict(checkpoint=dict(interval=2))'] if task == 'seg' else
              ['train_cfg = dict(max_epochs=1, val_interval=100)'])
    out.write_text('\n'.join(lines) + '\n')
    return str(out)


@pytest.mark.slow  # two tests of 2 toy images in-process: 5-10 s on 2 cores
def test_our_test_scores_as_mmengines_plain_runner(toy_data, toy_checkpoints, tmp_path):
    """tools/test.py (our Runner) and mmengine's plain Runner without us (``runner_type='Runner'``,
    no custom_hooks: the oracle) give the same metrics for one checkpoint: one model, each image
    alone through the same kernels on the same thread count, so the same sums; the tolerance only
    absorbs the rounding of the printed values."""
    from mmengine.runner import Runner
    opts = toy_seg_options(toy_data)
    ours = tmp_path / 'ours'
    assert test_tool.main([SEG_CFG, toy_checkpoints.seg, '--work-dir', str(ours),
                           '--cfg-options', *opts]) == 0
    cfg = test_tool.build_cfg(test_tool.parse_args(
        [SEG_CFG, toy_checkpoints.seg, '--work-dir', str(tmp_path / 'plain'), '--cfg-options',
         *opts]))
    cfg.runner_type, cfg.custom_hooks = 'Runner', []
    cfg.experiment_name = cfg.visualizer.name = f'plain_metrics_{tmp_path.name}'
    theirs = Runner.from_cfg(cfg).test()
    ours = read_metrics(str(ours))
    assert theirs and set(theirs) <= set(ours), (theirs, ours)
    for k, v in theirs.items():
        assert ours[k] == pytest.approx(float(v), abs=1e-4), (k, theirs, ours)


@pytest.mark.slow  # two 2-iteration trainings and a test in-process: 20-30 s on 2 cores
def test_checkpoints_written_without_our_fixes_resume_and_test(data, tmp_path, monkeypatch):
    """A work dir whose checkpoint was written without mmlinattn.upstream_fixes (as by a tool run on
    a config of the user's that lists only 'mmlinattn', or MMLINATTN_UPSTREAM_FIXES=0): its
    HistoryBuffers pickle their methods through builtins.getattr, which torch >= 2.6's weights-only
    loader refuses. tools/train.py --resume continues from it and tools/test.py scores it (was:
    UnpicklingError after the model was built; the resume pre-check had let it through)."""
    import importlib.util
    import inspect

    import torch
    from mmengine.logging.history_buffer import HistoryBuffer

    from mmlinattn.training import compat
    cfg = derived(data, tmp_path / 'cfg.py')
    work = tmp_path / 'work'
    # mmengine's own pickling of its HistoryBuffer (its module read afresh: the fix replaced the
    # class's __getstate__ in this process)
    spec = importlib.util.spec_from_file_location('_unfixed_history_buffer',
                                                  inspect.getfile(HistoryBuffer))
    unfixed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unfixed)
    with monkeypatch.context() as m:
        m.setattr(HistoryBuffer, '__getstate__', unfixed.HistoryBuffer.__getstate__)
        m.delattr(HistoryBuffer, '__setstate__', raising=False)
        assert train_tool.main([cfg, '--work-dir', str(work)]) == 0
    ckpt = work / 'iter_2.pth'
    if compat._torch_loads_weights_only_by_default():  # the file is of the kind torch refuses
        import pickle
        with pytest.raises(pickle.UnpicklingError, match='getattr'):
            torch.load(ckpt)
    assert train_tool.main([cfg, '--work-dir', str(work), '--resume', '--cfg-options',
                            'train_cfg.max_iters=4']) == 0
    assert (work / 'iter_4.pth').is_file()
    logs = sorted(d for d in os.listdir(work) if d[:2].isdigit())
    assert len(logs) == 2
    with open(work / logs[-1] / f'{logs[-1]}.log') as f:
        assert 'resumed' in f.read().lower()
    assert test_tool.main([cfg, str(ckpt), '--work-dir', str(tmp_path / 'test')]) == 0
    assert 'mIoU' in read_metrics(str(tmp_path / 'test'))


@pytest.mark.slow  # two one-epoch trainings of 8 images and a test, in-process: 15 s on 2 cores
def test_a_classifier_trains_resumes_and_tests(data, tmp_path):
    """The task no other test trains: the toy InLine-PVT-T classifier (mmpretrain's dataset,
    model and evaluator under our Runner's epoch-based run) trains an epoch, --resume continues
    from its checkpoint to the second, and tools/test.py scores it."""
    cfg = derived(data, tmp_path / 'cfg.py', 'cls')
    work = tmp_path / 'work'
    assert train_tool.main([cfg, '--work-dir', str(work)]) == 0
    assert (work / 'epoch_1.pth').is_file(), sorted(os.listdir(work))
    assert train_tool.main([cfg, '--work-dir', str(work), '--resume', '--cfg-options',
                            'train_cfg.max_epochs=2']) == 0
    logs = sorted(d for d in os.listdir(work) if d[:2].isdigit())
    with open(work / logs[-1] / f'{logs[-1]}.log') as f:
        assert re.search(r'resumed epoch', f.read()), logs
    assert (work / 'epoch_2.pth').is_file(), sorted(os.listdir(work))
    assert test_tool.main([cfg, str(work / 'epoch_2.pth'), '--work-dir',
                           str(tmp_path / 'test')]) == 0
    assert 'accuracy/top1' in read_metrics(str(tmp_path / 'test'))


def test_a_failed_resume_leaves_the_work_dir_as_it_was(data, tmp_path, capsys):
    """--resume FILE with a truncated file stops in one line, and the work dir holds what it held
    (mmengine's log folder of the refused run aside: its log says why)."""
    cfg = derived(data, tmp_path / 'cfg.py')
    work = tmp_path / 'work'
    work.mkdir()
    bad = work / 'iter_2.pth'
    bad.write_bytes(b'PK\x03\x04 truncated')
    assert train_tool.main([cfg, '--work-dir', str(work), '--resume', str(bad)]) == 2
    assert 'iter_2.pth' in capsys.readouterr().err
    assert list(work_dir_files(work)) == ['iter_2.pth']  # and mmengine's log folder


@pytest.mark.parametrize('script', ['train', 'test'])
@pytest.mark.parametrize('pkg', ['mmdet', 'mmseg', 'mmpretrain'])
def test_our_tools_take_every_flag_the_upstream_tools_take(pkg, script, capsys):
    """Each ``--flag`` that the toolbox's own tools/SCRIPT.py defines (read from its source: the
    oracle) is in ours, so a command line written for theirs runs ours."""
    import ast
    source = osp.join(osp.dirname(importlib.import_module(pkg).__file__), '.mim', 'tools',
                      f'{script}.py')
    theirs = {a.value for node in ast.walk(ast.parse(open(source).read()))
              if isinstance(node, ast.Call) and getattr(node.func, 'attr', '') == 'add_argument'
              for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith('--')}
    assert '--cfg-options' in theirs and '--work-dir' in theirs  # the source was read
    tool = importlib.import_module(f'tools.{script}')
    with pytest.raises(SystemExit):
        tool.parse_args(['c.py', '--help'] if script == 'train' else ['c.py', 'w.pth', '--help'])
    ours = set(re.findall(r'(?<![\w-])--[\w-]+', capsys.readouterr().out))
    assert theirs <= ours, sorted(theirs - ours)


def test_mmpretrains_dataloader_flags_turn_the_options_off():
    cfg = train_tool.build_cfg(train_tool.parse_args([
        osp.join(ROOT, 'configs/toy/inline-pvt-t_toy-cls.py'), '--no-pin-memory',
        '--no-persistent-workers']))
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        assert cfg[loader].pin_memory is False and cfg[loader].persistent_workers is False
