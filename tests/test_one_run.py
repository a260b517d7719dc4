"""One run, whichever tool starts it: every tool (ours, mmdet's, mmseg's and mmpretrain's own
train.py and test.py, ``mim train`` / ``mim test``) builds our Runner from the config it was given
(tests/test_tools_build_our_runner.py, tests/test_wheel.py), so each behaviour of a run is tested
here once, in-process, at the Runner.

Where our Runner refuses a config, mmengine's plain Runner on the same config without us
(``runner_type='Runner'``, the runtime's ``custom_hooks`` removed: what the run would be without
mmlinattn's run layer) is the oracle: it must fail too, or our check is wrong."""
import copy
import json
import os
import os.path as osp
import shutil
import sys
import traceback

import pytest

from tools import test as test_tool
from tools import train as train_tool

from helpers import run_checks, toy_coco_options, toy_seg_options, work_dir_files

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
DET_CFG = osp.join(ROOT, 'configs/toy/retinanet_mavit-t_fpn_toy-coco.py')


def train_cfg(config, work, opts):
    """The run's config as tools/train.py builds it (``--cfg-options opts``)."""
    return train_tool.build_cfg(train_tool.parse_args(
        [config, '--work-dir', str(work), '--cfg-options', *opts]))


def without_us(cfg, work):
    """``cfg`` as mmengine's plain Runner runs it without our run layer: ``runner_type='Runner'``,
    no ``custom_hooks``, mmengine's own CheckpointHook, and a logger, message hub and visualizer of
    its own in this process."""
    cfg = copy.deepcopy(cfg)
    cfg.runner_type, cfg.custom_hooks, cfg.work_dir = 'Runner', [], str(work)
    cfg.default_hooks.checkpoint.type = 'CheckpointHook'
    cfg.experiment_name = cfg.visualizer.name = f'without_us_{osp.basename(osp.dirname(work))}'
    return cfg


def fails_without_us(cfg, work, early=True) -> str:
    """mmengine's plain Runner trains ``cfg`` without us (:func:`without_us`) into ``work``: it
    must fail (before its first checkpoint where ``early``). Its traceback, as text."""
    from mmengine.runner import Runner
    with pytest.raises(Exception) as e:
        Runner.from_cfg(without_us(cfg, work)).train()
    assert not early or not [p for p in os.listdir(work) if p.endswith('.pth')], os.listdir(work)
    return ''.join(traceback.format_exception(e.type, e.value, e.tb))


@pytest.mark.slow  # two short trainings of the plain Runner: 5-10 s on 2 cores
@pytest.mark.parametrize('config, options', [(SEG_CFG, toy_seg_options),
                                             (DET_CFG, toy_coco_options)], ids=['seg', 'det'])
def test_the_oracle_trains_the_unchanged_toy_configs(config, options, toy_data, tmp_path):
    """The oracle's control: mmengine's plain Runner without us trains each toy config as it is,
    so where it fails on a changed one (the tests below), the change is the cause."""
    from mmengine.runner import Runner
    root = toy_data / 'toy_coco' if config == DET_CFG else toy_data
    limit = 'train_cfg.max_epochs=1' if config == DET_CFG else 'train_cfg.max_iters=2'
    runner = Runner.from_cfg(without_us(train_cfg(config, tmp_path / 'ours', options(root, limit)),
                                        tmp_path / 'work'))
    runner.train()  # to its end: the det config's epoch, the seg config's 2 iterations
    assert type(runner) is Runner and runner.iter == runner.train_loop.max_iters > 0
    assert not any('mmlinattn' in type(h).__module__ for h in runner.hooks), runner.hooks


def upstream_cfg(config, opts):
    """``config`` with ``--cfg-options opts`` as the toolboxes' own tools read them (mmengine's
    ``DictAction``, ``Config.fromfile``, ``merge_from_dict``), no check of ours."""
    import argparse

    from mmengine.config import Config, DictAction
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(parser.parse_args(['--cfg-options', *opts]).cfg_options)
    return cfg


