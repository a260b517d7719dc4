"""A trained model in OpenMMLab's inferencers: mmdet's DetInferencer and mmseg's MMSegInferencer run
our configs - every config type (Mask R-CNN, Cascade, RetinaNet, Semantic FPN, UperNet), every
backbone family - on an image path, a numpy array and a folder, with no registry-scope warning, and
give what the model's own forward gives on the toolbox's test pipeline. Then tools/image_demo.py and
the demo's pictures (mmlinattn.apis.inference). Checkpoints are made here from freshly built
models (the smallest size of each config type, two of them narrower: ``SMALLER``); the test
pipelines are resized to 128 px and the detectors keep few proposals and detections to keep it
fast."""
import copy
import glob
import importlib
import json
import logging
import os
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config

import compare

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

# (config, task): the smallest backbone of each config type; the three families all appear
# (Cascade's smallest zoo backbone, MAViT-S, runs as MAViT-T: see SMALLER)
CASES = [
    ('configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py', 'det'),
    ('configs/mavit/cascade-mask-rcnn_mavit-s_fpn_ms-3x_coco.py', 'det'),
    ('configs/inline_swin/retinanet_inline-swin-t_fpn_1x_coco.py', 'det'),
    ('configs/inline_pvt/fpn_inline-pvt-t_80k_ade20k-512x512.py', 'seg'),  # PVT's AlignResize test
    ('configs/mavit/upernet_mavit-t_160k_ade20k-512x512.py', 'seg'),
]
TOY_DET = 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py'
TOY_SEG = 'configs/toy/fpn_mavit-t_toy-ade.py'
TOY_CLS = 'configs/toy/mavit-t_toy-cls.py'


# ------------------------------------------------------------------------------------------ helpers
def scene(h, w, seed):
    """A BGR image with a few filled shapes on a noisy background."""
    import cv2
    rng = np.random.default_rng(seed)
    img = rng.integers(60, 120, (h, w, 3), dtype=np.uint8)
    for _ in range(3):
        c = tuple(int(v) for v in rng.integers(0, 255, 3))
        x, y = int(rng.integers(15, w - 15)), int(rng.integers(15, h - 15))
        r = int(rng.integers(6, 14))
        if rng.random() < 0.5:
            cv2.circle(img, (x, y), r, c, -1)
        else:
            cv2.rectangle(img, (x - r, y - r), (x + r, y + r), c, -1)
    return img


@pytest.fixture(scope='module')
def images(tmp_path_factory):
    """A folder with two images of odd sizes (one larger, one smaller than the test size)."""
    import cv2
    folder = tmp_path_factory.mktemp('images')
    paths = [str(folder / 'a.png'), str(folder / 'b.jpg')]
    cv2.imwrite(paths[0], scene(120, 160, 0))  # both are resized by the 128 px test pipeline
    cv2.imwrite(paths[1], scene(80, 112, 1))
    return str(folder), paths


# test-time settings: every score threshold 0 (a random model then returns detections to compare),
# fewer proposals and detections (1000 proposals through Cascade's three 4conv1fc heads cost
# ~100 GFLOPs per stage and image)
TEST_CFG = dict(score_thr=0.0, max_per_img=20, nms_pre=100)
# a two-stage detector's proposals, each through the bbox head (Cascade: three 4conv1fc heads),
# and its final detections, each through the mask head (Cascade: through all three, four 3x3 convs
# at 14x14x256 each), which at 20 and 20 were most of the Cascade case
RPN_MAX_PER_IMG, RCNN_MAX_PER_IMG = 10, 5
# narrower models where the width is not what an inferencer test checks (the same classes, code
# and pipeline; the zoo's own sizes are built and counted in test_configs.py): Cascade with the
# MAViT-T backbone (its neck reading MAViT-T's channels), UperNet's head at 128 channels instead
# of 512 (its 3x3 fusion conv, 4 x 512 -> 512 at 1/4 scale, was most of that case)
SMALLER = {
    'configs/mavit/cascade-mask-rcnn_mavit-s_fpn_ms-3x_coco.py': {
        'model.backbone.arch': 'tiny', 'model.neck.in_channels': [64, 128, 256, 512]},
    'configs/mavit/upernet_mavit-t_160k_ade20k-512x512.py': {'model.decode_head.channels': 128},
}


