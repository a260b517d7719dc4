"""The ONNX exporter reads its checkpoint once, and the pre-flight builds the backbone once.
Counted, not assumed: every ``open()`` of the checkpoint for reading (torch's loader goes through
it) while the exporter runs, and every construction of the toy config's MAViT-T while
tools/train.py prepares its run. (A Runner's checks and mmengine's own load each read a training's
or a test's checkpoint: mmengine loads it.)"""
import builtins
import os
import os.path as osp
import shutil

import pytest
import torch

from tools import train as train_tool

from helpers import run_checks, save_authors_file, toy_seg_options

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


def test_preflight_builds_the_backbone_once(toy_data, tmp_path, monkeypatch):
    """The channels check and the checkpoint fit share one backbone on the meta device (was two
    builds before the Runner's own). (A backbone-only load_from, read once and refused:
    test_preflight.py.)"""
    authors = tmp_path / 'mavit_t.pth'
    save_authors_file(str(authors), 'mavit', 'tiny')
    cfg_file = tmp_path / 'cfg.py'
    cfg_file.write_text(f'_base_ = [{SEG_CFG!r}]\n'
                        f"model = dict(backbone=dict(init_cfg=dict(type='Pretrained', "
                        f"checkpoint={str(authors)!r})))\n")
    built = _counting_backbone_builds(monkeypatch)
    args = train_tool.parse_args([str(cfg_file), '--work-dir', str(tmp_path / 'w'),
                                  '--cfg-options', *toy_seg_options(toy_data)])
    cfg = run_checks(train_tool.build_cfg(args))
    assert cfg.model.backbone.init_cfg['checkpoint'] == str(authors)
    assert built == ['meta', 'cpu']  # the checks' one, and the Runner's model
