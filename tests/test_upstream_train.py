"""mmdet's, mmseg's and mmpretrain's own tools/train.py and tools/test.py (the copies their wheels
carry under ``<pkg>/.mim/tools``, what ``mim train`` / ``mim test`` run) train, resume and test a
toy config of every backbone family with nothing from us but the config's ``custom_imports``: no
PYTHONPATH, no import of ours in the process, run from an empty folder. The metrics of their
test.py equal ours (tools/test.py) on the same checkpoint.

What makes the resume work on torch >= 2.6: the config's ``custom_imports`` lists
``mmlinattn.upstream_fixes`` (mmengine 0.10 cannot read its own checkpoints weights-only without
it); the checkpoints are written by our SafeCheckpointHook, which the config names."""
import importlib
import os
import os.path as osp
import re
import sys

import pytest

from mmlinattn.training.runs import read_metrics
from tools import test as test_tool

import warm
from helpers import make_toy_sets, work_dir_files

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

#: the rest of the matrix: heavy in `make test`, run by `make test-compat` ('not heavy or upstream')
UPSTREAM_ALL = (pytest.mark.heavy, pytest.mark.upstream)
#: InLine-Swin-T in the toy Mask R-CNN (the toy set has no InLine-Swin detector of its own)
SWIN_DET = 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py+InLineSwin'

