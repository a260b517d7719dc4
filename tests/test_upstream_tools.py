"""mmdet's and mmseg's own analysis tools on our configs, run the way their users run them:
``mim run mmdet|mmseg TOOL ...`` (openmim finds the script under
``site-packages/<pkg>/.mim/tools``).

What needs nothing from us: our configs carry ``custom_imports=dict(imports=['mmlinattn'])`` and
mmengine's ``Config.fromfile`` imports it while it reads the file, so the tools see our backbones
without an environment variable or a ``--cfg-options`` (which could not help anyway: the tools merge
``--cfg-options`` after ``Config.fromfile`` has done the imports).

Two mmseg 1.2.2 tools fail on their own side; each failure is pinned by a test (so that
docs/user_guide.md's note goes stale loudly when upstream or a compat patch fixes it) and the
workaround is tested (each failure is an ``xfail(strict=True)``, so a fix upstream shows as a
failure):

* ``browse_dataset`` crashes in ``SegLocalVisualizer._draw_sem_seg`` on any config: it builds its
  mask with ``np.zeros_like`` of the tool's permuted (non-contiguous) image and OpenCV refuses to
  draw on it (open-mmlab/mmsegmentation#3405);
* ``confusion_matrix`` reads the classes from the dataset *class* (``dataset.METAINFO``), which is
  empty for ``BaseSegDataset``, the type of the toy and custom-dataset configs (``KeyError:
  'classes'``). With ``reduce_zero_label`` (ADE20K's layout, mmseg's own ADE20K configs too) it
  subtracts 1 from labels the pipeline has already reduced, so the ignore value 255 becomes 254 and
  the matrix cannot be shaped (``ValueError: cannot reshape array``); and it reads predictions as
  train ids, while mmseg's ``test.py --out`` writes them + 1 (open-mmlab/mmsegmentation#1687).

openmim picks each script; the script runs in the tests' warm interpreter (tests/warm.py), which
spares the ~10 s of imports a new process pays on a 2-core machine; one test runs ``mim run`` as
a user types it.
"""
import importlib
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
from mmengine.config import Config
from PIL import Image

from tools import test as test_tool

import warm

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CFG = osp.join(ROOT, 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py')
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
MIM = shutil.which('mim', path=osp.dirname(sys.executable)) or shutil.which('mim')

pytestmark = pytest.mark.skipif(MIM is None,
                                reason='openmim (requirements/tests.txt) is not installed')

# the mmseg 1.2.2 failures documented in docs/user_guide.md (see the module docstring)
SEG_BROWSE_ERROR = 'Layout of the output array img is incompatible with cv::Mat'
SEG_CM_ERROR = "KeyError: 'classes'"


class UpstreamBug(Exception):
    """An upstream tool failed with its known bug (the tests marked ``xfail(strict=True)``)."""


def mim(cwd, *args, env=None, fresh=False):
    """``mim run ARGS`` in ``cwd`` (headless matplotlib); (exit code, stdout + stderr).

    openmim itself picks the script (its ``run`` command, called here with the command it would
    start captured) and the script runs in the tests' warm interpreter (tests/warm.py); ``fresh``
    runs ``mim run`` as a user types it, a new process."""
    e = dict(os.environ, MPLBACKEND='Agg', **(env or {}))
    if fresh:
        r = subprocess.run([MIM, 'run', *map(str, args)], cwd=str(cwd), env=e,
                           capture_output=True, text=True, timeout=600)
        return r.returncode, r.stdout + r.stderr
    mim_run = importlib.import_module('mim.commands.run')  # the module (mim.commands.run is
    # also the name of its function)
    started = []
    real = mim_run.subprocess
    mim_run.subprocess = types.SimpleNamespace(check_call=lambda cmd, **kw: started.append(cmd))
    try:
        mim_run.run(str(args[0]), str(args[1]), other_args=tuple(map(str, args[2:])))
    finally:
        mim_run.subprocess = real
    (cmd,) = started
    r = warm.run(cmd, cwd=cwd, env=e, timeout=600)
    return r.returncode, f'The command to call is {" ".join(cmd)}.\n' + r.stdout + r.stderr


def assert_ran(rc, out, pkg, script):
    """The upstream script (not one of ours) ran and finished."""
    tools_dir = osp.join(pkg, '.mim', 'tools')
    assert f'{tools_dir}{os.sep}{script}' in out, out[-3000:]
    assert rc == 0, out[-3000:]


def png_size(path):
    """(width, height) from the PNG signature and IHDR chunk; fails on anything that is not a
    PNG."""
    with open(path, 'rb') as f:
        head = f.read(24)
    assert head[:8] == b'\x89PNG\r\n\x1a\n' and head[12:16] == b'IHDR', f'{path} is not a PNG'
    return int.from_bytes(head[16:20], 'big'), int.from_bytes(head[20:24], 'big')


def decoded(path):
    with Image.open(path) as im:
        return np.asarray(im.convert('RGB')).astype(np.float32)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope='module')
