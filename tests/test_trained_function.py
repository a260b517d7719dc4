"""A whole-model checkpoint is run as the attention function it was trained as.

MAViT's softmax stages (``S``) and MALA stages (``M``) have the same parameters, so a checkpoint
trained with MAViT's default ``MMSS`` loads key for key into ``attn_type='MMMM'`` and, unchecked,
scores another function. The checkpoint records its config (mmengine's Runner saves
``meta['cfg'] = cfg.pretty_text``, written here the same way); tools/test.py, ``load_from`` and
tools/image_demo.py compare it with the config they build.
"""
import os.path as osp

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')


@pytest.fixture
def trained(toy_data, toy_checkpoints):
    """(toy data root, the shared toy MAViT-T Semantic FPN checkpoint: its ``meta['cfg']`` records
    the config it was built from, MAViT's default ``MMSS``)."""
    assert toy_checkpoints.seg_cfg == SEG
    return toy_data, toy_checkpoints.seg


def _opts(root, *extra):
    return ['--cfg-options', *[f'{k}_dataloader.dataset.data_root={root}/toy_ade'
                               for k in ('train', 'val', 'test')], *extra]


@pytest.mark.parametrize('override, refused', [
    ("model.backbone.attn_type='MMSS'", False),  # the default, written out: the same function
    # (attn_type=MMMM: test_a_value_elsewhere_in_the_model_does_not_switch_the_check_off and
    # test_one_run.py's test under either Runner)
    ('model.backbone.attn_cfg.core_options.beta=False', True),  # MALA's ablation: same keys
])
def test_test_tool_refuses_another_function(trained, override, refused, tmp_path, capsys):
    from tools import test as test_tool
    root, ckpt = trained
    rc = test_tool.main([SEG, ckpt, '--work-dir', str(tmp_path / 'w'), *_opts(root, override)])
    # (an earlier test's mmengine logger may still point at its closed capture: only the tool's
    # own lines count)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith('tools/')]
    if not refused:
        assert rc == 0 and not err, err
        return
    assert rc == 2 and len(err) == 1, err
    assert 'was trained as another attention function than the config builds' in err[0]
    assert '(checkpoint)' in err[0] and '(config)' in err[0]
    key = override.split('=')[0].split('.')[2]
    assert f'set model.backbone.{key}=None (tools/train.py and test.py: --cfg-options' in err[0]
    assert 'allow_attention_change=True' in err[0]


def test_an_allowed_swap_is_one_warning(trained, tmp_path, capsys):
    from tools import test as test_tool
    root, ckpt = trained
    rc = test_tool.main([SEG, ckpt, '--work-dir', str(tmp_path / 'w'),
                         *_opts(root, 'model.backbone.attn_type=MMMM',
                                'allow_attention_change=True')])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count('loaded anyway (allow_attention_change=True)') == 1


def test_load_from_and_image_demo_check_it_too(trained, tmp_path, capsys):
    from tools import image_demo
    from tools import train as train_tool
    root, ckpt = trained
    rc = train_tool.main([SEG, '--work-dir', str(tmp_path / 'w'),
                          *_opts(root, f'load_from={ckpt}', 'model.backbone.attn_type=MMMM')])
    err = capsys.readouterr().err
    assert rc == 2 and f'load_from {ckpt} was trained as another attention function' in err
    swapped = tmp_path / 'swapped.py'
    swapped.write_text(f'_base_ = {SEG!r}\nmodel = dict(backbone=dict(attn_type="MMMM"))\n')
    image = sorted((root / 'toy_ade' / 'images' / 'validation').iterdir())[0]
    rc = image_demo.main([str(image), str(swapped), ckpt, '--out-dir', str(tmp_path / 'o')])
    err = capsys.readouterr().err
    assert rc == 2 and 'trained as another attention function' in err


@pytest.mark.parametrize('payload', [
    "import os\nos.system('touch {marker}')\nmodel = dict(backbone=dict(type='MAViT'))\n",
    "model = dict(backbone=__import__('os').system('touch {marker}'))\n",
])
def test_the_recorded_config_is_read_not_run(payload, trained, tmp_path):
    """The config a checkpoint records is text inside a weights-only file: the test's checks parse
    it, never execute it (mmengine's Config.fromstring would run it), and pass."""
    from tools import test as test_tool

    from helpers import run_checks
    root, ckpt = trained
    marker = tmp_path / 'ran'
    obj = torch.load(ckpt, weights_only=True)
    obj['meta']['cfg'] = payload.format(marker=marker)
    evil = tmp_path / 'evil.pth'
    torch.save(obj, evil)
    run_checks(test_tool.build_cfg(test_tool.parse_args(
        [SEG, str(evil), '--work-dir', str(tmp_path / 'w'), *_opts(root)])), 'test')
    assert not marker.exists()


def _with_cfg(ckpt, tmp_path, cfg_text):
    obj = torch.load(ckpt, weights_only=True)
    if cfg_text is None:
        del obj['meta']['cfg']
    else:
        obj['meta']['cfg'] = cfg_text
    path = tmp_path / 'edited.pth'
    torch.save(obj, path)
    return str(path)


def test_a_value_elsewhere_in_the_model_does_not_switch_the_check_off(trained, tmp_path,
                                                                     capsys):
    """Only the recorded backbone must read as data: a name anywhere else in ``model=dict(...)``
    (here the neck's) leaves the check on."""
    from tools import test as test_tool
    root, ckpt = trained
    text = torch.load(ckpt, weights_only=True)['meta']['cfg']
    assert 'neck=dict(' in text
    edited = _with_cfg(ckpt, tmp_path, text.replace('neck=dict(', 'neck=dict(extra=SOME_NAME, '))
    rc = test_tool.main([SEG, edited, '--work-dir', str(tmp_path / 'w'),
                         *_opts(root, 'model.backbone.attn_type=MMMM')])
    err = capsys.readouterr().err
    assert rc == 2 and 'was trained as another attention function' in err