# (case, toolbox, toy config, task): every family and every toolbox in `make test` (MAViT in mmdet,
# InLine-Swin in mmseg, InLine-PVT in mmpretrain); a detector and a segmentor of every family with
# the rest (`make test-all`, `make test-compat`)
CASES = [
    ('mavit-mask-rcnn', 'mmdet', 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py', 'det'),
    pytest.param('inline-pvt-retinanet', 'mmdet',
                 'configs/toy/retinanet_inline-pvt-t_fpn_toy-coco.py', 'det', marks=UPSTREAM_ALL),
    ('inline-swin-upernet', 'mmseg', 'configs/toy/upernet_inline-swin-t_toy-ade.py', 'seg'),
    ('inline-pvt-cls', 'mmpretrain', 'configs/toy/inline-pvt-t_toy-cls.py', 'cls'),
    pytest.param('inline-swin-mask-rcnn', 'mmdet', SWIN_DET, 'det', marks=UPSTREAM_ALL),
    pytest.param('mavit-fpn', 'mmseg', 'configs/toy/fpn_mavit-t_toy-ade.py', 'seg',
                 marks=UPSTREAM_ALL),
    pytest.param('inline-pvt-fpn', 'mmseg', 'configs/toy/fpn_inline-pvt-t_toy-ade.py', 'seg',
                 marks=UPSTREAM_ALL),
]


def upstream(pkg, tool, cwd, *args):
    """``<pkg>/.mim/tools/<tool>.py ARGS`` in a fresh process in ``cwd``; combined output."""
    script = osp.join(osp.dirname(importlib.import_module(pkg).__file__), '.mim', 'tools',
                      f'{tool}.py')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    r = warm.run([sys.executable, script, *args], cwd=cwd, env=dict(env, MPLBACKEND='Agg'),
                 timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f'{pkg} {tool}.py failed ({r.returncode}):\n{out[-4000:]}'
    return out


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('upstream_train')
    make_toy_sets(root, seed=3, size=64, train=4, val=2)
    from tools.misc import make_toy_datasets as toy
    toy.make_toy_cls(str(root / 'toy_cls'), seed=3, train=8, val=4, size=64)
    return root


def derived(config, task, data, out):
    """The toy config on this test's data, one short run (the checkpoint after it); mmengine merges
    these dicts into the base config's."""
    root = {'det': f'{data}/toy_coco/', 'seg': f'{data}/toy_ade/', 'cls': f'{data}/toy_cls/'}[task]
    config, _, backbone = config.partition('+')
    lines = [f'_base_ = {osp.join(ROOT, config)!r}',
             f'train_dataloader = dict(batch_size=2, dataset=dict(data_root={root!r}))',
             f'val_dataloader = dict(dataset=dict(data_root={root!r}))',
             f'test_dataloader = dict(dataset=dict(data_root={root!r}))']
    if task == 'det':
        ann = root + 'annotations/instances_val.json'
        lines += [f'val_evaluator = dict(ann_file={ann!r})',
                  f'test_evaluator = dict(ann_file={ann!r})',
                  'train_cfg = dict(max_epochs=1, val_interval=100)']
        # every scored box kept: after one toy epoch RetinaNet scores nothing above the shipped
        # 0.05 (it starts at the focal prior 0.01), and an empty result has no metrics to compare
        lines += ['model = dict(test_cfg=dict(score_thr=0.0))' if 'retinanet' in config else
                  'model = dict(test_cfg=dict(rcnn=dict(score_thr=0.0)))']
        if backbone == 'InLineSwin':
            lines += ["model = dict(backbone=dict(_delete_=True, type='InLineSwin', arch='tiny'), "
                      'neck=dict(in_channels=[96, 192, 384, 768]), '
                      'test_cfg=dict(rcnn=dict(score_thr=0.0)))']
    elif task == 'seg':
        lines += ['train_cfg = dict(max_iters=2, val_interval=100)',
                  'default_hooks = dict(checkpoint=dict(interval=2))']
    else:
        lines += ['train_cfg = dict(max_epochs=1, val_interval=100)']
    out.write_text('\n'.join(lines) + '\n')
    return str(out)


@pytest.mark.slow  # three toolboxes' tools in fresh processes: about 90 s on 2 cores
@pytest.mark.parametrize('case, pkg, config, task', CASES,
                         ids=[getattr(c, 'values', c)[0] for c in CASES])
def test_upstream_tools_train_resume_and_test_our_configs(case, pkg, config, task, data, tmp_path):
    cfg = derived(config, task, data, tmp_path / 'cfg.py')
    run = tmp_path / 'empty'
    run.mkdir()
    work = tmp_path / 'work'
    upstream(pkg, 'train', run, cfg, '--work-dir', work)
    first = 'iter_2.pth' if task == 'seg' else 'epoch_1.pth'
    assert (work / first).is_file(), sorted(os.listdir(work))
    longer = 'train_cfg.max_iters=4' if task == 'seg' else 'train_cfg.max_epochs=2'
    out = upstream(pkg, 'train', run, cfg, '--work-dir', work, '--resume', '--cfg-options',
                   longer)
    assert re.search(r'[Rr]esumed? (from )?|resumed epoch', out), out[-3000:]
    last = work / ('iter_4.pth' if task == 'seg' else 'epoch_2.pth')
    assert last.is_file(), sorted(os.listdir(work))
    assert not [p for p in os.listdir(work) if '.tmp-' in p]  # atomic writes left nothing behind

    upstream(pkg, 'test', run, cfg, last, '--work-dir', tmp_path / 'theirs')
    assert test_tool.main([cfg, str(last), '--work-dir', str(tmp_path / 'ours')]) == 0
    theirs, ours = read_metrics(str(tmp_path / 'theirs')), read_metrics(str(tmp_path / 'ours'))
    assert theirs and set(theirs) == set(ours), (theirs, ours)
    # one model, one checkpoint, each image alone through the same kernels on the same thread
    # count (conftest.py passes it to the subprocess): the same sums, so the same metrics; the
    # tolerance only absorbs the rounding of the printed values
    for k, v in theirs.items():
        if isinstance(v, (int, float)):
            assert ours[k] == pytest.approx(v, abs=1e-4), (k, theirs, ours)


@pytest.mark.slow  # one upstream training, our resume and test: about 60 s on 2 cores
def test_checkpoints_of_upstream_tools_without_our_fixes_resume_and_test(data, tmp_path):
    """A work dir whose checkpoint mmseg's own train.py wrote without mmlinattn.upstream_fixes
    (MMLINATTN_UPSTREAM_FIXES=0: as for a config of the user's that lists only 'mmlinattn'): its
    HistoryBuffers pickle their methods through builtins.getattr, which torch >= 2.6's weights-only
    loader refuses. Our tools/train.py --resume continues from it and tools/test.py scores it
    (was: UnpicklingError after the model was built; the resume pre-check had let it through)."""
    import torch

    from mmlinattn.training import compat
    from tools import train as train_tool
    cfg = derived('configs/toy/fpn_mavit-t_toy-ade.py', 'seg', data, tmp_path / 'cfg.py')
    run = tmp_path / 'empty'
    run.mkdir()
    work = tmp_path / 'work'
    os.environ['MMLINATTN_UPSTREAM_FIXES'] = '0'
    try:
        upstream('mmseg', 'train', run, cfg, '--work-dir', work)
    finally:
        del os.environ['MMLINATTN_UPSTREAM_FIXES']
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


def test_a_failed_resume_leaves_the_work_dir_as_it_was(data, tmp_path, capsys):
    """--resume FILE with a truncated file stops in one line, and the work dir holds what it held
    (mmengine's log folder of the refused run aside: its log says why)."""
    from tools import train as train_tool
    cfg = derived('configs/toy/fpn_mavit-t_toy-ade.py', 'seg', data, tmp_path / 'cfg.py')
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
    from tools import train as train_tool
    cfg = train_tool.build_cfg(train_tool.parse_args([
        osp.join(ROOT, 'configs/toy/inline-pvt-t_toy-cls.py'), '--no-pin-memory',
        '--no-persistent-workers']))
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        assert cfg[loader].pin_memory is False and cfg[loader].persistent_workers is False