def root(tmp_path_factory, toy_data):
    """The tools' working directory: ``data`` (the shared ``toy_data``, read-only) where the
    configs' relative data roots point, ``data/toy_coco`` and ``data/toy_ade``, so the tools run
    on the configs exactly as shipped."""
    r = tmp_path_factory.mktemp('upstream_tools')
    (r / 'data').symlink_to(toy_data, target_is_directory=True)
    return r


@pytest.fixture(scope='module')
def det_predictions(root, finished_det):
    """The shared finished toy Mask R-CNN's test predictions, dumped with ``tools/test.py --out``
    (a .pkl)."""
    assert finished_det.config == DET_CFG
    pkl = root / 'det_predictions.pkl'
    rc = test_tool.main([DET_CFG, finished_det.checkpoint, '--work-dir', str(root / 'test_det'),
                         '--out', str(pkl), '--cfg-options', *finished_det.options])
    assert rc == 0 and pkl.is_file()
    return pkl


def scalars_json(work_dir):
    """mmengine's ``<timestamp>/vis_data/scalars.json`` of the run in ``work_dir``."""
    (run,) = [d for d in os.listdir(work_dir)
              if osp.isdir(osp.join(work_dir, d)) and d[:8].isdigit()]
    return osp.join(work_dir, run, 'vis_data', 'scalars.json')


@pytest.fixture(scope='module')
def workaround(root):
    """The documented workaround for the two mmseg tool bugs: a module imported through the
    config's ``custom_imports`` that hands OpenCV a contiguous image and registers a dataset class
    carrying the config's classes, and a config on ours that uses both."""
    meta = Config.fromfile(SEG_CFG).test_dataloader.dataset.metainfo
    (root / 'seg_tool_fixes.py').write_text(
        'import numpy as np\n'
        'from mmseg.datasets import BaseSegDataset\n'
        'from mmseg.registry import DATASETS\n'
        'from mmseg.visualization import SegLocalVisualizer\n\n'
        '_draw = SegLocalVisualizer._draw_sem_seg\n\n\n'
        'def _draw_sem_seg(self, image, *args, **kwargs):\n'
        '    return _draw(self, np.ascontiguousarray(image), *args, **kwargs)\n\n\n'
        'SegLocalVisualizer._draw_sem_seg = _draw_sem_seg\n\n\n'
        '@DATASETS.register_module()\n'
        'class ToyShapesDataset(BaseSegDataset):\n'
        f'    METAINFO = dict(classes={tuple(meta.classes)!r}, palette={list(meta.palette)!r})\n\n'
        '    def __init__(self, *args, **kwargs):\n'
        '        super().__init__(*args, **kwargs)\n'
        '        # the pipeline reduces the labels; do not let confusion_matrix reduce them again\n'
        '        self.reduce_zero_label = False\n')
    cfg = root / 'fpn_mavit-t_toy-ade_tool-fixes.py'
    cfg.write_text(f'_base_ = {SEG_CFG!r}\n'
                   "custom_imports = dict(imports=['mmlinattn', 'seg_tool_fixes'], "
                   'allow_failed_imports=False)\n'
                   "train_dataloader = dict(dataset=dict(type='ToyShapesDataset'))\n"
                   "test_dataloader = dict(dataset=dict(type='ToyShapesDataset'))\n")
    return cfg, dict(PYTHONPATH=os.pathsep.join([str(root), os.environ.get('PYTHONPATH', '')]))