def refused_by_ours_and_upstream(config, opts, said, early, tmp_path) -> str:
    """Our checks refuse ``config`` with ``opts`` saying ``said`` (tools/train.py's reading of the
    options, then the Runner's checks); mmengine's plain Runner without us fails on it too
    (:func:`fails_without_us`); its traceback."""
    from mmlinattn.training.config import ConfigError
    with pytest.raises(ConfigError) as e:
        run_checks(train_cfg(config, tmp_path / 'ours', opts))
    assert said in str(e.value)
    return fails_without_us(upstream_cfg(config, opts), tmp_path / 'up', early)


def test_a_refused_run_under_a_tool_started_by_its_path_is_one_line_naming_it(
        toy_data, toy_checkpoints, tmp_path, monkeypatch, capsys):
    """The toolboxes' own tools and mim start a script by its absolute path: a refusal is one
    line ``test.py: error: ...`` on stderr, exit 2, no traceback, and the work dir holds nothing
    but mmengine's log folder (no config dump). A test's checks run before it reads any data
    (mmseg 1.2.2's test.py, which builds mmengine's plain Runner, reads the datasets first)."""
    from mmengine.registry import RUNNERS

    from mmlinattn.training import refusal
    monkeypatch.setattr(refusal, 'PROG', None)  # what our tools set, in this process too
    monkeypatch.setattr(sys, 'argv', ['/site-packages/mmdet/.mim/tools/test.py'])
    work = tmp_path / 'never'
    cfg = test_tool.build_cfg(test_tool.parse_args(
        [SEG_CFG, toy_checkpoints.seg, '--work-dir', str(work), '--cfg-options',
         f'test_dataloader.dataset.data_root={tmp_path / "nowhere"}']))
    cfg.experiment_name = 'one_line_by_path'
    with pytest.raises(SystemExit) as e:
        RUNNERS.build(cfg).test()
    assert e.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ': error: ' in ln]
    assert lines == ['test.py: error: dataset paths do not exist:'], lines
    assert work_dir_files(work) == {}, os.listdir(work)


def _short_schedule_config(tmp_path):
    """A user's short config: 2 iterations, a 50-iteration warm-up, then PolyLR to the end of the
    run (its ``end`` left to mmengine: max_iters, before its begin). A training cannot run it. Every
    test image drawn (mmseg's hook draws every 50th by default)."""
    cfg = tmp_path / 'short.py'
    cfg.write_text(f'_base_ = [{SEG_CFG!r}]\ntrain_cfg = dict(max_iters=2)\n'
                   'default_hooks = dict(visualization=dict(type="SegVisualizationHook", '
                   'interval=1))\n'
                   'param_scheduler = [dict(type="LinearLR", start_factor=0.1, by_epoch=False, '
                   'begin=0, end=50), dict(type="PolyLR", power=1.0, begin=50, eta_min=0.0, '
                   'by_epoch=False)]\n')
    return str(cfg)


@pytest.mark.slow  # a test of 2 toy images with pictures: 5-10 s on 2 cores
def test_testing_checks_what_a_test_builds(toy_data, toy_checkpoints, tmp_path):
    """A test builds no optimizer and no scheduler: a schedule that a training could not run is
    no reason to refuse it. The pictures land where mmseg's visualizer saves them:
    DIR/vis_data/vis_image."""
    config = _short_schedule_config(tmp_path)
    show = tmp_path / 'show'
    opts = [f'{k}_dataloader.dataset.data_root={toy_data}/toy_ade' for k in ('train', 'val',
                                                                            'test')]
    assert test_tool.main([config, toy_checkpoints.seg, '--work-dir', str(tmp_path / 'w'),
                           '--show-dir', str(show), '--cfg-options', *opts]) == 0
    drawn = sorted(os.listdir(show / 'vis_data' / 'vis_image'))
    tested = sorted(os.listdir(toy_data / 'toy_ade' / 'images' / 'validation'))
    # mmseg's SegVisualizationHook names each picture test_<image file>_<iteration>.png
    assert drawn == [f'test_{f}_0.png' for f in tested], drawn


