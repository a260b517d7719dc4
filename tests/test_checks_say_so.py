"""A check that cannot run says so in one line, and no broad ``except`` hides a bug of ours.
For each narrowed site: the reason it gives for skipping (a backbone that does not
build on the meta device, a dataset type its registry does not know or a registry that does not
import, a segmentation set that does not list its samples, a type ``--cfg-options`` cannot look up)
is one warning line naming what was skipped and why; a ``TypeError`` injected where the site used
to catch everything now reaches the caller."""
import logging
import os.path as osp

import pytest
import torch

from mmlinattn.training.cli import load_config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')


def fresh_logger(name):
    """A new mmengine logger, the current instance from now on, writing to this test's stdout."""
    from mmengine.logging import MMLogger
    return MMLogger.get_instance(f'checks-say-so-{name}', log_level='INFO')


def lines_with(text, out):
    return [ln for ln in out.splitlines() if text in ln]


def _raising(error):
    def raise_it(*args, **kwargs):
        raise error
    return raise_it


# --------------------------------------------------------------------------- the meta backbone
def test_a_backbone_that_does_not_build_on_meta_says_so_once(monkeypatch, capsys):
    """Both model checks of the pre-flight (channels, checkpoint fit) share the one build, so the
    reason is given once; neither check runs, neither fails."""
    from mmlinattn.core.models.backbones import MAViT
    from mmlinattn.training.preflight import MetaBackbone, check_model_channels
    from mmlinattn.training.preflight.checkpoints import prepare_checkpoints
    cfg = load_config(SEG_CFG)
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint='/nonexistent/mavit_t.pth')
    logger = fresh_logger('meta')
    monkeypatch.setattr(MAViT, '__init__', _raising(
        RuntimeError('Tensor.item() cannot be called on meta tensors')))
    backbone = MetaBackbone(cfg, logger)
    check_model_channels(cfg, backbone)
    assert prepare_checkpoints(cfg, backbone=backbone, logger=logger) is None
    said = lines_with('pre-flight: model.backbone (MAViT) does not build on the meta device',
                      capsys.readouterr().out)
    assert len(said) == 1, said
    assert 'RuntimeError' in said[0] and 'Tensor.item() cannot be called on meta tensors' in said[0]
    assert 'in_channels and the backbone checkpoint fit are not checked' in said[0]


def test_a_bug_in_our_backbone_reaches_the_caller_of_the_preflight(monkeypatch):
    """An error of our own backbone code raised while the pre-flight builds it is raised to the
    caller, not taken for "cannot build on meta" and passed over."""
    from mmlinattn.core.models.backbones import MAViT
    from mmlinattn.training.preflight import check_model_channels
    from mmlinattn.training.preflight.checkpoints import prepare_checkpoints
    cfg = load_config(SEG_CFG)
    monkeypatch.setattr(MAViT, '__init__', _raising(TypeError('a bug of ours')))
    with pytest.raises(TypeError, match='a bug of ours'):
        check_model_channels(cfg)
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint='/nonexistent/mavit_t.pth')
    with pytest.raises(TypeError, match='a bug of ours'):
        prepare_checkpoints(cfg)


# --------------------------------------------------------------------------- dataset classes
def test_a_dataset_type_that_cannot_be_resolved_says_so(capsys):
    from mmlinattn.training.preflight import dataset_views
    cfg = load_config(SEG_CFG)
    cfg.train_dataloader.dataset.type = 'NoSuchSegDataset'
    fresh_logger('dataset-type')
    views = dataset_views(cfg, ('train_dataloader',))
    assert views[0].cls is None
    said = lines_with('pre-flight: train_dataloader.dataset:', capsys.readouterr().out)
    assert len(said) == 1, said
    assert "type='NoSuchSegDataset' is not in mmseg's DATASETS registry" in said[0]
    assert 'not checked before the Runner builds it' in said[0]

    cfg = load_config(SEG_CFG)
    cfg.default_scope = 'no_such_toolbox'
    views = dataset_views(cfg, ('train_dataloader',))
    said = lines_with('pre-flight: train_dataloader.dataset:', capsys.readouterr().out)
    assert views[0].cls is None and len(said) == 1, said
    assert 'no_such_toolbox.registry does not import (ModuleNotFoundError' in said[0]