def small_test_config(path, size=128):
    """The config with its test resize at ``size`` px (instead of 1333x800 / 2048x512), the
    detectors' ``test_cfg`` as :data:`TEST_CFG` (a two-stage detector's proposals and final
    detections: :data:`RPN_MAX_PER_IMG`, :data:`RCNN_MAX_PER_IMG`) and the overrides of
    :data:`SMALLER`."""
    cfg = Config.fromfile(osp.join(ROOT, path))
    cfg.merge_from_dict(SMALLER.get(path, {}))
    for t in cfg.test_dataloader.dataset.pipeline:
        if t['type'] == 'Resize':
            t['scale'] = (size, size)

    def shrink(d):
        if isinstance(d, dict):
            for k, v in d.items():
                if k in TEST_CFG:
                    d[k] = TEST_CFG[k]
                else:
                    shrink(v)
        elif isinstance(d, list):
            for v in d:
                shrink(v)
    shrink(cfg.model.get('test_cfg'))
    if 'rcnn' in cfg.model.get('test_cfg', {}):
        cfg.model.test_cfg.rpn.max_per_img = RPN_MAX_PER_IMG
        cfg.model.test_cfg.rcnn.max_per_img = RCNN_MAX_PER_IMG
    return cfg


def registry(cfg, name):
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    return getattr(importlib.import_module(cfg.default_scope + '.registry'), name)


def make_checkpoint(cfg, path, seed=0, meta=None, record_cfg=False):
    """A freshly built model of the config, saved as the Runner would (weights + dataset meta:
    ``meta``, default the test dataset class's METAINFO; with ``record_cfg``, the config's text as
    ``meta['cfg']``, as the Runner records it)."""
    torch.manual_seed(seed)
    model = registry(cfg, 'MODELS').build(cfg.model).eval()
    meta = meta or registry(cfg, 'DATASETS').get(cfg.test_dataloader.dataset.type).METAINFO
    info = {'dataset_meta': {'classes': list(meta['classes']),
                             'palette': [list(p) for p in meta['palette']]}}
    if record_cfg:
        info['cfg'] = cfg.pretty_text
    from mmengine.runner.checkpoint import get_state_dict

    from mmlinattn.core.models.backbones.base import record_trained_as
    state = get_state_dict(model)
    record_trained_as(model, state)  # as the runtime's RunChecksHook records it at a save
    torch.save({'state_dict': state, 'meta': info}, path)
    return model


def checkpoint_model(cfg, path):
    """The config's model with the weights of the checkpoint at ``path`` (strict), in eval mode:
    what a tool runs from that file."""
    model = registry(cfg, 'MODELS').build(cfg.model).eval()
    model.load_state_dict(torch.load(path, map_location='cpu', weights_only=True)['state_dict'])
    return model


def reference(cfg, model, img_path):
    """The model's own forward on the toolbox's test pipeline (without its annotation loading)."""
    from mmengine.dataset import Compose, pseudo_collate
    transforms = registry(cfg, 'TRANSFORMS')
    pipeline = Compose([transforms.build(t) for t in cfg.test_dataloader.dataset.pipeline
                        if t['type'] != 'LoadAnnotations'])
    data = pipeline(dict(img_path=img_path, img_id=0))
    with torch.no_grad():
        return model.test_step(pseudo_collate([data]))[0]