# --------------------------------------------------------------------------- browse_dataset
def _check_browsed(out_dir, src_dir, names, size=None):
    """One drawn picture per training image, decodable, not uniform; with ``size`` (a pipeline
    without random scaling), at that size and drawn on: it differs from the source image, flipped
    or not (the pipeline flips at random)."""
    assert sorted(os.listdir(out_dir)) == sorted(names)
    for name in names:
        drawn = decoded(osp.join(out_dir, name))
        assert drawn.ndim == 3 and drawn.std() > 10, name
        if size is None:
            continue
        assert drawn.shape[:2] == size, name
        with Image.open(osp.join(src_dir, name)) as im:
            src = np.asarray(im.convert('RGB').resize(size[::-1])).astype(np.float32)
        assert min(np.abs(drawn - src).mean(), np.abs(drawn - src[:, ::-1]).mean()) > 3, name


def test_mmdet_browse_dataset(root):
    rc, out = mim(root, 'mmdet', 'browse_dataset', DET_CFG, '--output-dir', 'browse_det',
                  '--not-show')
    assert_ran(rc, out, 'mmdet', 'analysis_tools/browse_dataset.py')
    with open(root / 'data/toy_coco/annotations/instances_train.json') as f:
        names = [im['file_name'] for im in json.load(f)['images']]
    # Resize to 128, the toy images are 48
    scale = Config.fromfile(DET_CFG).train_pipeline[2]['scale']
    _check_browsed(root / 'browse_det', root / 'data/toy_coco/train', names, tuple(scale))


@pytest.mark.xfail(strict=True, raises=UpstreamBug,
                   reason='mmseg 1.2.2 draws on a non-contiguous image: '
                          'https://github.com/open-mmlab/mmsegmentation/issues/3405')
def test_mmseg_browse_dataset(root):
    """mmseg's browse_dataset on our config. It crashes in mmseg 1.2.2's visualizer on any config;
    when it passes, upstream (or a compat patch) fixed it: update "Known upstream problems" in
    docs/user_guide.md and drop the mark. Any other failure fails the test."""
    rc, out = mim(root, 'mmseg', 'analysis_tools:browse_dataset', SEG_CFG, '--output-dir',
                  'browse_seg_plain', '--not-show')
    if rc != 0 and SEG_BROWSE_ERROR in out and '_draw_sem_seg' in out:
        raise UpstreamBug(SEG_BROWSE_ERROR)
    assert_ran(rc, out, 'mmseg', 'analysis_tools/browse_dataset.py')


def test_mmseg_browse_dataset_with_the_workaround(root, workaround):
    cfg, env = workaround
    rc, out = mim(root, 'mmseg', 'analysis_tools:browse_dataset', cfg, '--output-dir', 'browse_seg',
                  '--not-show', env=env)
    assert_ran(rc, out, 'mmseg', 'analysis_tools/browse_dataset.py')
    src = root / 'data/toy_ade/images/training'
    _check_browsed(root / 'browse_seg', src, os.listdir(src))  # RandomResize + RandomCrop: any size


# --------------------------------------------------------------------------- analyze_logs
def _check_plot(out, path, log, keys):
    for key in keys:
        assert f'plot curve of {log}, metric is {key}' in out, out[-3000:]
    assert osp.getsize(path) > 1000


def test_mmdet_analyze_logs_plot_curve(root, finished_det):
    """mmdet's analyze_logs on our detection training log; the PNG has matplotlib's default size."""
    import matplotlib
    log = scalars_json(finished_det.work_dir)
    rc, out = mim(root, 'mmdet', 'analyze_logs', 'plot_curve', log, '--keys', 'loss', 'loss_mask',
                  '--out', 'curve_det.png')
    assert_ran(rc, out, 'mmdet', 'analysis_tools/analyze_logs.py')
    _check_plot(out, root / 'curve_det.png', log, ('loss', 'loss_mask'))
    w, h = matplotlib.rcParamsDefault['figure.figsize']
    assert png_size(root / 'curve_det.png') == (round(w * 100), round(h * 100))
    assert decoded(root / 'curve_det.png').std() > 10


