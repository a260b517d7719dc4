"""tools/test.py against mmdet's and mmseg's own ``tools/test.py`` (the scripts installed under
``site-packages/<pkg>/.mim/tools``): the same toy config, the same checkpoint (a freshly built model
saved with the config's dataset meta), the same flags; the metrics, the predictions dumped with
``--out`` and the files written for ``--show-dir`` must agree.

The upstream tool runs in a subprocess of this interpreter; our configs carry
``custom_imports=['mmlinattn']``, so it sees our backbones without help. Ours runs in-process.
What is compared:

* detection (toy RetinaNet, MAViT-T): ``--out x.pkl --show-dir vis`` (the pickle's structure - mmdet
  dumps with ``DumpDetResults``, which drops the ground truth - and its predictions; the painted
  files' names) and ``--tta --out x.pkl`` on a config without ``tta_model`` (mmdet falls back to
  ``DetTTAModel`` over a flip pipeline);
* segmentation (toy Semantic FPN, MAViT-T): ``--out DIR --show-dir vis`` (the PNG predictions, pixel
  for pixel, and the painted files' names);
* classification (toy MAViT-T classifier, against mmpretrain's tool): ``--out x.pkl --show-dir
  DIR``, ``--tta`` on a config without ``tta_model`` (mmpretrain's flip ``AverageClsScoreTTA``) and
  ``--out m.pkl --out-item metrics``.

Flags that need a display (``--show``, ``--wait-time``) are compared by what they configure.
"""
import glob
import os
import os.path as osp
import pickle
import sys
from argparse import Namespace

import numpy as np
import pytest
import torch
from mmengine.config import Config
from PIL import Image

from mmlinattn.training.runs import read_metrics
from tools import test as test_tool

import compare
import warm
from helpers import make_toy_sets
from test_inference import checkpoint_model, make_checkpoint, reference

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CFG = osp.join(ROOT, 'configs/toy/retinanet_mavit-t_fpn_toy-coco.py')
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
CLS_CFG = osp.join(ROOT, 'configs/toy/mavit-t_toy-cls.py')


def upstream_script(pkg):
    import importlib
    return osp.join(osp.dirname(importlib.import_module(pkg).__file__), '.mim', 'tools', 'test.py')