class WarningLog(logging.Handler):
    """Collects what mmengine logs at WARNING and above."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def mmengine_warnings():
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    handler = WarningLog()
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def rle_decode(rle):
    from pycocotools import mask as mask_util
    return mask_util.decode(dict(size=rle['size'], counts=rle['counts'].encode()))


def assert_same_detections(got, want, hw, rules):
    """``got``: DetInferencer's dict; ``want``: the reference ``pred_instances``; ``rules``: the
    detector's test-time thresholds (compare.detection_rules). The inferencer runs the same
    forward on the same shapes as the reference, so the order of the sums is the same; the
    comparison still allows summation-order noise (compare.py) so that it holds on any CPU and
    thread count. The masks are compared exactly when the boxes are: a pixel's mask is the
    same thresholded logit in both runs."""
    assert len(got['labels']) > 0 and len(want.bboxes) > 0
    pairs = compare.assert_same_detections(got, want, **rules)
    boxes = np.array(got['bboxes']).reshape(-1, 4)  # x1, y1, x2, y2 in the original image
    assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] <= hw[1] + 1e-3).all()
    assert (boxes[:, 1] >= 0).all() and (boxes[:, 3] <= hw[0] + 1e-3).all()
    if 'masks' in want:
        assert len(got['masks']) == len(got['labels'])
        decoded = np.stack([rle_decode(m) for m in got['masks']]).astype(bool)
        assert decoded.shape[1:] == hw
        want_masks = want.masks.numpy().astype(bool)
        for i, j in pairs:
            # a matched detection's mask: the same up to pixels whose mask probability sits at
            # mmdet's 0.5 binarisation threshold within compare.RTOL (a few at most)
            differ = decoded[j] != want_masks[i]
            assert differ.mean() < 1e-3, f'detection {j}: {int(differ.sum())} mask pixels differ'
    else:
        assert 'masks' not in got


# ------------------------------------------------------------------------------------ inferencers
@pytest.mark.parametrize('config,task', CASES, ids=[osp.basename(c)[:-3] for c, _ in CASES])
def test_inferencer_runs_config(config, task, images, tmp_path, mmengine_warnings):
    import mmcv
    folder, paths = images
    cfg = small_test_config(config)
    ckpt = str(tmp_path / 'model.pth')
    model = make_checkpoint(cfg, ckpt)
    from mmlinattn.core.registry import add_function_registries
    add_function_registries((cfg.default_scope,))  # as build_inferencer does (scope resolved)
    if task == 'det':
        from mmdet.apis import DetInferencer
        inferencer = DetInferencer(model=copy.deepcopy(cfg), weights=ckpt, device='cpu',
                                   show_progress=False)
    else:
        from mmseg.apis import MMSegInferencer
        inferencer = MMSegInferencer(model=copy.deepcopy(cfg), weights=ckpt, device='cpu')
        inferencer.show_progress = False
    # the checkpoint's weights and classes are the ones in use
    loaded = inferencer.model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    assert len(inferencer.model.dataset_meta['classes']) == (80 if task == 'det' else 150)

    want = {p: reference(cfg, model, p) for p in paths}
    hw = mmcv.imread(paths[0]).shape[:2]
    on_path = inferencer(paths[0])['predictions']
    on_array = inferencer(mmcv.imread(paths[0]))['predictions']  # BGR, as mmcv / cv2 read it
    on_folder = inferencer(folder, return_datasamples=True)
    on_folder = on_folder['predictions'] if isinstance(on_folder, dict) else on_folder
    assert sorted(s.img_path for s in on_folder) == sorted(paths)
    if task == 'det':
        rules = compare.detection_rules(cfg)
        assert_same_detections(on_path[0], want[paths[0]].pred_instances, hw, rules)
        assert_same_detections(on_array[0], want[paths[0]].pred_instances, hw, rules)
        for s in on_folder:
            compare.assert_same_detections(s, want[s.img_path], **rules, what=s.img_path)
    else:
        ref = want[paths[0]].pred_sem_seg.data[0].numpy()
        assert on_path.shape == on_array.shape == hw == ref.shape
        assert on_path.min() >= 0 and on_path.max() < 150
        logits = want[paths[0]].seg_logits.data
        compare.assert_same_label_maps(on_path, logits, ref)
        compare.assert_same_label_maps(on_array, logits)
        for s in on_folder:
            compare.assert_same_label_maps(s.pred_sem_seg.data[0].numpy(),
                                           want[s.img_path].seg_logits.data)
    scope_warnings = [m for m in mmengine_warnings if 'Failed to search registry' in m]
    assert not scope_warnings, scope_warnings


def test_inferencer_scope_warning_cause():
    """The cause of the warning: mmengine's BaseInferencer looks up the collate function in the
    'function' registry under the inferencer's scope, and mmdet / mmseg define no such registry.
    ``import mmlinattn`` leaves that as it is (it changes nothing it does not own);
    :func:`mmlinattn.core.registry.add_function_registries`, called where we build an inferencer
    (and by the test above), adds their (empty) children, which fall back to mmengine's
    functions."""
    from mmengine.dataset import pseudo_collate
    from mmengine.registry import FUNCTIONS

    import mmlinattn  # noqa: F401
    from mmlinattn.core.registry import add_function_registries
    add_function_registries()
    for scope in ('mmdet', 'mmseg'):
        assert not hasattr(importlib.import_module(scope + '.registry'), 'FUNCTIONS')
        assert scope in FUNCTIONS.children
        with FUNCTIONS.switch_scope_and_registry(scope) as reg:
            assert reg.scope == scope and reg.get('pseudo_collate') is pseudo_collate
    assert add_function_registries() == []  # idempotent


# ------------------------------------------------------------------------ image_demo and pictures
@pytest.fixture(scope='module')
def demo_checkpoints(tmp_path_factory):
    """The pictures' models: the toy Mask R-CNN (the demo draws masks, which the shared
    ``toy_checkpoints``' RetinaNet has none of) and Semantic FPN, with the model objects the
    expected pictures are computed from."""
    folder = tmp_path_factory.mktemp('toy_ckpt')
    out = {}
    for name, config in (('det', TOY_DET), ('seg', TOY_SEG)):
        cfg = Config.fromfile(osp.join(ROOT, config))
        path = str(folder / f'{name}.pth')
        model = make_checkpoint(cfg, path, meta=cfg.test_dataloader.dataset.metainfo)
        out[name] = (config, cfg, model, path)
    return out


def image_demo(*args):
    from tools import image_demo as tool
    return tool.main([str(a) for a in args])


@pytest.mark.parametrize('task', ['det', 'seg'])
def test_image_demo_writes_pictures_and_json(task, images, demo_checkpoints, tmp_path, capsys):
    import mmcv
    folder, paths = images
    config, cfg, model, ckpt = demo_checkpoints[task]
    out = tmp_path / 'out'
    assert image_demo(folder, osp.join(ROOT, config), ckpt, '--out-dir', out, '--score-thr',
                      0.05) == 0
    assert 'picture(s) in' in capsys.readouterr().out
    for p in paths:
        name, stem = osp.basename(p), osp.splitext(osp.basename(p))[0]
        drawn = mmcv.imread(str(out / 'vis' / name))
        assert drawn.shape[:2] == mmcv.imread(p).shape[:2]
        with open(out / 'preds' / f'{stem}.json') as f:
            pred = json.load(f)
        want = reference(cfg, model, p)
        if task == 'det':
            compare.assert_same_detections(pred, want, **compare.detection_rules(cfg), what=p)
        else:
            label = mmcv.imread(str(out / 'preds' / pred['label_map']), flag='unchanged')
            ref = want.pred_sem_seg.data[0].numpy()
            compare.assert_same_label_maps(label, want.seg_logits.data, ref)
            classes = cfg.test_dataloader.dataset.metainfo['classes']
            ids, counts = np.unique(label, return_counts=True)  # the JSON counts its own map
            assert pred['pixels'] == {classes[i]: int(c) for i, c in zip(ids, counts)}
            assert (pred['height'], pred['width']) == ref.shape
    assert not [d for d in os.listdir(tmp_path) if d.startswith('.image_demo-')]


@pytest.mark.parametrize('cuda', [True, False])
def test_image_demo_device_defaults_to_cuda_where_there_is_one(cuda, images, demo_checkpoints,
                                                              monkeypatch):
    """As mmdet's demo: the model goes to cuda:0 when torch sees a GPU, else to the CPU; an
    explicit --device wins either way."""
    import torch

    from tools import image_demo as tool

    class Built(Exception):
        pass

    def build(cfg, checkpoint, device):
        raise Built(device)
    monkeypatch.setattr(tool, 'build_inferencer', build)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: cuda)
    folder, _ = images
    config, _, _, ckpt = demo_checkpoints['det']
    args = [str(folder), osp.join(ROOT, config), ckpt]
    with pytest.raises(Built, match='^cuda:0$' if cuda else '^cpu$'):
        tool.main(args)
    with pytest.raises(Built, match='^cpu$'):
        tool.main(args + ['--device', 'cpu'])


@pytest.mark.parametrize('task', ['det', 'seg'])
def test_image_demo_takes_mmdets_and_mmsegs_demo_flags(task, images, demo_checkpoints, tmp_path,
                                                      capsys, monkeypatch):
    """mmdet's demo form (IMAGE CONFIG --weights CKPT, --pred-score-thr, --batch-size,
    --no-save-vis, --no-save-pred, --print-result, --show) and mmseg's (--out-file, --opacity,
    --with-labels), each with its effect; the predictions are still the model's own (checked
    against its forward on the toolbox's test pipeline)."""
    import mmcv
    from mmengine.visualization import Visualizer
    folder, paths = images
    config, cfg, model, ckpt = demo_checkpoints[task]
    config = osp.join(ROOT, config)
    shown = []
    monkeypatch.setattr(Visualizer, 'show', lambda self, *a, **k: shown.append(a[0].shape))
    out = tmp_path / 'a'
    assert image_demo(folder, config, '--weights', ckpt, '--pred-score-thr', 0.05,
                      '--batch-size', 2, '--no-save-vis', '--print-result', '--show',
                      '--out-dir', out) == 0
    printed = capsys.readouterr().out
    assert not (out / 'vis').exists() and len(shown) == len(paths)
    for p in paths:
        stem = osp.splitext(osp.basename(p))[0]
        with open(out / 'preds' / f'{stem}.json') as f:
            pred = json.load(f)
        want = reference(cfg, model, p)
        # --batch-size 2: the two images go through the network as one padded batch, which sums in
        # another order than the reference's one image alone (compare.py: what that can change)
        if task == 'det':
            compare.assert_same_detections(pred, want, **compare.detection_rules(cfg), what=p)
        else:
            label = mmcv.imread(str(out / 'preds' / pred['label_map']), flag='unchanged')
            compare.assert_same_label_maps(label, want.seg_logits.data)
    assert ('scores' if task == 'det' else '"pixels"') in printed
    # one image, its picture at --out-file, nothing else kept but vis/
    pictures = []
    # two opacities for the segmentor; the detector takes no --opacity, so it runs once (a second
    # run would repeat the first's arguments)
    for opacity in (['--opacity', 0.2], ['--opacity', 1.0])[:2 if task == 'seg' else 1]:
        out_file = tmp_path / f'one{opacity[1]}.png'
        out = tmp_path / f'b{opacity[1]}'
        extra = opacity + ['--with-labels'] if task == 'seg' else []
        assert image_demo(paths[0], config, ckpt, '--out-file', out_file, '--no-save-pred',
                          '--out-dir', out, *extra) == 0
        assert not (out / 'preds').exists()
        drawn = mmcv.imread(str(out_file))
        np.testing.assert_array_equal(drawn, mmcv.imread(str(out / 'vis' / osp.basename(paths[0]))))
        assert drawn.shape[:2] == mmcv.imread(paths[0]).shape[:2]
        pictures.append(drawn)
    if task == 'seg':  # the overlay's opacity reaches the drawing
        assert np.abs(pictures[0].astype(int) - pictures[1].astype(int)).mean() > 1
    for bad in (['--weights', tmp_path / 'other.pth'], ['--opacity', 1.5]):
        with pytest.raises(SystemExit):
            image_demo(paths[0], config, ckpt, *bad)
    with pytest.raises(SystemExit):
        image_demo(paths[0], config)  # no checkpoint
    assert image_demo(folder, config, ckpt, '--out-file', tmp_path / 'x.png') == 2
    assert '--out-file takes one image' in capsys.readouterr().err


