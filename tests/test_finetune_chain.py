"""The fine-tune chain (docs/finetuning.md): a classifier of mmpretrain saved in the authors'
checkpoint layout, then used through ``init_cfg=dict(type='Pretrained', ...)`` by a detector and a
segmentor."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from helpers import authors_state

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


@pytest.mark.parametrize('family,name', [('mavit', 'mavit-t'), ('inline_pvt', 'inline-pvt-t')])
def test_a_classifier_saved_in_the_authors_layout_starts_the_detector_and_segmentor(tmp_path,
                                                                                    family, name):
    """The chain of docs/finetuning.md without its training runs: the toy classifier
    (``configs/toy/<name>_toy-cls.py``; its random weights stand for trained ones), saved with
    ``classifier_to_authors`` as ``{'model': ...}``, then named by
    ``init_cfg=dict(type='Pretrained', checkpoint=...)`` in a config that inherits the toy Mask
    R-CNN or Semantic FPN, as a user writes it: ``init_weights`` gives each backbone exactly the
    classifier's backbone tensors (only a detector's own new output norms, if any, are new)."""
    from mmpretrain.registry import MODELS

    from mmlinattn.core.models import classifier_to_authors
    from mmlinattn.training.cli import load_config
    from mmlinattn.training.config import model_registry
    cls_cfg = Config.fromfile(osp.join(ROOT, 'configs', 'toy', f'{name}_toy-cls.py'))
    init_default_scope('mmpretrain')
    torch.manual_seed(2)
    classifier = MODELS.build(cls_cfg.model)
    classifier.init_weights()
    state = classifier.state_dict()
    pretrained = tmp_path / f'{name}_authors-layout.pth'
    torch.save({'model': classifier_to_authors(state, family)}, pretrained)
    trained = {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}
    assert trained
    for task, base in (('det', f'mask-rcnn_{name}_fpn_toy-coco.py'),
                       ('seg', f'fpn_{name}_toy-ade.py')):
        derived = tmp_path / f'{task}.py'
        derived.write_text(f"_base_ = {osp.join(ROOT, 'configs', 'toy', base)!r}\n"
                           "model = dict(backbone=dict(init_cfg=dict(type='Pretrained', "
                           f"checkpoint={str(pretrained)!r})))\n")
        cfg = load_config(str(derived))
        torch.manual_seed(1)
        model = model_registry(cfg).build(cfg.model)
        model.init_weights()
        own = model.backbone.state_dict()
        assert set(trained) <= set(own), sorted(set(trained) - set(own))[:5]
        for k, v in trained.items():
            assert torch.equal(own[k], v), f'{task}: backbone.{k} is not the pretrained value'
