"""One config, one run, whichever tool runs it: ours (``tools/train.py``, ``tools/test.py``) and
mmseg's own ``tools/train.py`` and ``test.py`` (from its installed package, as a user copies
them); ``mim train`` / ``mim test`` run on the installed wheel in tests/test_wheel.py (mim finds a
package's tools in its ``.mim`` folder, which an editable install does not have). Every behaviour
is one test parametrized over the tools, with the same expected line for all: our runtimes name
``LinAttnRunner``, which every tool builds.

Where our Runner refuses a config, mmseg's own tool with mmengine's plain Runner
(``--cfg-options runner_type=Runner``: what the run would be without us) is the oracle: it must
fail too, or our check is wrong. Where upstream runs, ours runs.
"""
import json
import os
import os.path as osp
import shutil
import sys

import pytest

from mmlinattn.training.workdir_lock import lock_work_dir

import warm
from helpers import toy_coco_options, toy_seg_options, work_dir_files

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
DET_CFG = osp.join(ROOT, 'configs/toy/retinanet_mavit-t_fpn_toy-coco.py')
TOOLS = ('ours', 'mmseg')


def _upstream(script, pkg='mmseg'):
    from mmengine.utils import get_installed_path
    return osp.join(get_installed_path(pkg), '.mim', 'tools', script)


def command(tool, script, config, *args, checkpoint=None):
    """The command line that runs ``script`` ('train.py' / 'test.py') on ``config`` with
    ``tool`` ('ours', or the toolbox whose own script it is: 'mmseg', 'mmdet')."""
    path = osp.join(ROOT, 'tools', script) if tool == 'ours' else _upstream(script, tool)
    return [sys.executable, path, config] + ([checkpoint] if checkpoint else []) + list(args)


def run(cmd, cwd, timeout=600):
    return warm.run(cmd, cwd=cwd, timeout=timeout)


def error_lines(r):
    return [line for line in r.stderr.splitlines() if ': error: ' in line]


@pytest.mark.slow  # one tool process each, to the refusal: 5-10 s on the 2-core machine
@pytest.mark.parametrize('tool', TOOLS)
def test_a_missing_data_folder_is_one_line_before_any_work(tool, toy_data, tmp_path):
    """From mmseg's root or an empty folder (no checkout there): one line naming the key, exit 2,
    and the work dir is left as it was (no config dump, no checkpoint; mmengine's log folder)."""
    work = tmp_path / 'work'
    cmd = command(tool, 'train.py', SEG_CFG, '--work-dir', str(work), '--cfg-options',
                  *toy_seg_options(toy_data),
                  f'train_dataloader.dataset.data_root={tmp_path / "nowhere"}')
    r = run(cmd, tmp_path)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    (line,) = error_lines(r)
    prog, message = line.split(': error: ', 1)
    assert prog.endswith('train.py') and message.startswith('dataset paths do not exist'), line
    assert 'train_dataloader.dataset.data_root' in r.stderr and 'Traceback' not in r.stderr
    assert work_dir_files(work) == {}, os.listdir(work)


