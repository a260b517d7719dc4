"""The multi-GPU path on the CPU, on any machine (the tools started here see no GPU): a Mask R-CNN
with MAViT-T trains under DDP with 2 processes (tools/dist_train.sh -> torchrun -> tools/train.py
--launcher pytorch), saves unwrapped weights from rank 0, resumes under DDP, and tools/dist_test.sh
gives the same predictions and metrics as the single-process tools/test.py.

One torchrun cycle, the detector's: its epoch-based loop is the one where DDP changes what is
resumed (an epoch's iteration count depends on the world size, the DefaultSampler's shuffle on the
epoch); MAViT is the family whose weights are channels-last (DDP's bucket views) and whose stem
carries SyncBN (reverted on the CPU); the masks make it the model with the most heads. What else
DDP demands of a model - a gradient for every trainable parameter at each iteration - is checked
for every model kind and backbone family in one process, by
tests/test_configs.py::test_train_step_and_predict; the iteration-based resume (the segmentor's)
advances the dataloader the same way with one process or two, and is checked in one process by
tests/test_stop_and_resume.py.

The case is a shipped config as it is (SyncBN, paramwise rules, heads), with only the data swapped
to the shared toy sets (and the heads' class count to theirs), the loop shortened and no
pretrained file.
"""
import os
import os.path as osp
import pickle
import socket
import sys

import pytest
import torch
from mmengine.config import Config

from mmlinattn.training.runs import read_metrics

import compare
import warm

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOY = osp.join(ROOT, 'configs', 'toy', '_base_')

SHIPPED = 'mavit/mask-rcnn_mavit-t_fpn_1x_coco.py'


def _set_classes(model, n):
    """Give every head the toy set's class count."""
    for key in ('bbox_head', 'mask_head', 'decode_head', 'auxiliary_head'):
        heads = model.get(key)
        for h in (heads if isinstance(heads, list) else [heads]):
            if isinstance(h, dict) and 'num_classes' in h:
                h['num_classes'] = n
    if 'roi_head' in model:
        _set_classes(model['roi_head'], n)


def _fewer_rois(model) -> None:
    """Two-stage detectors: 16 sampled RoIs per image in training (at most 4 positives, the mask
    head's RoIs), 50 proposals and 10 detections per image at test instead of the COCO recipe's
    512, 1000 and 100. The RoI heads' cost grows with these (Mask R-CNN's mask head: about 1
    GFLOP per RoI; 100 detections made a toy test image 3.6 s, 10 make it 0.6 s on one thread), and
    none of what this test checks (DDP training, resume, distributed == single-process results)
    depends on how many RoIs there are."""
    train_cfg, test_cfg = model.get('train_cfg') or {}, model.test_cfg
    if 'rcnn' not in test_cfg:
        return
    rcnn = train_cfg.rcnn if isinstance(train_cfg.rcnn, list) else [train_cfg.rcnn]
    for stage in rcnn:
        stage.sampler.num = 16
    train_cfg.rpn_proposal.update(nms_pre=500, max_per_img=100)
    test_cfg.rpn.update(nms_pre=500, max_per_img=50)
    test_cfg.rcnn.max_per_img = 10


def derived_config(shipped: str, data_root, out: str) -> Config:
    cfg = Config.fromfile(osp.join(ROOT, 'configs', shipped))
    toy_cfg = Config.fromfile(osp.join(TOY, 'toy_coco_instance.py'))
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = toy_cfg[key]
        loader.dataset.data_root = f'{data_root}/toy_coco/'
        # 1 image a rank (the RoI heads' cost is per image) and a forward: in testing the two
        # runs' sums then go in the same order
        loader.batch_size = 1
        cfg[key] = loader
    ann = f'{data_root}/toy_coco/annotations/instances_val.json'
    cfg.val_evaluator = cfg.test_evaluator = dict(toy_cfg.val_evaluator, ann_file=ann)
    # no validation at the end of training (mmengine validates at the last epoch whatever
    # val_interval says): tools/dist_test.sh tests the distributed loop below
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1, val_begin=100,
                         val_interval=100)
    # Keep every scored box: after two toy epochs a detector may score nothing above the shipped
    # 0.05, and an empty result would make the distributed-vs-single comparison below compare two
    # empty dicts.
    cfg.model.test_cfg.rcnn.score_thr = 0.0
    _fewer_rois(cfg.model)
    _set_classes(cfg.model, 3)
    cfg.model.backbone.init_cfg = None
    cfg.default_hooks.logger.interval = 1
    cfg.allow_cpu = True   # a CPU run by design (mmlinattn.training.gpu_guard), GPU or not
    cfg.dump(out)
    return cfg


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _child_env(env=None) -> dict:
    """The environment of the tools these tests start: the CPU path on any machine. With a GPU
    visible the tools would take mmengine's NCCL path (one GPU per rank: on a 1-GPU machine rank
    1 fails) and the single-process test would run on the GPU, so CUDA is hidden."""
    return dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='',
                **(env or {}))