def run_upstream(pkg, cwd, args):
    """The toolbox's own tools/test.py in a subprocess; its combined output (asserts exit 0)."""
    env = dict(os.environ, MPLBACKEND='Agg', PYTHONPATH=ROOT)
    r = warm.run([sys.executable, upstream_script(pkg), *args], cwd=cwd, env=env, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r.stdout + r.stderr


def data_args(root, kind):
    if kind == 'det':
        d = f'{root}/data/toy_coco/'
        return ['--cfg-options', f'test_dataloader.dataset.data_root={d}',
                f'test_evaluator.ann_file={d}annotations/instances_val.json']
    return ['--cfg-options', f'test_dataloader.dataset.data_root={root}/data/toy_ade']


@pytest.fixture(scope='module')
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp('tool_parity')
    make_toy_sets(r / 'data', seed=5, size=64, train=2, val=3)
    return r


@pytest.fixture(scope='module')
def seg_cfg(root):
    """The toy Semantic FPN with mmseg's SegVisualizationHook (as every ADE20K schedule of mmseg
    and ours has; the toy schedule has none), drawing every test image (its default: 1 in 50)."""
    path = root / 'seg_vis.py'
    path.write_text(f'_base_ = {SEG_CFG!r}\n'
                    "default_hooks = dict(visualization=dict(type='SegVisualizationHook', "
                    'interval=1))\n')
    return str(path)


def structure(obj, per_detection=False):
    """The nesting of a dumped prediction: dict keys, list lengths, array shapes and dtypes. Under
    ``pred_instances`` the number of detections is left out: a detection at one of the model's
    decision boundaries may be kept by one run only (compare.py; assert_same_values checks that)."""
    if isinstance(obj, dict):
        return {k: structure(v, per_detection or k == 'pred_instances')
                for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [structure(v, per_detection) for v in obj]
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        shape = tuple(obj.shape)[1 if per_detection else 0:]
        return (type(obj).__name__, shape, str(obj.dtype))
    return type(obj).__name__


def assert_same_values(a, b, path='pkl', rules=None):
    """``a`` from the upstream tool, ``b`` from ours. Both tools put each batch through the same
    kernels on the same shapes and thread count (conftest.py passes OMP_NUM_THREADS to the
    subprocess), so the sums run in the same order; the values are compared allowing summation-order
    noise all the same (compare.py), so that a difference shows as the value it concerns.
    ``rules``: the detector's test-time thresholds (compare.detection_rules)."""
    if isinstance(a, dict):
        if 'pred_label' in a and 'pred_score' in a:
            assert_same_class(a, b, path)
        for k in a:
            if k == 'pred_instances':
                what = f'{path}.{k}'
                # this toy model's scores are saturated (0.9997-1.0, 100 kept: on one image all
                # within RTOL of the cut): compare.py's min_matched requires most to match
                compare.assert_same_detections(b[k], a[k], **(rules or {}), what=what)
            elif not (k == 'pred_label' and 'pred_score' in a):
                assert_same_values(a[k], b[k], f'{path}.{k}', rules)
    elif isinstance(a, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_values(x, y, f'{path}[{i}]', rules)
    elif isinstance(a, (torch.Tensor, np.ndarray)):
        if np.asarray(a).dtype.kind == 'f':  # classification scores (boxes: pred_instances)
            np.testing.assert_allclose(np.asarray(b, dtype=np.float64),
                                       np.asarray(a, dtype=np.float64), rtol=compare.RTOL,
                                       atol=compare.SCORE_ATOL, err_msg=path)
        else:
            np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=path)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6), path
    elif not (isinstance(a, str) and osp.isabs(a)):  # absolute paths of the same files
        assert a == b, path


def assert_same_class(a, b, path):
    """A classification's label: the same in both runs, unless its score and the other run's
    label's score tie within compare.RTOL (either may then come out on top)."""
    la, lb = (int(np.asarray(x['pred_label']).reshape(-1)[0]) for x in (a, b))
    score = np.asarray(a['pred_score'], dtype=np.float64).reshape(-1)
    assert la == lb or abs(score[la] - score[lb]) <= compare.RTOL * score[la] + \
        compare.SCORE_ATOL, (f'{path}.pred_label', la, lb, score)


def load_pkl(path):
    with open(path, 'rb') as f:
        return pickle.load(f)


def assert_same_metrics(up_dir, our_dir):
    """The metrics of the two runs: the same predictions summed in the same order (see
    assert_same_values) give the same metrics, to the digits the toolboxes round them to."""
    up, ours = read_metrics(str(up_dir)), read_metrics(str(our_dir))
    assert up and set(up) == set(ours), (up, ours)
    for k in up:
        assert ours[k] == pytest.approx(up[k], rel=1e-4, abs=1e-6), k


def painted(folder, pattern):
    return sorted(osp.basename(p)
                  for p in glob.glob(osp.join(str(folder), pattern), recursive=True))


# --------------------------------------------------------------------------- detection
@pytest.mark.slow  # 12-30 s measured on the 2-core machine
def test_det_out_pkl_and_show_dir_match_mmdet(root, toy_checkpoints):
    det_ckpt = toy_checkpoints.det
    up_wd, our_wd = root / 'det_up', root / 'det_ours'
    run_upstream('mmdet', root, [DET_CFG, det_ckpt, '--work-dir', up_wd, '--out', root / 'up.pkl',
                                 '--show-dir', 'vis'] + data_args(root, 'det'))
    assert test_tool.main([DET_CFG, det_ckpt, '--work-dir', str(our_wd), '--out',
                           str(root / 'ours.pkl'), '--show-dir', 'vis'] +
                          data_args(root, 'det')) == 0
    assert_same_metrics(up_wd, our_wd)
    up, ours = load_pkl(root / 'up.pkl'), load_pkl(root / 'ours.pkl')
    assert len(up) == 3 and structure(ours) == structure(up)
    assert 'gt_instances' not in up[0]  # mmdet's DumpDetResults drops the ground truth
    assert_same_values(up, ours, rules=compare.detection_rules(Config.fromfile(DET_CFG)))
    # painted predictions under WORK_DIR/TIMESTAMP/vis, one per test image, same names
    up_vis, our_vis = painted(up_wd, '*/vis/*'), painted(our_wd, '*/vis/*')
    assert len(up_vis) == 3 and our_vis == up_vis


@pytest.mark.slow  # 12-30 s measured on the 2-core machine
def test_det_default_tta_matches_mmdet(root, toy_checkpoints):
    det_ckpt = toy_checkpoints.det
    cfg = Config.fromfile(DET_CFG)
    assert 'tta_model' not in cfg and 'tta_pipeline' not in cfg  # mmdet's fallback is what runs
    up_wd, our_wd = root / 'tta_up', root / 'tta_ours'
    out = run_upstream('mmdet', root, [DET_CFG, det_ckpt, '--work-dir', up_wd, '--tta', '--out',
                                       root / 'tta_up.pkl'] + data_args(root, 'det'))
    assert 'Cannot find ``tta_model``' in out
    assert test_tool.main([DET_CFG, det_ckpt, '--work-dir', str(our_wd), '--tta', '--out',
                           str(root / 'tta_ours.pkl')] + data_args(root, 'det')) == 0
    assert_same_metrics(up_wd, our_wd)
    up, ours = load_pkl(root / 'tta_up.pkl'), load_pkl(root / 'tta_ours.pkl')
    assert structure(ours) == structure(up)
    # mmdet's fallback DetTTAModel merges with NMS 0.5 and keeps 100: the model's own settings
    assert_same_values(up, ours, rules=compare.detection_rules(Config.fromfile(DET_CFG)))
    # and it is a flip TTA: the merged predictions differ from the plain ones
    plain = root / 'plain.pkl'
    assert test_tool.main([DET_CFG, det_ckpt, '--work-dir', str(root / 'plain'), '--out',
                           str(plain)] + data_args(root, 'det')) == 0
    a, b = load_pkl(plain)[0]['pred_instances'], ours[0]['pred_instances']
    assert a['bboxes'].shape != b['bboxes'].shape or not torch.allclose(a['bboxes'], b['bboxes'])


# --------------------------------------------------------------------------- segmentation
@pytest.mark.slow  # 12-30 s measured on the 2-core machine
def test_seg_out_dir_and_show_dir_match_mmseg(root, seg_cfg, toy_checkpoints, monkeypatch):
    seg_ckpt = toy_checkpoints.seg
    # mmseg's SegVisualizationHook logs at step=runner.iter, which builds the training loop and so
    # lists the training images (the config's relative data/toy_ade): both tools run in root
    monkeypatch.chdir(root)
    up_wd, our_wd = root / 'seg_up', root / 'seg_ours'
    up_out, our_out = root / 'seg_pred_up', root / 'seg_pred_ours'
    up_vis, our_vis = root / 'seg_vis_up', root / 'seg_vis_ours'
    run_upstream('mmseg', root, [seg_cfg, seg_ckpt, '--work-dir', up_wd, '--out', up_out,
                                 '--show-dir', up_vis] + data_args(root, 'seg'))
    assert test_tool.main([seg_cfg, seg_ckpt, '--work-dir', str(our_wd), '--out',
                           str(our_out), '--show-dir', str(our_vis)] + data_args(root, 'seg')) == 0
    assert_same_metrics(up_wd, our_wd)
    names = sorted(os.listdir(up_out))
    assert len(names) == 3 and all(n.endswith('.png') for n in names)
    assert sorted(os.listdir(our_out)) == names
    # both label maps against the class logits of the model's own forward here (same pipeline, one
    # image): equal except where two logits tie within compare.RTOL. mmseg's IoUMetric writes
    # label + 1 for a reduce_zero_label dataset.
    cfg = Config.fromfile(seg_cfg)
    model = checkpoint_model(cfg, seg_ckpt)
    offset = int(bool(cfg.test_dataloader.dataset.get('reduce_zero_label')))
    for n in names:
        a, b = (np.asarray(Image.open(d / n)) for d in (up_out, our_out))
        assert a.shape == b.shape == (64, 64), n
        img = root / 'data/toy_ade/images/validation' / (osp.splitext(n)[0] + '.jpg')
        logits = reference(cfg, model, str(img)).seg_logits.data
        compare.assert_same_label_maps(b.astype(np.int64) - offset, logits,
                                       a.astype(np.int64) - offset)
    # painted predictions: mmseg's visualizer save_dir, DIR/vis_image, one per image
    up_png, our_png = painted(up_vis, '**/vis_image/*.png'), painted(our_vis, '**/vis_image/*.png')
    assert len(up_png) == 3 and our_png == up_png


# --------------------------------------------------------------------------- --show (no display)
@pytest.mark.parametrize('kind, hook', [('det', 'DetVisualizationHook'),
                                       ('seg', 'SegVisualizationHook')])
def test_show_configures_the_hook_as_upstream(kind, hook, seg_cfg):
    """--show / --wait-time / --show-dir set what the toolbox's own trigger_visualization_hook sets
    (mmdet's in mmdet.engine.hooks.utils, mmseg's in its tools/test.py), compared on the config."""
    import importlib.util
    cfg_path = DET_CFG if kind == 'det' else seg_cfg
    if hook.startswith('Det'):
        from mmdet.engine.hooks.utils import trigger_visualization_hook as upstream
    else:
        spec = importlib.util.spec_from_file_location('mmseg_test_tool', upstream_script('mmseg'))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        upstream = mod.trigger_visualization_hook
    args = Namespace(show=True, wait_time=0.5, show_dir='painted', interval=None)
    expected = upstream(Config.fromfile(cfg_path), args)
    ours = Config.fromfile(cfg_path)
    test_tool.trigger_visualization_hook(ours, args)
    assert ours.default_hooks.visualization.type == hook
    assert ours.default_hooks.visualization.show is True
    assert ours.default_hooks.visualization.wait_time == 0.5
    assert ours.default_hooks.to_dict() == expected.default_hooks.to_dict()
    assert ours.visualizer.to_dict() == expected.visualizer.to_dict()
    parsed = test_tool.parse_args([cfg_path, 'x.pth', '--show', '--wait-time', '0.5'])
    assert parsed.show and parsed.wait_time == 0.5


# --------------------------------------------------------------------------- classification
@pytest.mark.slow  # three runs of each tool, ~60 s on the 2-core machine
def test_cls_out_show_dir_tta_and_metrics_match_mmpretrain(tmp_path):
    """mmpretrain's own test.py flags on a classification config: --show-dir (enabled on its
    VisualizationHook, every --interval-th image: was silently drawing nothing), --out x.pkl,
    --tta (its default flip TTA: was refused) and --out-item metrics (was refused)."""
    from tools.misc import make_toy_datasets as toy
    toy.make_toy_cls(str(tmp_path / 'toy_cls'), seed=2, train=2, val=4, size=64)
    cfg = Config.fromfile(CLS_CFG)
    assert 'tta_model' not in cfg and 'tta_pipeline' not in cfg
    ckpt = tmp_path / 'cls.pth'
    make_checkpoint(cfg, str(ckpt), seed=3, meta=dict(classes=('circle', 'square', 'triangle'),
                                                      palette=[(0, 0, 0)] * 3))
    data = ['--cfg-options', f'test_dataloader.dataset.data_root={tmp_path}/toy_cls/']
    runs = {'plain': ['--out', 'preds.pkl', '--show-dir', 'vis'], 'tta': ['--tta'],
            'metrics': ['--out', 'metrics.pkl', '--out-item', 'metrics']}
    for name, flags in runs.items():
        up, ours = tmp_path / f'{name}_up', tmp_path / f'{name}_ours'
        up.mkdir()
        ours.mkdir()
        run_upstream('mmpretrain', up, [CLS_CFG, ckpt, '--work-dir', up / 'wd'] + flags + data)
        cwd = os.getcwd()
        os.chdir(ours)  # relative --out / --show-dir as the upstream run in its folder
        try:
            assert test_tool.main([CLS_CFG, str(ckpt), '--work-dir', str(ours / 'wd')] + flags +
                                  data) == 0
        finally:
            os.chdir(cwd)
        assert_same_metrics(up / 'wd', ours / 'wd')
        if name == 'plain':
            a, b = load_pkl(up / 'preds.pkl'), load_pkl(ours / 'preds.pkl')
            assert len(a) == 4 and structure(b) == structure(a)
            assert_same_values(a, b)
            assert painted(up / 'vis', '*.png') == painted(ours / 'vis', '*.png')
            assert len(painted(ours / 'vis', '*.png')) == 4
        if name == 'metrics':
            a, b = load_pkl(up / 'metrics.pkl'), load_pkl(ours / 'metrics.pkl')
            # the same labels (compared in 'plain') give the same counts: exact to rounding
            assert set(a) == set(b) and all(b[k] == pytest.approx(a[k]) for k in a)
    # --tta with --show-dir: mmpretrain's hook cannot draw TTA batches (its tool stops with a
    # traceback); ours says so before anything runs
    assert test_tool.main([CLS_CFG, str(ckpt), '--work-dir', str(tmp_path / 'both'), '--tta',
                           '--show-dir', str(tmp_path / 'both_vis')] + data) == 2
    assert not (tmp_path / 'both').exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU rule of --amp')
def test_amp_runs_segmentation_and_refuses_detection_on_the_cpu(root, toy_checkpoints, capsys):
    """--amp (mmpretrain's flag: the test loop under autocast) on the CPU: a segmentor runs in
    bfloat16 and reports its metrics; a detector is refused up front with the reason (mmcv's CPU
    RoIAlign takes no bfloat16 and would stop at the first image)."""
    det_ckpt, seg_ckpt = toy_checkpoints.det, toy_checkpoints.seg
    assert test_tool.main([SEG_CFG, seg_ckpt, '--work-dir', str(root / 'amp_seg'), '--amp'] +
                          data_args(root, 'seg')) == 0
    assert 'mIoU' in read_metrics(str(root / 'amp_seg'))
    capsys.readouterr()
    assert test_tool.main([DET_CFG, det_ckpt, '--work-dir', str(root / 'amp_det'), '--amp'] +
                          data_args(root, 'det')) == 2
    assert 'bfloat16 autocast' in capsys.readouterr().err
