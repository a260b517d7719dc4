"""Each checkpoint file is read once per tool run, and the pre-flight builds the backbone once.
Counted, not assumed: every ``open()`` of the checkpoint for reading (torch's
loader and mmengine's go through it) while a whole tool run goes by - tools/test.py, tools/train.py
``--resume FILE`` / ``--resume`` / ``load_from``, the ONNX exporter - and every construction of the
toy config's MAViT-T while tools/train.py prepares its run. The results do not change: a test run
is scored the same when the contents are handed on as when each user reads the file itself (the
old way, forced here), and a resumed run starts from the file's iteration, weights, optimizer and
scheduler states exactly."""
import builtins
import os
import os.path as osp
import re
import shutil

import pytest
import torch

from mmlinattn.core.weights.reading import CheckpointContents
from tools import test as test_tool
from tools import train as train_tool

from helpers import (
    assert_resumed_from,
    read_last_checkpoint,
    resume_capture,
    run_checks,
    save_authors_file,
    toy_seg_options,
)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')


class Reads:
    """How often each of ``paths`` is opened for reading (``builtins.open``, which ``torch.load``
    and mmengine's checkpoint loader use for a path) while the test runs."""

    def __init__(self, monkeypatch, *paths):
        self.counts = {osp.realpath(str(p)): 0 for p in paths}
        real_open = builtins.open

        def counting_open(file, mode='r', *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and str(mode).startswith('r'):
                key = osp.realpath(os.fspath(file))
                if key in self.counts:
                    self.counts[key] += 1
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr(builtins, 'open', counting_open)

    def __getitem__(self, path):
        return self.counts[osp.realpath(str(path))]


def _metrics(out: str) -> str:
    lines = [ln for ln in out.splitlines() if re.match(r"^\{'aAcc'", ln)]
    assert len(lines) == 1, out[-2000:]
    return lines[0]


# --------------------------------------------------------------------------- tools/test.py
def test_test_tool_reads_its_checkpoint_once_and_scores_the_same(toy_data, toy_checkpoints,
                                                                 tmp_path, monkeypatch, capsys):
    """One read serves the pre-check (load_runner_checkpoint), check_model_checkpoint and the
    Runner's load; forcing every user to read the file itself gives the same metrics."""
    ckpt = tmp_path / 'model.pth'
    shutil.copy(toy_checkpoints.seg, ckpt)  # a file of its own: its reads are counted
    argv = [SEG_CFG, str(ckpt), '--cfg-options',
            f'test_dataloader.dataset.data_root={toy_data}/toy_ade']
    reads = Reads(monkeypatch, ckpt)
    assert test_tool.main(argv + ['--work-dir', str(tmp_path / 'once')]) == 0
    assert reads[ckpt] == 1
    handed_on = _metrics(capsys.readouterr().out)

    monkeypatch.setattr(CheckpointContents, 'matches', lambda self, path: False)
    assert test_tool.main(argv + ['--work-dir', str(tmp_path / 'each')]) == 0
    assert reads[ckpt] == 1 + 2  # the checks' read and the Runner's own read, each its own
    assert _metrics(capsys.readouterr().out) == handed_on


# --------------------------------------------------------------------------- tools/train.py
def _capturing_runner(monkeypatch):
    """The Runner our configs name, with :func:`helpers.resume_capture`'s hook registered."""
    from mmlinattn.training.runner import LinAttnRunner
    hook, captured = resume_capture()
    real = LinAttnRunner.from_cfg.__func__

    def from_cfg(cls, cfg):
        runner = real(cls, cfg)
        runner.register_hook(hook, priority='LOWEST')
        return runner

    monkeypatch.setattr(LinAttnRunner, 'from_cfg', classmethod(from_cfg))
    return captured


@pytest.mark.slow  # three short toy trainings: about 40 s on 2 cores
def _counting_config_formats(monkeypatch):
    """A list whose one item counts the yapf formats of mmengine's Config from now on."""
    import mmengine.config.config as config_module
    count, real = [0], config_module.FormatCode

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(config_module, 'FormatCode', counting)
    return count


def test_a_runners_config_text_is_mmengines_for_its_content():
    """The Runner's config formats once per content and gives the text mmengine's own Config
    gives, also after a change."""
    from mmengine.config import Config

    from mmlinattn.training.runner import FormattedOnce
    plain = Config.fromfile(SEG_CFG)
    ours = Config.fromfile(SEG_CFG)
    object.__setattr__(ours, '__class__', FormattedOnce)
    assert ours.pretty_text == plain.pretty_text
    for cfg in (plain, ours):
        cfg.train_cfg.max_iters = 7
        cfg.model.backbone.attn_type = 'MMMM'
    assert ours.pretty_text == plain.pretty_text and 'max_iters=7' in ours.pretty_text


def test_train_tool_reads_the_resumed_or_loaded_file_once(toy_data, tmp_path, monkeypatch):
    """--resume FILE, --resume (auto) and load_from: each was three reads (the pre-check or the
    pre-flight, check_model_checkpoint, the Runner's load); now one, and the run resumes the file's
    state exactly."""
    work = tmp_path / 'work'
    opts = toy_seg_options(toy_data, 'default_hooks.checkpoint.interval=2',
                           'default_hooks.checkpoint.max_keep_ckpts=100')
    formatted = _counting_config_formats(monkeypatch)
    assert train_tool.main([SEG_CFG, '--work-dir', str(work), '--cfg-options', *opts,
                            'train_cfg.max_iters=2']) == 0
    # the run's config text formatted once (mmengine formats it at the environment log, the
    # visualizer, the dump, the runtime info and the checkpoint: five times, ~1 s each)
    assert formatted == [1]
    monkeypatch.undo()
    first = work / 'iter_2.pth'
    saved = torch.load(first, map_location='cpu', weights_only=True)

    captured = _capturing_runner(monkeypatch)
    reads = Reads(monkeypatch, first, work / 'iter_3.pth')
    assert train_tool.main([SEG_CFG, '--work-dir', str(work), '--resume', str(first),
                            '--cfg-options', *opts, 'train_cfg.max_iters=3']) == 0
    assert reads[first] == 1
    assert_resumed_from(captured, saved)

    second = work / 'iter_3.pth'  # the last iteration's checkpoint, named by last_checkpoint
    assert read_last_checkpoint(work) == str(second) and reads[second] == 0
    saved = torch.load(second, map_location='cpu', weights_only=True)
    reads.counts[osp.realpath(second)] = 0
    assert train_tool.main([SEG_CFG, '--work-dir', str(work), '--resume', '--cfg-options', *opts,
                            'train_cfg.max_iters=4']) == 0
    assert reads[second] == 1 and reads[first] == 1
    assert_resumed_from(captured, saved)

    # load_from a whole model: its weights, not its training state
    assert train_tool.main([SEG_CFG, '--work-dir', str(tmp_path / 'fine'), '--cfg-options', *opts,
                            f'load_from={first}', 'train_cfg.max_iters=1']) == 0
    assert reads[first] == 2
    assert captured['iter'] == 0
    for k, v in torch.load(first, map_location='cpu', weights_only=True)['state_dict'].items():
        assert torch.equal(captured['model'][k], v), k


def test_contents_move_to_the_resume_device_as_torch_load_would(tmp_path):
    """mmengine's resume asks for its device (``map_location='cuda'`` on a GPU): the contents read
    on the CPU are moved there, storage shared as torch.load shares it ('meta' here, the device
    every machine has); a map_location that depends on the saved location is left to a new read."""
    from mmlinattn.training.runner import on_device
    w = torch.arange(6.).reshape(2, 3)
    obj = {'state_dict': {'w': w, 'row': w[1], 'p': torch.nn.Parameter(torch.ones(2))},
           'optimizer': {'state': {0: {'step': torch.tensor(3.)}}}, 'meta': {'iter': 3}}
    assert on_device(obj, 'cpu') is obj and on_device(obj, torch.device('cpu')) is obj
    assert on_device(obj, lambda storage, loc: storage) is None and on_device(obj, None) is None
    moved = on_device(obj, 'meta')
    sd = moved['state_dict']
    assert {t.device.type for t in (sd['w'], sd['row'], sd['p'],
                                    moved['optimizer']['state'][0]['step'])} == {'meta'}
    assert sd['row'].shape == (3,) and sd['row'].storage_offset() == 3
    assert sd['w'].untyped_storage()._cdata == sd['row'].untyped_storage()._cdata
    assert isinstance(sd['p'], torch.nn.Parameter) and moved['meta'] == {'iter': 3}


# --------------------------------------------------------------------------- the exporter
def test_exporter_reads_its_checkpoint_once(toy_checkpoints, tmp_path, monkeypatch, capsys):
    """The exporter reads its checkpoint once (one read serves check_model_checkpoint and the
    load), and the exported backbone matches eager PyTorch with the checkpoint's weights. (The jit
    exporter: the reads come before either exporter, and it traces MAViT-T in a few seconds where
    the dynamo exporter takes ~30 s; tests/test_deploy.py and test_deploy_jit.py test each.)"""
    pytest.importorskip('onnx')
    pytest.importorskip('onnxruntime')
    from tools.deployment import export_onnx
    ckpt = tmp_path / 'model.pth'
    shutil.copy(toy_checkpoints.seg, ckpt)  # a file of its own: its reads are counted
    reads = Reads(monkeypatch, ckpt)
    out = tmp_path / 'backbone.onnx'
    assert export_onnx.main([SEG_CFG, str(ckpt), '--shape', '64', '64', '--part', 'backbone',
                             '--exporter', 'jit', '--out', str(out)]) == 0, \
        capsys.readouterr().err
    assert reads[ckpt] == 1
    assert 'ONNX Runtime matches eager PyTorch' in capsys.readouterr().out


# --------------------------------------------------------------------------- pre-flight builds
def _counting_backbone_builds(monkeypatch):
    from mmlinattn.core.models.backbones import MAViT
    built = []
    real_init = MAViT.__init__

    def counting_init(self, *args, **kwargs):
        built.append(torch.empty(0).device.type)  # the device the pre-flight builds on
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(MAViT, '__init__', counting_init)
    return built


@pytest.mark.parametrize('how', ['init_cfg', 'load_from'])
def test_preflight_builds_the_backbone_once(how, toy_data, tmp_path, monkeypatch):
    """The channels check and the checkpoint fit share one backbone on the meta device (was two
    builds before the Runner's own)."""
    authors = tmp_path / 'mavit_t.pth'
    save_authors_file(str(authors), 'mavit', 'tiny')
    cfg_file = tmp_path / 'cfg.py'
    if how == 'init_cfg':
        extra = (f"model = dict(backbone=dict(init_cfg=dict(type='Pretrained', "
                 f"checkpoint={str(authors)!r})))\n")
    else:  # backbone weights only: fitted, then refused with the init_cfg to write
        backbone_only = tmp_path / 'backbone.pth'
        from mmlinattn.core.weights import extract_state_dict, read_checkpoint
        state = {k: v for k, v in extract_state_dict(read_checkpoint(str(authors))).items()
                 if not k.startswith(('head.', 'proj.', 'norm.'))}
        torch.save(state, backbone_only)
        extra = f'load_from = {str(backbone_only)!r}\n'
    cfg_file.write_text(f'_base_ = [{SEG_CFG!r}]\n' + extra)
    built = _counting_backbone_builds(monkeypatch)
    args = train_tool.parse_args([str(cfg_file), '--work-dir', str(tmp_path / 'w'),
                                  '--cfg-options', *toy_seg_options(toy_data)])
    if how == 'init_cfg':
        cfg = run_checks(train_tool.build_cfg(args))
        assert cfg.model.backbone.init_cfg['checkpoint'] == str(authors)
    else:
        from mmlinattn.core.weights import CheckpointError
        with pytest.raises(CheckpointError, match='holds backbone weights only'):
            run_checks(train_tool.build_cfg(args))
    assert built == ['meta', 'cpu']  # the checks' one, and the Runner's model