def test_image_demo_bad_input(images, demo_checkpoints, tmp_path, capsys):
    """Each bad input: one message naming it, exit code 2, nothing written."""
    folder, paths = images
    config, _, _, ckpt = demo_checkpoints['det']
    not_an_image = tmp_path / 'notes.jpg'
    not_an_image.write_text('not an image')
    empty = tmp_path / 'empty'
    empty.mkdir()
    _, _, _, seg_ckpt = demo_checkpoints['seg']
    cases = [
        ((tmp_path / 'missing.jpg', config, ckpt), 'image not found'),
        ((not_an_image, config, ckpt), 'cannot read as an image'),
        ((empty, config, ckpt), 'no image'),
        ((paths[0], osp.join(ROOT, TOY_CLS), ckpt), "default_scope='mmpretrain'"),
        ((paths[0], config, tmp_path / 'missing.pth'), 'checkpoint not found'),
        ((paths[0], config, not_an_image), 'not a readable torch checkpoint'),
        ((paths[0], config, seg_ckpt), 'does not fit'),
    ]
    for args, message in cases:
        out = tmp_path / 'out'
        capsys.readouterr()
        assert image_demo(*args, '--out-dir', out) == 2, message
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert err[0].startswith('image_demo.py: error:'), err
        assert not out.exists(), message
        assert not [d for d in os.listdir(tmp_path) if d.startswith('.image_demo-')]