def test_a_failing_dataset_lookup_is_no_longer_swallowed(monkeypatch):
    from mmseg.registry import DATASETS

    from mmlinattn.training.preflight import dataset_views
    cfg = load_config(SEG_CFG)
    monkeypatch.setattr(DATASETS, 'get', _raising(TypeError('a bug in the lookup')))
    with pytest.raises(TypeError, match='a bug in the lookup'):
        dataset_views(cfg, ('train_dataloader',))


# --------------------------------------------------------------------------- segmentation labels
def test_a_segmentation_set_that_does_not_list_says_its_labels_are_not_checked(monkeypatch,
                                                                               caplog):
    from mmseg.datasets import BaseSegDataset

    from mmlinattn.training.preflight import check_seg_annotations, dataset_views
    cfg = load_config(SEG_CFG)
    view = dataset_views(cfg, ('train_dataloader',))[0]
    logger = logging.getLogger('mmlinattn.test.seg')
    monkeypatch.setattr(BaseSegDataset, 'load_data_list', _raising(
        FileNotFoundError(2, 'No such file or directory', 'data/toy_ade/images/training')))
    with caplog.at_level(logging.WARNING, logger='mmlinattn.test.seg'):
        check_seg_annotations(cfg, view, logger)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert said[0].startswith('pre-flight: train_dataloader.dataset: label maps not checked - '
                              'BaseSegDataset does not list its samples (FileNotFoundError: ')

    monkeypatch.setattr(BaseSegDataset, 'load_data_list', _raising(TypeError('a bug')))
    with pytest.raises(TypeError, match='a bug'):
        check_seg_annotations(cfg, view, logger)


# --------------------------------------------------------------------------- --cfg-options
def test_a_cfg_option_whose_type_cannot_be_looked_up_says_so(monkeypatch, capsys):
    from mmseg.registry import MODELS

    from mmlinattn.training.preflight import check_cfg_options
    cfg = load_config(SEG_CFG)
    fresh_logger('cfg-options')
    monkeypatch.setattr(MODELS, 'get', _raising(ImportError('cannot import name ops from mmcv')))
    check_cfg_options(cfg, {'model.backbone.new_key': 1})  # not checked: no error
    said = lines_with('--cfg-options: the keys given under model.backbone are not checked',
                      capsys.readouterr().out)
    assert len(said) == 1, said
    assert "model.backbone.type='MAViT' cannot be looked up (ImportError: cannot import" in said[0]

    monkeypatch.setattr(MODELS, 'get', _raising(TypeError('a bug in the lookup')))
    with pytest.raises(TypeError, match='a bug in the lookup'):
        check_cfg_options(cfg, {'model.backbone.new_key': 1})


# --------------------------------------------------------------------------- error messages
def test_a_write_error_names_why_the_size_is_unknown():
    from mmlinattn.training.fileio import checkpoint_write_error
    err = checkpoint_write_error({'w': torch.ones(1), 'f': lambda: None}, '/tmp/x/iter_2.pth',
                                 OSError(28, 'No space left on device'))
    assert 'No space left on device (needs unknown bytes: it does not serialise, ' in str(err)
    assert 'lambda' in str(err) or 'pickle' in str(err).lower()


def test_the_lr_part_of_the_divergence_message_names_why_it_is_unknown():
    from types import SimpleNamespace

    from mmlinattn.training.hooks import _lr_text
    assert _lr_text(SimpleNamespace()) == \
        "lr unknown (AttributeError: 'types.SimpleNamespace' object has no attribute " \
        "'optim_wrapper')"