@pytest.mark.parametrize('cfg_text, why', [
    (None, 'it records no config (meta.cfg)'),
    ("model = dict(backbone=dict(type='MAViT', arch=ARCH))\n",
     'its recorded model.backbone is not plain data'),
])
def test_a_check_that_cannot_run_says_so(cfg_text, why, trained, tmp_path, caplog):
    import logging

    from mmlinattn.core.weights import check_model_checkpoint
    from mmlinattn.core.weights.reading import read_checkpoint
    from mmlinattn.training.cli import load_config
    from mmlinattn.training.config import model_registry
    root, ckpt = trained
    edited = _with_cfg(ckpt, tmp_path, cfg_text)
    cfg = load_config(SEG)
    model = model_registry(cfg).build(cfg.model)
    logger = logging.getLogger('trained-as-not-checked')
    check_model_checkpoint(model, edited, obj=read_checkpoint(edited), logger=logger,
                           backbone_cfg=cfg.model.backbone)
    said = [r.getMessage() for r in caplog.records if 'is not checked' in r.getMessage()]
    assert len(said) == 1 and why in said[0] and edited in said[0], said


def test_modules_are_compared_by_name(trained, monkeypatch):
    """One side listing a module the other lacks: the modules are matched by name, so the one
    difference is named and no module is compared with its neighbour."""
    from mmlinattn.core.weights import CheckpointError, fitting
    from mmlinattn.core.weights.reading import read_checkpoint
    from mmlinattn.training.cli import load_config
    from mmlinattn.training.config import model_registry
    root, ckpt = trained
    cfg = load_config(SEG)
    model = model_registry(cfg).build(cfg.model)
    lists = {'theirs': ['s0.attn: core=mala', 's1.attn: core=softmax'],
             'own': ['s0.attn: core=mala', 's0.extra: inline_window=3', 's1.attn: core=softmax']}
    monkeypatch.setattr(fitting, 'attention_functions',
                        lambda m: lists['own'] if m is model.backbone else lists['theirs'])
    with pytest.raises(CheckpointError) as e:
        fitting.check_trained_function(model, ckpt, read_checkpoint(ckpt),
                                       backbone_cfg=cfg.model.backbone)
    msg = str(e.value)
    assert 's0.extra: (none) (checkpoint) vs inline_window=3 (config)' in msg
    assert 's1.attn' not in msg


# ------------------------------------------- the backbone's own check, under any Runner and hooks
def _mavit(attn_type):
    from mmlinattn.core.models.backbones import MAViT

    from helpers import tiny_arch
    torch.manual_seed(0)
    return MAViT(arch=tiny_arch(MAViT, (1, 1, 1, 1)), attn_type=attn_type)


def test_the_backbone_refuses_weights_recorded_as_another_function(tmp_path):
    """mmengine's own save and load (the functions every Runner calls), no check of ours in
    between: the state dict records what the backbone computed, and loading it into a backbone
    of another function stops, naming the first modules that differ; the same function loads. A
    state dict without the record (model.state_dict(): an ablation moving weights on purpose, the
    authors' files) loads as torch loads it."""
    from mmengine.runner.checkpoint import get_state_dict, load_checkpoint, save_checkpoint

    from mmlinattn.core.models.backbones.base import record_trained_as
    from mmlinattn.core.weights import CheckpointError
    path = str(tmp_path / 'mmss.pth')
    trained = _mavit('MMSS')
    state = get_state_dict(trained)
    record_trained_as(trained, state)  # what the runtime's RunChecksHook does at every save
    save_checkpoint({'state_dict': state}, path)
    same = _mavit('MMSS')
    load_checkpoint(same, path, strict=True)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(_mavit('MMMM'), path, strict=True)
    msg = str(e.value)
    assert 'trained as another attention function' in msg, msg
    assert 'core=softmax' in msg and 'core=mala' in msg and '(weights) vs' in msg, msg
    allowed = _mavit('MMMM')
    allowed.allow_attention_change = True
    load_checkpoint(allowed, path, strict=True)  # a warning, the weights loaded
    theirs = same.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in allowed.state_dict().items())
    _mavit('MMMM').load_state_dict(trained.state_dict())  # no record: torch's own load


def test_a_plain_runner_with_the_hooks_replaced_refuses_the_swap(trained, tmp_path):
    """mmseg 1.2.2's own test.py builds mmengine's plain Runner; a child config whose own
    custom_hooks replace the runtime's list leaves nothing of ours there but the model: the MMSS
    checkpoint tested as MMMM stops at the load instead of scoring another function."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    from mmlinattn.core.weights import CheckpointError
    root, ckpt = trained
    cfg = Config.fromfile(SEG)
    cfg.merge_from_dict({f'{k}_dataloader.dataset.data_root': f'{root}/toy_ade'
                         for k in ('train', 'val', 'test')})
    cfg.custom_hooks = [dict(type='EmptyCacheHook')]
    cfg.model.backbone.attn_type = 'MMMM'
    cfg.load_from, cfg.work_dir = ckpt, str(tmp_path / 'w')
    cfg.experiment_name = 'plain_runner_swap'
    runner = Runner.from_cfg(cfg)  # mmengine's own, whatever runner_type says
    assert type(runner) is Runner
    with pytest.raises(CheckpointError, match='trained as another attention function'):
        runner.test()