def write_toy_val_sets(root):
    """A toy COCO and a toy ADE20K layout under ``root/data`` (the toy configs' relative data
    roots) with two 128 px validation images, each with one square."""
    import cv2
    coco = root / 'data' / 'toy_coco'
    (coco / 'val').mkdir(parents=True)
    (coco / 'annotations').mkdir()
    ade = root / 'data' / 'toy_ade'
    (ade / 'images' / 'validation').mkdir(parents=True)
    (ade / 'annotations' / 'validation').mkdir(parents=True)
    imgs, anns = [], []
    for i in range(2):
        img = scene(128, 128, i)
        cv2.rectangle(img, (20, 30), (60, 70), (0, 200, 0), -1)
        cv2.imwrite(str(coco / 'val' / f'v{i}.jpg'), img)
        cv2.imwrite(str(ade / 'images' / 'validation' / f'v{i}.jpg'), img)
        label = np.ones((128, 128), np.uint8)
        label[30:71, 20:61] = 3
        cv2.imwrite(str(ade / 'annotations' / 'validation' / f'v{i}.png'), label)
        imgs.append(dict(id=i, file_name=f'v{i}.jpg', height=128, width=128))
        anns.append(dict(id=i + 1, image_id=i, category_id=2, bbox=[20, 30, 40, 40], area=1600,
                         iscrowd=0, segmentation=[[20, 30, 60, 30, 60, 70, 20, 70]]))
    cats = [dict(id=k + 1, name=n) for k, n in enumerate(('circle', 'square', 'triangle'))]
    with open(coco / 'annotations' / 'instances_val.json', 'w') as f:
        json.dump(dict(images=imgs, annotations=anns, categories=cats), f)
    return [str(coco / 'val' / f'v{i}.jpg') for i in range(2)]