@pytest.mark.slow  # one tool process each, to the refusal: 5-10 s on the 2-core machine
@pytest.mark.parametrize('tool', TOOLS)
def test_a_busy_work_dir_is_refused_naming_the_run_in_it(tool, toy_data, tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    lock = lock_work_dir(str(work))  # a live run: this test's process
    try:
        r = run(command(tool, 'train.py', SEG_CFG, '--work-dir', str(work), '--cfg-options',
                        *toy_seg_options(toy_data)), tmp_path)
    finally:
        lock.release()
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    (line,) = error_lines(r)
    prog, message = line.split(': error: ', 1)
    assert prog.endswith('train.py') and message.startswith(
        f'work dir {work} is in use by another run (pid {os.getpid()}'), line
    assert set(work_dir_files(work)) <= {'.mmlinattn-run.lock'}, os.listdir(work)


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


@pytest.mark.slow  # a test of 2 toy images per tool with pictures: 10-20 s each on 2 cores
@pytest.mark.parametrize('tool', TOOLS + ('upstream-runner',))
def test_testing_checks_what_a_test_builds(tool, toy_data, toy_checkpoints, tmp_path):
    """A test builds no optimizer and no scheduler: a schedule that a training could not run is
    no reason to refuse it (mmseg's own tool with mmengine's Runner, the oracle, runs it). The
    pictures land where mmseg's visualizer saves them: DIR/vis_data/vis_image."""
    config = _short_schedule_config(tmp_path)
    show = tmp_path / 'show'
    opts = [f'{k}_dataloader.dataset.data_root={toy_data}/toy_ade' for k in ('train', 'val',
                                                                            'test')]
    if tool == 'upstream-runner':
        tool, opts = 'mmseg', opts + ['runner_type=Runner']
    r = run(command(tool, 'test.py', config, '--work-dir', str(tmp_path / 'w'), '--show-dir',
                    str(show), '--cfg-options', *opts, checkpoint=toy_checkpoints.seg), tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    drawn = sorted(os.listdir(show / 'vis_data' / 'vis_image'))
    tested = sorted(os.listdir(toy_data / 'toy_ade' / 'images' / 'validation'))
    # mmseg's SegVisualizationHook names each picture test_<image file>_<iteration>.png
    assert drawn == [f'test_{f}_0.png' for f in tested], drawn


@pytest.mark.slow  # the oracle's training until it fails: 10-20 s on 2 cores
def test_a_schedule_that_cannot_run_fails_upstream_too(toy_data, tmp_path):
    """Our Runner refuses to train the short config before any data is read; mmengine's plain
    Runner (mmseg's own tool, runner_type=Runner) fails on it too, later."""
    config = _short_schedule_config(tmp_path)
    base = ['--cfg-options', *toy_seg_options(toy_data)]
    ours = run(command('ours', 'train.py', config, '--work-dir', str(tmp_path / 'a'), *base),
               tmp_path)
    assert ours.returncode == 2 and error_lines(ours) == [
        'tools/train.py: error: the learning-rate schedule does not fit this run:'], \
        ours.stdout[-2000:] + ours.stderr[-2000:]
    assert 'param_scheduler.1 (PolyLR, by_epoch=False) begins at iteration 50' in ours.stderr
    upstream = run(command('mmseg', 'train.py', config, '--work-dir', str(tmp_path / 'b'), *base,
                           'runner_type=Runner'), tmp_path)
    assert upstream.returncode != 0, upstream.stdout[-2000:]
    assert not (tmp_path / 'b' / 'iter_2.pth').exists()


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


@pytest.mark.slow  # the oracle's run until it fails: 10-30 s each on 2 cores
@pytest.mark.parametrize('case', list(REFUSALS))
def test_every_refusal_fails_upstream_too(case, toy_data, tmp_path):
    """Where our Runner refuses a training before any work, mmengine's plain Runner under mmseg's
    own tool (``runner_type=Runner``: the same config without us) fails too - later, and without
    a line naming the key - so the check refuses nothing that would have run."""
    extra, change, said, early = REFUSALS[case]
    data = toy_data
    if change is not None:
        data = tmp_path / 'data'
        shutil.copytree(toy_data / 'toy_ade', data / 'toy_ade')
        change(data)
    opts = toy_seg_options(data, 'train_cfg.max_iters=2', *extra)
    upstream = _refused_by_ours_and_upstream('mmseg', SEG_CFG, opts, said, early, tmp_path)
    assert UPSTREAM_SAYS.get(case, '') in upstream.stderr, upstream.stderr[-2000:]


#: what mmseg's run ends with, where it names the cause (the other cases end in other tracebacks)
UPSTREAM_SAYS = {'dataset args': "unexpected keyword argument 'split'",
                 'label map size': 'The shape of the mask [48, 40]',
                 'label out of range': 'IndexError: Target 8 is out of bounds',
                 'unreadable image': 'AssertionError: failed to load image'}


@pytest.mark.heavy  # upstream compiles for minutes: 10 min on 2 cores
def test_the_compile_warning_stands_where_upstream_trains(toy_data, tmp_path):
    """``compile=True`` where the training inputs change size (the toy pipeline's RandomResize and
    a crop that can be smaller than its size, the preprocessor's fixed-size pad removed): mmseg's
    own train.py with mmengine's plain Runner trains it, compiled, through inputs of several sizes
    (measured 2026-11-28, torch 2.14.1, CPU: 279 s and 281 s for the first two sizes, then seconds),
    so our pre-flight warns and does not refuse. The plain Runner gets PlainParamGroupsHook, which
    our Runner adds to every compiled run: without it mmengine's compiled optimizer step fails at
    the first iteration on torch 2.14, whatever the sizes, and this oracle would say nothing."""
    from mmlinattn.training.preflight.compile import check_compile
    from tools import train as train_tool

    from helpers import run_checks
    config = tmp_path / 'compiled.py'
    config.write_text(f"_base_ = [{SEG_CFG!r}]\n"
                      "custom_hooks = [dict(type='RunChecksHook'), "
                      "dict(type='PlainParamGroupsHook')]\n")
    opts = toy_seg_options(toy_data, 'train_cfg.max_iters=4', 'model.data_preprocessor.size=None',
                           'model.data_preprocessor.size_divisor=1', 'compile=True')
    cfg = train_tool.build_cfg(train_tool.parse_args(
        [str(config), '--work-dir', str(tmp_path / 'ours'), '--cfg-options', *opts]))
    assert check_compile(cfg).startswith('compile: the training inputs change size (Random')
    run_checks(cfg)  # no refusal
    upstream = run(command('mmseg', 'train.py', str(config), '--work-dir', str(tmp_path / 'up'),
                           '--cfg-options', *opts, 'runner_type=Runner'), tmp_path, timeout=3600)
    out = upstream.stdout + upstream.stderr
    assert upstream.returncode == 0 and 'Iter(train) [4/4]' in out, out[-3000:]
    sizes = set()  # the batches' sizes, as the data preprocessor stacks them (no fixed pad)
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import DATASETS
    init_default_scope('mmseg')
    ds = DATASETS.build(Config.fromfile(str(tmp_path / 'up' / 'compiled.py')).train_dataloader
                        .dataset)
    for _ in range(8):
        sizes.add(tuple(ds[0]['inputs'].shape[-2:]))
    assert len(sizes) > 1, sizes


def _refused_by_ours_and_upstream(pkg, config, opts, said, early, tmp_path):
    """Our checks refuse ``config`` with ``opts`` saying ``said``; ``pkg``'s own train.py with
    mmengine's plain Runner fails on it too (before its first checkpoint where ``early``); the
    upstream run."""
    from mmlinattn.training.config import ConfigError
    from tools import train as train_tool

    from helpers import run_checks
    with pytest.raises(ConfigError) as e:
        run_checks(train_tool.build_cfg(train_tool.parse_args(
            [config, '--work-dir', str(tmp_path / 'ours'), '--cfg-options', *opts])))
    assert said in str(e.value)
    upstream = run(command(pkg, 'train.py', config, '--work-dir', str(tmp_path / 'up'),
                           '--cfg-options', *opts, 'runner_type=Runner'), tmp_path)
    assert upstream.returncode != 0, upstream.stdout[-2000:]
    assert not early or not list((tmp_path / 'up').glob('*.pth')), upstream.stdout[-2000:]
    return upstream


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


@pytest.mark.slow  # the oracle's run until it fails: about 5 s each on 2 cores (warm)
@pytest.mark.parametrize('case', list(COCO_REFUSALS))
def test_every_coco_refusal_fails_upstream_too(case, toy_data, tmp_path):
    """As above, for the checks of a COCO annotation file, with mmdet's own train.py."""
    change, extra, said = COCO_REFUSALS[case]
    root = tmp_path / 'toy_coco'
    shutil.copytree(toy_data / 'toy_coco', root)
    if change is not None:
        change(root)
    opts = toy_coco_options(root, 'train_cfg.max_epochs=1', *extra)
    upstream = _refused_by_ours_and_upstream('mmdet', DET_CFG, opts, said, True, tmp_path)
    assert COCO_UPSTREAM_SAYS.get(case, '') in upstream.stderr, upstream.stderr[-2000:]


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


@pytest.mark.slow  # two tool processes per case: 10-20 s on the 2-core machine
@pytest.mark.parametrize('case', ['diverged weights', 'trained as another attention'])
def test_a_test_checks_its_checkpoint_under_every_tool(case, toy_data, toy_checkpoints, tmp_path):
    """The same one line and exit 2 from our test.py and mmseg's own (which builds mmengine's
    plain Runner whatever the config's runner_type: the runtime's RunChecksHook checks there,
    after the datasets and before the weights); no checkpoint. Ours, which checks before it
    reads any data, leaves no config dump either."""
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
    for tool in TOOLS:
        work = tmp_path / tool
        r = run(command(tool, 'test.py', SEG_CFG, '--work-dir', str(work), '--cfg-options',
                        *opts, checkpoint=checkpoint), tmp_path)
        assert r.returncode == 2 and len(error_lines(r)) == 1, r.stdout[-2000:] + r.stderr[-2000:]
        messages[tool] = error_lines(r)[0].split(': error: ', 1)[1]
        assert messages[tool].startswith(said), messages[tool]
        assert all(a in messages[tool] for a in also), messages[tool]
        assert 'Traceback' not in r.stderr and 'aAcc' not in r.stdout  # nothing scored
        left = sorted(work_dir_files(work))
        # mmengine's plain Runner dumps the config at its construction, before any hook runs
        assert left == ([] if tool == 'ours' else [osp.basename(SEG_CFG)]), left
    assert messages['ours'] == messages['mmseg']


@pytest.mark.slow  # one tool process: 5-10 s on the 2-core machine
def test_a_refused_test_leaves_no_work_dir(toy_data, toy_checkpoints, tmp_path):
    """Our test.py checks the data before it reads any: nothing but mmengine's log folder made
    (its log says why). (mmseg 1.2.2's test.py
    builds mmengine's plain Runner, which reads the datasets first: a missing folder is the
    dataset's own traceback there.)"""
    work = tmp_path / 'never'
    r = run(command('ours', 'test.py', SEG_CFG, '--work-dir', str(work), '--cfg-options',
                    f'test_dataloader.dataset.data_root={tmp_path / "nowhere"}',
                    checkpoint=toy_checkpoints.seg), tmp_path)
    assert r.returncode == 2 and len(error_lines(r)) == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert work_dir_files(work) == {}, os.listdir(work)