def test_mmseg_analyze_logs(root, finished_seg):
    """mmseg's analyze_logs (no ``plot_curve`` sub-command: the log comes first) on our segmentation
    log, loss and the validation's mIoU, to a PDF."""
    log = scalars_json(finished_seg.work_dir)
    rc, out = mim(root, 'mmseg', 'analyze_logs', log, '--keys', 'loss', 'mIoU', '--out',
                  'curve_seg.pdf')
    assert_ran(rc, out, 'mmseg', 'analysis_tools/analyze_logs.py')
    _check_plot(out, root / 'curve_seg.pdf', log, ('loss', 'mIoU'))
    data = (root / 'curve_seg.pdf').read_bytes()
    assert data.startswith(b'%PDF-') and data.rstrip().endswith(b'%%EOF')


# --------------------------------------------------------------------------- confusion_matrix
def test_mmdet_confusion_matrix(root, det_predictions):
    """From tools/test.py's ``--out`` pickle; the figure has one row and column per class plus
    background, and mmdet sizes it by that count: 0.5 x 0.4 inches per row at 180 dpi."""
    rc, out = mim(root, 'mmdet', 'confusion_matrix', DET_CFG, det_predictions, 'cm_det')
    assert_ran(rc, out, 'mmdet', 'analysis_tools/confusion_matrix.py')
    rows = len(Config.fromfile(DET_CFG).test_dataloader.dataset.metainfo.classes) + 1
    assert png_size(root / 'cm_det/confusion_matrix.png') == (round(0.5 * rows * 180),
                                                             round(0.4 * rows * 180))
    assert decoded(root / 'cm_det/confusion_matrix.png').std() > 10


@pytest.fixture(scope='module')
def seg_predictions(root):
    """Predictions as mmseg's confusion_matrix reads them: one PNG of train ids per validation image
    (here the ground truth itself, label - 1 as ``reduce_zero_label`` maps it)."""
    out = root / 'seg_predictions'
    out.mkdir()
    ann = root / 'data/toy_ade/annotations/validation'
    for name in sorted(os.listdir(ann)):
        label = np.asarray(Image.open(ann / name)).astype(np.int64) - 1
        Image.fromarray(np.clip(label, 0, None).astype(np.uint8)).save(out / name)
    return out


@pytest.mark.xfail(strict=True, raises=UpstreamBug,
                   reason="mmseg 1.2.2 reads the classes from the dataset class's METAINFO "
                          '(no upstream report found; the line: https://github.com/open-mmlab/'
                          'mmsegmentation/blob/v1.2.2/tools/analysis_tools/confusion_matrix.py#L57)')
def test_mmseg_confusion_matrix_on_a_basesegdataset_config(root, seg_predictions):
    """mmseg's confusion_matrix on our config. mmseg 1.2.2 takes the classes from
    ``dataset.METAINFO`` (the class attribute), empty for BaseSegDataset configs; when this passes,
    update "Known upstream problems" in docs/user_guide.md and drop the mark."""
    rc, out = mim(root, 'mmseg', 'confusion_matrix', SEG_CFG, seg_predictions, 'cm_seg_plain')
    if rc != 0 and SEG_CM_ERROR in out and 'METAINFO' in out:
        raise UpstreamBug(SEG_CM_ERROR)
    assert_ran(rc, out, 'mmseg', 'analysis_tools/confusion_matrix.py')


def full_cells(path, cmap):
    """(x, y) centres of the cells drawn in the colour map's top colour (100 %), top to bottom: the
    pixels of that colour, less the colour bar (their rightmost run of columns), grouped by the
    runs of rows they fill (grid lines separate the cells)."""
    import matplotlib

    def runs(idx):
        return np.split(idx, np.nonzero(np.diff(idx) > 1)[0] + 1) if len(idx) else []
    rgb = decoded(path)
    top = np.array(matplotlib.colormaps[cmap](1.0)[:3]) * 255
    mask = np.abs(rgb - top).sum(-1) < 6
    mask[:, runs(np.nonzero(mask.any(0))[0])[-1][0]:] = False  # the colour bar's top end
    return [(mask[r].nonzero()[1].mean(), r.mean()) for r in runs(np.nonzero(mask.any(1))[0])]