def test_draw_val_predictions(demo_checkpoints, tmp_path, monkeypatch):
    """The demo's pictures: ground truth | prediction drawn by mmdet's / mmseg's visualizer, on the
    config's validation images (a two-image toy set made here), under a caption strip.

    The detector's config goes in as a loaded Config with 10 detections per image instead of the
    toy config's 100 (mmdet's visualizer drew each of 100 masks at 384 px: ~3 s of the test); the
    path form of the detector's config is the next test's."""
    import mmcv

    from mmlinattn.apis.inference import draw_val_predictions
    write_toy_val_sets(tmp_path)
    monkeypatch.chdir(tmp_path)  # the toy configs' data roots are relative (data/toy_*)
    for task in ('det', 'seg'):
        config, cfg, model, ckpt = demo_checkpoints[task]
        out = tmp_path / f'pictures_{task}'
        config = osp.join(ROOT, config)
        if task == 'det':
            config = Config.fromfile(config)
            config.model.test_cfg.rcnn.max_per_img = 10
        pictures = draw_val_predictions(config, ckpt, str(out), num_images=5, score_thr=0.05)
        assert sorted(osp.basename(p.path) for p in pictures) == ['v0.png', 'v1.png']
        drawn = mmcv.imread(pictures[0].path, channel_order='rgb')
        # the caption strip on top, then ground truth and prediction side by side, each enlarged
        # to 384 px (3 x 128)
        strip = drawn.shape[0] - 384
        assert 20 < strip < 100 and drawn.shape[1:] == (768, 3)
        assert (drawn[:strip] > 200).mean() > 0.8 and (drawn[:strip] < 100).any()  # text on white
        drawn = drawn[strip:]
        left, right = drawn[:, :384].astype(int), drawn[:, 384:].astype(int)
        assert np.abs(left - right).mean() > 1  # two different drawings
        if task == 'seg':
            assert pictures[0].caption == ['ground truth', 'prediction: the class of each pixel']
            # the ground truth's square (class 3 after reduce_zero_label: 2, 'square') is overlaid
            # in the palette's square colour
            palette = np.array(cfg.test_dataloader.dataset.metainfo['palette'][2])
            inside = left[100:200, 70:170].reshape(-1, 3).mean(0)
            outside = left[250:350, 250:350].reshape(-1, 3).mean(0)
            assert np.abs(inside - palette).sum() < np.abs(outside - palette).sum()
    assert sorted(glob.glob(str(tmp_path / 'pictures_*' / '*.png')))