def _run(cmd, env=None, timeout=600):
    r = warm.run(cmd, cwd=ROOT, env=_child_env(env), timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f'{" ".join(cmd)} failed ({r.returncode}):\n{out[-4000:]}'
    return out


def _load(path):
    with open(path, 'rb') as f:
        return pickle.load(f)


def _same_predictions(a, b, rules):
    """Rank-split predictions ``a`` against single-process ones ``b``. Each image goes through the
    network alone (test batch size 1) on one thread (_run sets OMP_NUM_THREADS=1) in both, so
    the sums run in the same order and the metrics are compared exactly by the caller; the
    predictions are compared allowing summation-order noise all the same (compare.py), so that
    a difference shows as the image and detection it concerns."""
    assert len(a) == len(b)
    for pa, pb in zip(sorted(a, key=lambda p: p['img_path']),
                      sorted(b, key=lambda p: p['img_path'])):
        assert len(pb['pred_instances']['scores']) > 0, 'no boxes to compare'
        compare.assert_same_detections(pa['pred_instances'], pb['pred_instances'], **rules,
                                       what=pa['img_path'])


def test_tools_started_here_see_no_gpu(monkeypatch):
    """Whatever the machine shows (CUDA_VISIBLE_DEVICES=0 here), the launched tools get none."""
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0')
    env = _child_env(dict(PORT='29999'))
    assert env['CUDA_VISIBLE_DEVICES'] == '' and env['PORT'] == '29999'
    assert env['OMP_NUM_THREADS'] == '1' and env['PYTHON'] == sys.executable


@pytest.mark.slow
def test_ddp_train_resume_and_test(toy_data, tmp_path):
    """Train under DDP (two iterations in each torchrun: DDP's unfinished-reduction error shows at
    the second), the checkpoint saved unwrapped; a second torchrun resumes it and trains one more
    epoch; dist_test.sh then scores the last checkpoint as tools/test.py does."""
    cfg_path = str(tmp_path / 'cfg.py')
    cfg = derived_config(SHIPPED, toy_data, cfg_path)
    work = tmp_path / 'work'

    out = _run(['bash', 'tools/dist_train.sh', cfg_path, '2', '--work-dir', str(work)],
               env=dict(PORT=str(_free_port())))
    assert 'SyncBN' in open(cfg_path).read() and 'SyncBatchNorm layers reverted' in out
    # every gradient in the layout of DDP's bucket views (MAViT's weights are channels-last as its
    # maps are): torch warns where it must copy one at each step
    assert 'Grad strides do not match bucket view strides' not in out, out[-3000:]
    assert (work / 'epoch_1.pth').exists(), os.listdir(work)
    ck = torch.load(work / 'epoch_1.pth', map_location='cpu', weights_only=True)
    # saved unwrapped, from rank 0
    assert not any(k.startswith('module.') for k in ck['state_dict'])

    out = _run(['bash', 'tools/dist_train.sh', cfg_path, '2', '--work-dir', str(work),
                '--resume', '--cfg-options', 'train_cfg.max_epochs=2'],
               env=dict(PORT=str(_free_port())))
    # 4 toy images, 2 ranks x batch 1: an epoch is 2 iterations under DDP (4 in one process)
    assert 'resumed epoch: 1, iter: 2' in out, out[-3000:]
    last = work / 'epoch_2.pth'
    assert last.exists(), os.listdir(work)

    dist_out = _run(['bash', 'tools/dist_test.sh', cfg_path, str(last), '2', '--work-dir',
                     str(tmp_path / 'dist_test'), '--out', str(tmp_path / 'dist.pkl')],
                    env=dict(PORT=str(_free_port())))
    single_out = _run([sys.executable, 'tools/test.py', cfg_path, str(last), '--work-dir',
                       str(tmp_path / 'test'), '--out', str(tmp_path / 'single.pkl')])
    dist_metrics = read_metrics(str(tmp_path / 'dist_test'))  # what mmengine recorded on rank 0
    assert dist_metrics, dist_out[-2000:]
    assert dist_metrics == read_metrics(str(tmp_path / 'test')), single_out[-2000:]
    _same_predictions(_load(tmp_path / 'dist.pkl'), _load(tmp_path / 'single.pkl'),
                      compare.detection_rules(cfg))