def test_mmseg_confusion_matrix_with_the_workaround(root, seg_predictions, workaround):
    """The matrix is classes x classes (mmseg sizes the figure 2 x 1.6 inches per class at 300 dpi)
    and, the predictions being the ground truth, diagonal: one 100 % cell per class present in the
    validation labels, each one cell right of and below the previous."""
    cfg, env = workaround
    rc, out = mim(root, 'mmseg', 'confusion_matrix', cfg, seg_predictions, 'cm_seg', env=env)
    assert_ran(rc, out, 'mmseg', 'analysis_tools/confusion_matrix.py')
    n = len(Config.fromfile(SEG_CFG).test_dataloader.dataset.metainfo.classes)
    png = root / 'cm_seg/confusion_matrix.png'
    assert png_size(png) == (round(2 * n * 300), round(1.6 * n * 300))
    ann = root / 'data/toy_ade/annotations/validation'
    present = set().union(*(np.unique(np.asarray(Image.open(ann / f))).tolist()
                            for f in os.listdir(ann)))
    cells = full_cells(png, 'winter')  # the tool's default --color-theme
    assert len(cells) == len(present - {0})  # label 0 is the unlabelled rim (ignored)
    xs, ys = np.array(cells).T
    assert (np.diff(ys) > 0).all() and np.allclose(np.diff(xs), np.diff(ys), rtol=0.05), cells


# --------------------------------------------------------------------------- print_config
def test_mmdet_print_config(root):
    """The whole config with our backbone, and ``--save-path`` dumps one that reads back the
    same."""
    rc, out = mim(root, 'mmdet', 'print_config', DET_CFG, '--save-path', 'printed/det.py',
                  fresh=True)  # one ``mim run`` as a user types it
    assert_ran(rc, out, 'mmdet', 'misc/print_config.py')
    backbone = Config.fromfile(DET_CFG).model.backbone
    assert f"type='{backbone.type}'" in out and f"arch='{backbone.arch}'" in out
    printed = Config.fromfile(str(root / 'printed/det.py'))
    assert printed.model.backbone.to_dict() == backbone.to_dict()


def test_mmseg_print_config_graph(root):
    """``--graph`` builds the model with mmseg's ``init_model``: our backbone is in the printed
    graph (mmseg writes example.py and example-graph.txt into the working directory)."""
    cwd = root / 'print_seg'
    cwd.mkdir()
    rc, out = mim(cwd, 'mmseg', 'print_config', SEG_CFG, '--graph')
    assert_ran(rc, out, 'mmseg', 'misc/print_config.py')
    backbone = Config.fromfile(SEG_CFG).model.backbone
    assert f"type='{backbone.type}'" in out and 'Model graph:' in out
    graph = (cwd / 'example-graph.txt').read_text()
    assert graph.startswith('LinAttnEncoderDecoder(') and f'(backbone): {backbone.type}(' in graph
    assert Config.fromfile(str(cwd / 'example.py')).model.backbone.to_dict() == backbone.to_dict()


# --------------------------------------------------------------------------- get_flops
def test_get_flops_num_images_reads_the_images_mmdets_tool_reads(root, monkeypatch, capsys):
    """``--num-images`` and ``--cfg-options``, mmdet's flags, in our get_flops.py: the same
    validation images at the same input size and the same parameter count as mmdet's own tool on
    the same config (the FLOPs differ by design: ours count the attention products and the RoI
    heads on 1000 boxes, docs/benchmarks.md section 3)."""
    args = [DET_CFG, '--num-images', '2', '--cfg-options', 'model.backbone.drop_path_rate=0.0']
    rc, out = mim(root, 'mmdet', 'get_flops', *args)
    assert_ran(rc, out, 'mmdet', 'analysis_tools/get_flops.py')
    theirs_shape = re.search(r'Input shape: (\(\d+, \d+\))', out).group(1)
    theirs_params = float(re.search(r'Params: ([\d.]+)M', out).group(1))
    from tools.analysis_tools import get_flops
    monkeypatch.chdir(root)
    assert get_flops.main(args) == 0
    ours = capsys.readouterr().out
    m = re.search(r'over 2 validation image\(s\), input sizes \(H, W\) (.+): params ([\d.]+) M, '
                  r'mean FLOPs ([\d.]+) G', ours)
    assert m, ours
    assert m.group(1) == theirs_shape
    assert abs(float(m.group(2)) - theirs_params) < 0.006