def test_draw_val_predictions_states_its_score_threshold(demo_checkpoints, tmp_path, monkeypatch):
    """The detector's picture draws exactly the detections with score >= score_thr, and its caption
    says so: "K of M detections, score >= thr", the number and score range of those not drawn.
    Expected from the model's own forward on each image (:func:`reference`), the drawn boxes from
    what mmdet's visualizer is handed to draw (its ``_draw_instances``: ground truth, then
    prediction)."""
    import re

    from mmdet.visualization import DetLocalVisualizer

    from mmlinattn.apis.inference import draw_val_predictions
    images = write_toy_val_sets(tmp_path)
    monkeypatch.chdir(tmp_path)
    config, cfg, model, ckpt = demo_checkpoints['det']
    want = {osp.splitext(osp.basename(p))[0]: reference(cfg, model, p).pred_instances.scores
            .numpy() for p in images}
    # a threshold in the middle of the first image's scores, in a gap between two of them (no
    # score of either image within 1e-3 of it: summation-order noise cannot move one across)
    everything = np.concatenate(list(want.values()))
    ranked = np.sort(want['v0'])
    assert len(ranked) >= 4, 'the random toy model returns too few detections to test'
    thr = None
    for k in sorted(range(1, len(ranked)), key=lambda k: abs(k - len(ranked) / 2)):
        mid = float(ranked[k - 1] + ranked[k]) / 2
        if np.abs(everything - mid).min() > 1e-3:
            thr = mid
            break
    assert thr is not None

    handed = []
    draw = DetLocalVisualizer._draw_instances

    def spy(self, image, instances, *args, **kwargs):
        handed.append(instances.clone())
        return draw(self, image, instances, *args, **kwargs)
    monkeypatch.setattr(DetLocalVisualizer, '_draw_instances', spy)

    pictures = draw_val_predictions(osp.join(ROOT, config), ckpt, str(tmp_path / 'thr'),
                                    num_images=2, score_thr=thr, scale=1)
    assert len(pictures) == 2 and len(handed) == 4
    for picture, (truth, drawn) in zip(pictures, zip(handed[::2], handed[1::2])):
        scores = want[osp.splitext(osp.basename(picture.path))[0]]
        shown, hidden = np.sort(scores[scores >= thr]), scores[scores < thr]
        assert len(truth) == 1 and 'scores' not in truth
        # every drawn detection reaches the threshold, and all that do are drawn
        drawn_scores = np.sort(drawn.scores.numpy())
        assert (drawn_scores >= thr).all()
        np.testing.assert_allclose(drawn_scores, shown, atol=1e-4)
        assert (picture.detections, picture.drawn) == (len(scores), len(shown))
        assert picture.caption[0] == 'ground truth: 1 object'
        assert picture.caption[1] == (f'prediction: {len(shown)} of {len(scores)} detections, '
                                      f'score >= {thr:g}')
        found = re.match(r'not drawn: (\d+) with score ([\d.]+)(?: to ([\d.]+))? \(--score-thr 0 '
                         r'draws all (\d+)\)', picture.caption[2])
        assert found, picture.caption[2]
        assert (int(found[1]), int(found[4])) == (len(hidden), len(scores))
        assert abs(float(found[2]) - hidden.min()) <= 0.0051
        assert abs(float(found[3] or found[2]) - hidden.max()) <= 0.0051
    assert any(p.drawn > 0 for p in pictures)  # the case is not empty

    # score_thr 0: everything the model returned is drawn, and the caption says all
    handed.clear()
    pictures = draw_val_predictions(osp.join(ROOT, config), ckpt, str(tmp_path / 'all'),
                                    num_images=1, score_thr=0, scale=1)
    assert len(handed[1]) == len(want['v0']) == pictures[0].drawn == pictures[0].detections
    assert pictures[0].caption[1].startswith(f'prediction: {len(want["v0"])} of {len(want["v0"])} ')
    assert pictures[0].caption[2].startswith(f'all {len(want["v0"])} detections')