@pytest.mark.slow  # the oracle's training until it fails: 5-10 s on 2 cores
def test_a_schedule_that_cannot_run_fails_upstream_too(toy_data, tmp_path):
    """Our Runner refuses to train the short config before any data is read; mmengine's plain
    Runner fails on it too, later."""
    refused_by_ours_and_upstream(
        _short_schedule_config(tmp_path), toy_seg_options(toy_data),
        'param_scheduler.1 (PolyLR, by_epoch=False) begins at iteration 50', True, tmp_path)


def _narrower_label_map(data):
    """One validation label map 8 pixels narrower than its image."""
    from PIL import Image
    path = sorted((data / 'toy_ade' / 'annotations' / 'validation').iterdir())[0]
    with Image.open(path) as im:
        im.load()
    im.crop((0, 0, im.width - 8, im.height)).save(path)


def _label_out_of_range(data):
    """One training label map all 9: class 8 after reduce_zero_label, for a 4-class head."""
    from PIL import Image
    path = sorted((data / 'toy_ade' / 'annotations' / 'training').iterdir())[0]
    with Image.open(path) as im:
        size = im.size
    Image.new('L', size, 9).save(path)


def _truncated_image(data):
    """One training image cut to its first 100 bytes."""
    path = sorted((data / 'toy_ade' / 'images' / 'training').iterdir())[0]
    path.write_bytes(path.read_bytes()[:100])


#: refusals of the pre-flight on the toy segmentation config: the --cfg-options that cause each,
#: what changes in a copy of the data (or None), the line it gives, and whether upstream fails
#: before its first iteration (else later: the label map is read by the validation at the end)
REFUSALS = {
    'missing data': (['train_dataloader.dataset.data_root=/nonexistent/toy_ade'], None,
                     'dataset paths do not exist', True),
    'neck channels': (['model.neck.in_channels=[64,128,320,512]'], None,
                      'model.neck.in_channels=[64, 128, 320, 512]', True),
    # the toy set's 4 classes on a 2-class head: labels 2 and 3 are out of the loss's range (a
    # larger head is a warning, not a refusal: mmseg trains and scores it)
    'fewer classes': (['model.decode_head.num_classes=2'], None,
                      'model.decode_head.num_classes=2 but', True),
    # a key of another dataset class (mmpretrain's ImageNet takes split=, BaseSegDataset not);
    # from a config file, tests/test_preflight.py names the same refusal
    'dataset args': (['train_dataloader.dataset.split=train'], None,
                     "builds BaseSegDataset, which takes no 'split'", True),
    'label map size': ([], _narrower_label_map, 'label map(s) of another size than their image',
                       False),
    'label out of range': ([], _label_out_of_range, 'label map(s) with values outside [0, 4)',
                           True),
    'unreadable image': ([], _truncated_image, 'file(s) that cannot be read', True),
}


@pytest.mark.slow  # the oracle's run until it fails: 3-10 s each on 2 cores
@pytest.mark.parametrize('case', list(REFUSALS))
def test_every_refusal_fails_upstream_too(case, toy_data, tmp_path):
    """Where our Runner refuses a training before any work, mmengine's plain Runner without us
    fails too - later, and without a line naming the key - so the check refuses nothing that would
    have run."""
    extra, change, said, early = REFUSALS[case]
    data = toy_data
    if change is not None:
        data = tmp_path / 'data'
        shutil.copytree(toy_data / 'toy_ade', data / 'toy_ade')
        change(data)
    opts = toy_seg_options(data, 'train_cfg.max_iters=2', *extra)
    upstream = refused_by_ours_and_upstream(SEG_CFG, opts, said, early, tmp_path)
    assert UPSTREAM_SAYS.get(case, '') in upstream, upstream[-2000:]


