"""The fine-tune chain: a classifier trained with mmpretrain, saved in the authors' checkpoint
layout, then used through ``init_cfg=dict(type='Pretrained', ...)`` by a detector and a
segmentor."""
import os
import os.path as osp
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

import warm
from helpers import authors_state, make_toy_sets

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CASES = [('inline_swin', 'inline-swin-t'), ('inline_pvt', 'inline-pvt-t'), ('mavit', 'mavit-t')]


@pytest.mark.parametrize('family,name', CASES, ids=[c[0] for c in CASES])
def test_classifier_saved_in_the_authors_layout(family, name):
    """An mmpretrain classifier holding the authors' weights, written back with
    ``classifier_to_authors``, gives the authors' own key names, shapes and values (their published
    layout), apart from the index/mask buffers our modules recompute."""
    from mmlinattn.core.models import authors_to_classifier, classifier_to_authors
    authors = authors_state(family, 'tiny', seed=3)
    cfg = Config.fromfile(osp.join(ROOT, 'configs/classification', f'{name}_in1k.py'))
    init_default_scope('mmpretrain')
    from mmpretrain.registry import MODELS
    model = MODELS.build(cfg.model)
    model.load_state_dict(authors_to_classifier(authors, family), strict=False)
    back = classifier_to_authors(model.state_dict(), family)
    expected = {k: v for k, v in authors.items()
                if k.rsplit('.', 1)[-1] not in ('relative_position_index', 'attn_mask')}
    assert sorted(back) == sorted(expected)
    for k, v in expected.items():
        assert back[k].shape == v.shape, k
        assert torch.equal(back[k], v), k


def _warm_run_script(script, args=(), *, cwd=None, log=None, **_):
    """``run_script`` (mmlinattn.training.runs) in the suite's warm interpreter: the same command,
    its output in ``log``, a failure raised."""
    r = warm.run([sys.executable, script, *args], cwd=cwd, merge=True,
                 env=dict(os.environ, PYTHONUNBUFFERED='1'))
    if log:
        os.makedirs(osp.dirname(log), exist_ok=True)
        with open(log, 'w') as f:
            f.write(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:]
    return r


def test_finetune_chain_quick(tmp_path, monkeypatch):
    """tools/finetune_chain.py --quick: pretrain (a few images), save, fine-tune the toy Mask R-CNN
    and Semantic FPN from the saved file. The fine-tuning configs it writes initialise the
    detector's and the segmentor's backbones to exactly the classifier's trained backbone
    weights. (Its three tools/train.py runs go to the warm interpreter: tests/warm.py.)"""
    from mmlinattn.core.weights import load_runner_checkpoint
    from mmlinattn.training.cli import load_config
    from mmlinattn.training.config import model_registry
    from tools import finetune_chain
    from tools.misc import make_toy_datasets as toy
    data = make_toy_sets(tmp_path / 'data', seed=5, size=64)
    toy.make_toy_cls(str(data / 'toy_cls'), seed=5, train=12, val=6, size=64)
    work = tmp_path / 'work'
    out = tmp_path / 'table.md'
    monkeypatch.setattr(finetune_chain, 'run_script', _warm_run_script)
    assert finetune_chain.main(['--quick', '--skip-scratch', '--data', str(data),
                                '--work-dir', str(work), '--out', str(out)]) == 0

    with open(work / 'pretrain' / 'last_checkpoint') as f:  # a Runner checkpoint, read weights-only
        classifier = load_runner_checkpoint(f.read().strip())['state_dict']
    trained = {k[len('backbone.'):]: v for k, v in classifier.items() if k.startswith('backbone.')}
    assert trained
    for task in ('det', 'seg'):
        cfg = load_config(str(work / f'{task}-pretrained' / 'config.py'))
        torch.manual_seed(1)
        model = model_registry(cfg).build(cfg.model)
        model.init_weights()
        own = model.backbone.state_dict()
        # every trained backbone tensor arrives; only the detector's new output norms (if any) are
        # new
        assert set(trained) <= set(own)
        for k, v in trained.items():
            assert torch.equal(own[k], v), f'{task}: backbone.{k} is not the pretrained value'
    table = out.read_text()
    for row in ('bbox_mAP_50', 'segm_mAP_50', 'mIoU'):
        line = next((ln for ln in table.splitlines() if f'| {row} |' in ln), None)
        assert line, table
        # from scratch skipped; fine-tuned: the metric of the run's last validation, read back
        scratch, finetuned = [c.strip() for c in line.split('|')][3:5]
        assert scratch == '-' and finetuned != '-' and float(finetuned) >= 0, line