def test_demo_draws_at_its_stated_threshold(monkeypatch, capsys):
    """make demo hands its --score-thr (default: the measured SCORE_THR) to the pictures' command,
    whose captions state it, and names it on its last lines."""
    from tools import demo
    calls = []
    monkeypatch.setattr(demo, 'run', lambda script, *args, log=None: calls.append((script, args)))
    monkeypatch.setattr(demo, 'last_checkpoint', lambda work_dir: 'epoch_6.pth')
    monkeypatch.setattr(demo, 'read_metrics', lambda folder: {})
    for thr in (demo.SCORE_THR, 0):
        calls.clear()
        demo.job(demo.DET, 'work_dirs/x', [], thr)
        (args,) = [a for s, a in calls if s == '-m' and a[0].endswith('.inference')]
        assert args[args.index('--score-thr') + 1] == thr
    assert 0 < demo.SCORE_THR < 1
    jobs = []
    monkeypatch.setattr(demo, 'job', lambda *args: jobs.append(args) or ({}, {}))
    for argv, thr in (([], demo.SCORE_THR), (['--score-thr', '0.5'], 0.5)):
        jobs.clear()
        demo.main(argv)  # 1: the stubbed jobs learned nothing
        assert jobs[0][0] == demo.DET and jobs[0][-1] == thr
        assert f'detections with score >= {thr:g}' in capsys.readouterr().out