#: what mmseg's run ends with, where it names the cause (the other cases end in other tracebacks)
UPSTREAM_SAYS = {'dataset args': "unexpected keyword argument 'split'",
                 'label map size': 'The shape of the mask [48, 40]',
                 'label out of range': 'IndexError: Target 8 is out of bounds',
                 'unreadable image': 'AssertionError: failed to load image'}


@pytest.mark.heavy  # upstream compiles for minutes: 10 min on 2 cores
@pytest.mark.xfail(strict=False, reason='torch 2.14.1 inductor: the recompilation at a new size '
                   'trained on 2026-11-28 and failed on 2026-11-29 (cannot determine truth value '
                   'of Relational), the same config: docs/benchmarks.md section 11')
def test_the_compile_warning_stands_where_upstream_trains(toy_data, tmp_path):
    """``compile=True`` where the training inputs change size (the toy pipeline's RandomResize and
    a crop that can be smaller than its size, the preprocessor's fixed-size pad removed):
    mmengine's plain Runner trains it, compiled, through inputs of several sizes (measured
    2026-11-28, torch 2.14.1, CPU: 279 s and 281 s for the first two sizes, then seconds), so our
    pre-flight warns and does not refuse. The plain Runner gets PlainParamGroupsHook, which our
    Runner adds to every compiled run: without it mmengine's compiled optimizer step fails at the
    first iteration on torch 2.14, whatever the sizes, and this oracle would say nothing."""
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner
    from mmseg.registry import DATASETS

    from mmlinattn.training.preflight.compile import check_compile
    opts = toy_seg_options(toy_data, 'train_cfg.max_iters=4', 'model.data_preprocessor.size=None',
                           'model.data_preprocessor.size_divisor=1', 'compile=True')
    cfg = train_cfg(SEG_CFG, tmp_path / 'ours', opts)
    assert check_compile(cfg).startswith('compile: the training inputs change size (Random')
    run_checks(cfg)  # no refusal
    plain = without_us(cfg, tmp_path / 'up')
    plain.custom_hooks = [dict(type='PlainParamGroupsHook')]
    runner = Runner.from_cfg(plain)
    runner.train()
    assert runner.iter == 4
    sizes = set()  # the batches' sizes, as the data preprocessor stacks them (no fixed pad)
    init_default_scope('mmseg')
    ds = DATASETS.build(cfg.train_dataloader.dataset)
    for _ in range(8):
        sizes.add(tuple(ds[0]['inputs'].shape[-2:]))
    assert len(sizes) > 1, sizes


def _coco_edit(edit):
    """A change to the toy COCO's training annotation file."""
    def change(root):
        path = root / 'annotations' / 'instances_train.json'
        info = json.loads(path.read_text())
        edit(info, root)
        path.write_text(json.dumps(info))
    return change


def _drop_bbox(info, root):
    del info['annotations'][0]['bbox']


def _delete_image(info, root):
    os.remove(root / 'train' / info['images'][0]['file_name'])


def _truncate(root):
    path = root / 'annotations' / 'instances_train.json'
    path.write_text(path.read_text()[:200])


def _drop_images(info, root):
    del info['images']


#: refusals of the pre-flight on what a COCO file holds, on the toy RetinaNet: the change to a copy
#: of the toy COCO, the --cfg-options added, the line
COCO_REFUSALS = {
    'annotation without bbox': (_coco_edit(_drop_bbox), [], 'has no "bbox"'),
    'image not on disk': (_coco_edit(_delete_image), [],
                          'image(s) listed in "images" are not in'),
    'not JSON': (_truncate, [], 'instances_train.json: not valid JSON'),
    'no images list': (_coco_edit(_drop_images), [], 'no "images" list'),
    # every toy image is 48 px: mmdet's filter keeps none at min_size=64
    'empty after filtering': (None, ['train_dataloader.dataset.filter_cfg.min_size=64'],
                              'would be empty after filtering'),
}


@pytest.mark.slow  # the oracle's run until it fails: 2-5 s each on 2 cores
@pytest.mark.parametrize('case', list(COCO_REFUSALS))
def test_every_coco_refusal_fails_upstream_too(case, toy_data, tmp_path):
    """As above, for the checks of a COCO annotation file, on the toy RetinaNet."""
    change, extra, said = COCO_REFUSALS[case]
    root = tmp_path / 'toy_coco'
    shutil.copytree(toy_data / 'toy_coco', root)
    if change is not None:
        change(root)
    opts = toy_coco_options(root, 'train_cfg.max_epochs=1', *extra)
    upstream = refused_by_ours_and_upstream(DET_CFG, opts, said, True, tmp_path)
    assert COCO_UPSTREAM_SAYS.get(case, '') in upstream, upstream[-2000:]


#: how mmdet's run ends where our line names a cause it does not: the empty dataset is
#: mmengine's serialisation of no records, at the dataset's construction
COCO_UPSTREAM_SAYS = {'empty after filtering': 'need at least one array to concatenate'}


def _diverged(checkpoint, path):
    """``checkpoint`` with one weight set to NaN, saved at ``path`` (a run that diverged)."""
    import torch
    obj = torch.load(checkpoint, map_location='cpu', weights_only=False)
    key = next(k for k, v in obj['state_dict'].items() if v.is_floating_point())
    obj['state_dict'][key] = obj['state_dict'][key].clone()
    obj['state_dict'][key].view(-1)[0] = float('nan')  # (every parameter is contiguous)
    torch.save(obj, path)
    return str(path), key


@pytest.mark.slow  # a Runner of each kind per case: 5-10 s on 2 cores
@pytest.mark.parametrize('case', ['diverged weights', 'trained as another attention'])
def test_a_test_checks_its_checkpoint_under_either_runner(case, toy_data, toy_checkpoints,
                                                          tmp_path, capsys):
    """The same one line and exit 2 from our Runner and from mmengine's plain one with the
    runtime's hooks (what mmseg 1.2.2's test.py builds whatever the config's runner_type: the
    runtime's RunChecksHook checks there, after the datasets and before the weights); no
    checkpoint loaded, nothing scored. Ours, which checks before it reads any data, leaves no
    config dump either."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    opts = [f'{k}_dataloader.dataset.data_root={toy_data}/toy_ade' for k in ('val', 'test')]
    checkpoint = toy_checkpoints.seg
    if case == 'diverged weights':
        checkpoint, key = _diverged(checkpoint, tmp_path / 'nan.pth')
        said = f'checkpoint {checkpoint}: 1 of '
        also = (key, 'NaN/inf')
    else:  # MAViT's default MMSS loads key for key into MMMM (the paper's two functions)
        opts.append('model.backbone.attn_type=MMMM')
        said = f'checkpoint {checkpoint} was trained as another attention function'
        also = ('(checkpoint)', '(config)')
    messages = {}
    for kind in ('ours', 'plain'):
        work = tmp_path / kind
        cfg = test_tool.build_cfg(test_tool.parse_args(
            [SEG_CFG, checkpoint, '--work-dir', str(work), '--cfg-options', *opts]))
        cfg.experiment_name = cfg.visualizer.name = f'checks_{kind}_{tmp_path.name}'
        runner = RUNNERS.build(cfg) if kind == 'ours' else Runner.from_cfg(cfg)
        assert type(runner).__name__ == ('LinAttnRunner' if kind == 'ours' else 'Runner')
        with pytest.raises(SystemExit) as e:
            runner.test()
        assert e.value.code == 2
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ': error: ' in ln]
        assert len(lines) == 1, lines
        messages[kind] = lines[0].split(': error: ', 1)[1]
        assert messages[kind] == str(e.value) and messages[kind].startswith(said), messages
        assert all(a in messages[kind] for a in also), messages[kind]
        left = sorted(work_dir_files(work))
        # mmengine's plain Runner dumps the config at its construction, before any hook runs
        assert left == ([] if kind == 'ours' else [osp.basename(SEG_CFG)]), left
    assert messages['ours'] == messages['plain']
