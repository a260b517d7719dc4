"""Helpers shared by the tests: checkpoints laid out as the authors' releases, built from the
authors' published key names and shapes (tests/data/authors_keys), never from our own modules."""
import argparse
import contextlib
import copy
import json
import os
import os.path as osp
import signal
import sys
import types
from collections import OrderedDict

import pytest
import torch

from mmlinattn.core.families import FAMILIES

KEYS_DIR = osp.join(osp.dirname(osp.abspath(__file__)), 'data', 'authors_keys')
#: family -> the archs the authors released a file for (the family table's rows; each has its key
#: layout under tests/data/authors_keys, which tests/test_families.py checks)
FAMILY_ARCHS = {name: tuple(fam.checkpoints) for name, fam in FAMILIES.items()}
#: the stage widths of each arch in the authors' released models, typed from their files' tensor
#: shapes (tests/data/authors_keys); the tests hold the classes' arch tables to them
AUTHORS_CHANNELS = {
    'inline_pvt': {a: (64, 128, 320, 512) for a in ('tiny', 'small', 'medium', 'large')},
    'inline_swin': {'tiny': (96, 192, 384, 768), 'small': (96, 192, 384, 768),
                    'base': (128, 256, 512, 1024)},
    'mavit': {'tiny': (64, 128, 256, 512), 'small': (64, 128, 320, 512),
              'base': (96, 192, 384, 512), 'large': (96, 192, 448, 640)},
}


def authors_manifest(family: str, arch: str) -> dict:
    """The authors' classification model's state_dict layout: ``{'keys': [[name, shape, dtype]],
    'num_params': int}``."""
    with open(osp.join(KEYS_DIR, f'{family}_{arch}.json')) as f:
        return json.load(f)


def authors_state(family: str, arch: str, seed: int = 0) -> 'OrderedDict[str, torch.Tensor]':
    """Random tensors with the names, shapes and dtypes of the authors' released ``model`` dict.

    Floats are small random values (BatchNorm variances positive), integers zeros, so every tensor
    is distinct from a fresh initialisation and a wrong mapping cannot pass by accident."""
    g = torch.Generator().manual_seed(seed)
    state = OrderedDict()
    for name, shape, dtype in authors_manifest(family, arch)['keys']:
        dt = getattr(torch, dtype)
        if dt.is_floating_point:
            t = torch.randn(shape, generator=g, dtype=dt) * 0.05
            if name.endswith('running_var'):
                t = t.abs() + 0.5
        else:
            t = torch.zeros(shape, dtype=dt)
        state[name] = t
    return state


class _FakeCfgNode(dict):
    """Pickled as ``yacs.config.CfgNode`` - like the InLine release's ``config`` entry."""


def save_inline_style(path, state, with_config=True):
    """A checkpoint laid out as the InLine release: model/optimizer/.../config (a yacs CfgNode)."""
    ck = {'model': state, 'optimizer': {'state': {}, 'param_groups': []}, 'lr_scheduler': {},
          'max_accuracy': 82.4, 'epoch': 299}
    if with_config:
        mod = types.ModuleType('yacs.config')
        pkg = types.ModuleType('yacs')
        pkg.config = mod
        _FakeCfgNode.__module__, _FakeCfgNode.__qualname__ = 'yacs.config', 'CfgNode'
        mod.CfgNode = _FakeCfgNode
        saved = {k: sys.modules.get(k) for k in ('yacs', 'yacs.config')}
        sys.modules['yacs'], sys.modules['yacs.config'] = pkg, mod
        try:
            ck['config'] = _FakeCfgNode(MODEL=_FakeCfgNode(TYPE='inline'), SEED=0)
            torch.save(ck, path)
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v
    else:
        torch.save(ck, path)


def save_mala_style(path, state, ema_state=None):
    """A checkpoint laid out as the MALA release: model + model_ema + training state + Namespace."""
    ck = {'model': state, 'model_ema': ema_state if ema_state is not None else state,
          'optimizer': {}, 'lr_scheduler': {}, 'epoch': 299, 'scaler': {}, 'max_accuracy': 83.9,
          'args': argparse.Namespace(model='MALA_T', lr=1e-3)}
    torch.save(ck, path)


def save_authors_file(path, family: str, arch: str, seed: int = 0):
    """Write an authors'-layout checkpoint of ``family``/``arch`` to ``path``; return its
    weights."""
    state = authors_state(family, arch, seed)
    if family == 'mavit':
        save_mala_style(path, state)
    else:
        save_inline_style(path, state)
    return state


def tiny_arch(cls, depths) -> dict:
    """The T arch of backbone class ``cls`` (its widths, heads, cores and layer scales) with
    ``depths`` blocks a stage: an ``arch`` dict the class takes."""
    tiny = cls.arch_zoo['tiny']
    arch = {k: tiny[k] for k in cls.arch_keys + ('layer_scale', 'mlp_ratio', 'attn_type')
            if k in tiny}
    arch['depths'] = list(depths)
    return arch


def make_toy_sets(root, seed: int, size: int, train: int = 8, val: int = 4):
    """The generated toy COCO and ADE20K-layout sets under ``root/toy_coco`` and
    ``root/toy_ade``."""
    from tools.misc import make_toy_datasets as toy
    toy.make_toy_coco(str(root / 'toy_coco'), seed=seed, train=train, val=val, size=size)
    toy.make_toy_ade(str(root / 'toy_ade'), seed=seed, train=train, val=val, size=size)
    return root


#: the toy segmentation config (configs/toy/_base_/toy_ade.py) at 64x64 instead of 128x128: the
#: resize and crop of training, the resize of testing and the segmentor's padding size (a toy run's
#: iteration takes 0.6 s instead of 1.4 s on one thread of the 2-core machine)
TOY_SEG_64 = ['train_dataloader.dataset.pipeline.2.scale=(64,64)',
              'train_dataloader.dataset.pipeline.3.crop_size=(64,64)',
              'val_dataloader.dataset.pipeline.1.scale=(64,64)',
              'test_dataloader.dataset.pipeline.1.scale=(64,64)',
              'model.data_preprocessor.size=(64,64)']


def toy_seg_options(toy_data, *extra):
    """``--cfg-options`` of a short toy segmentation run on ``make_toy_sets`` data: every split's
    data root, 64x64 inputs (:data:`TOY_SEG_64`), no validation, batch 2, a log line per
    iteration, then ``extra``."""
    data = [f'{k}_dataloader.dataset.data_root={toy_data}/toy_ade' for k in ('train', 'val',
                                                                             'test')]
    return data + TOY_SEG_64 + ['train_cfg.val_interval=1000', 'train_dataloader.batch_size=2',
                                'default_hooks.logger.interval=1'] + list(extra)


def toy_coco_options(root, *extra):
    """``--cfg-options`` pointing every split of a toy COCO config at ``root`` (a ``toy_coco``
    folder of :func:`make_toy_sets`, or a copy of one) and its evaluators at that folder's
    validation annotations, then ``extra``."""
    return ([f'{k}_dataloader.dataset.data_root={root}/' for k in ('train', 'val', 'test')] +
            [f'{k}_evaluator.ann_file={root}/annotations/instances_val.json'
             for k in ('val', 'test')] + list(extra))


def read_last_checkpoint(work):
    """The path a work dir's ``last_checkpoint`` file names (read here as plain text: the
    oracle)."""
    with open(osp.join(str(work), 'last_checkpoint')) as f:
        return f.read().strip()


def signal_after_iter(n: int, sig=signal.SIGTERM):
    """A Runner hook that sends ``sig`` to this process once iteration ``n`` (1-based) has finished,
    so that the iteration a preemption lands on is certain."""
    from mmengine.hooks import Hook

    class SignalAt(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if runner.iter + 1 == n:
                os.kill(os.getpid(), sig)
    return SignalAt()


def resume_capture():
    """``(hook, captured)``: register the hook at priority ``'LOWEST'``; its ``before_train`` runs
    right after mmengine's load / resume and copies the Runner's iteration, weights, optimizer and
    scheduler states into ``captured`` (deep copies: training goes on and updates them in place)."""
    from mmengine.hooks import Hook
    captured = {}

    class ResumeCapture(Hook):
        def before_train(self, runner):
            captured['iter'] = runner.iter
            captured['model'] = {k: v.clone() for k, v in runner.model.state_dict().items()}
            captured['optim'] = copy.deepcopy(runner.optim_wrapper.state_dict())
            captured['sched'] = copy.deepcopy([s.state_dict() for s in runner.param_schedulers])
    return ResumeCapture(), captured


def train_resumed(cfg):
    """Build the Runner ``cfg`` names (a ``--resume`` config), register :func:`resume_capture`'s
    hook and train: ``(runner, captured)``."""
    from mmengine.registry import RUNNERS
    hook, captured = resume_capture()
    runner = RUNNERS.build(cfg)
    runner.register_hook(hook, priority='LOWEST')
    runner.train()
    return runner, captured


def assert_resumed_from(captured, saved, optimizer: bool = True):
    """The state :func:`resume_capture` recorded is the checkpoint ``saved`` (as ``torch.load``
    returns it): its iteration and every weight; with ``optimizer``, the Adam(W) step and moments of
    every parameter and the learning rates."""
    assert captured['iter'] == saved['meta']['iter']
    for k, v in saved['state_dict'].items():
        assert torch.equal(captured['model'][k], v), k
    if not optimizer:
        return
    state = captured['optim']['state']
    assert state.keys() == saved['optimizer']['state'].keys()
    for k, v in saved['optimizer']['state'].items():
        for name in ('step', 'exp_avg', 'exp_avg_sq'):
            assert torch.equal(torch.as_tensor(state[k][name]), torch.as_tensor(v[name])), (k, name)
    assert [g['lr'] for g in captured['optim']['param_groups']] == \
        [g['lr'] for g in saved['optimizer']['param_groups']]


def run_checks(cfg, run: str = 'train'):
    """What every tool that runs ``cfg`` checks before ``run`` ('train', 'val', 'test') reads any
    data: the config's Runner (``LinAttnRunner``) built and its checks run, raising what they find
    (``ConfigError``, ``CheckpointError``: printed as the one line the tools end with). Returns the
    Runner's config as the run would use it (``load_from`` and ``resume`` chosen); the work dir's
    lock is given back."""
    from mmengine.registry import RUNNERS

    from mmlinattn.training.runner import LinAttnRunner
    runner = RUNNERS.build(cfg)
    if not isinstance(runner, LinAttnRunner):
        raise TypeError(f'{cfg.get("runner_type")} is not a LinAttnRunner')
    try:
        runner.check(run)  # what build_train_loop / build_test_loop run first
    finally:
        runner.release()
    return runner.cfg


# ------------------------------------------------------------------ the device of an oracle test
def on_devices(*cases, cuda_only=()):
    """The parameters of a test taking ``device`` first: each of ``cases`` (a tuple of the other
    arguments; none: ``device`` alone) on 'cpu', and, where torch sees a CUDA GPU, each of ``cases``
    and ``cuda_only`` (what only CUDA has: TF32) on 'cuda', marked ``gpu`` (``make gpu-check`` runs
    ``pytest -m gpu``). Without a GPU the cuda cases are absent, not skipped: a CPU machine runs
    the tests it ran before."""
    cases = cases or ((),)
    cpu = [('cpu', *c) if c else 'cpu' for c in cases]
    if not torch.cuda.is_available():
        return cpu
    return cpu + [pytest.param('cuda', *c, marks=pytest.mark.gpu) for c in cases + tuple(cuda_only)]


#: a precision a test compares with float32 -> (its autocast dtype, TF32 on); TF32 is CUDA's
PRECISIONS = {'fp32': (None, False), 'tf32': (None, True), 'fp16': (torch.float16, False),
              'bf16': (torch.bfloat16, False)}


@contextlib.contextmanager
def precision(device, name: str):
    """``device``'s arithmetic in precision ``name`` of :data:`PRECISIONS` inside: autocast to
    float16 / bfloat16 or none; on CUDA TF32 matmuls and convolutions on for 'tf32' and off for the
    others (cuDNN's default is on: fp32 there is TF32 off), as before after."""
    dtype, tf32 = PRECISIONS[name]
    kind = torch.device(device).type
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn) if kind == 'cuda' else ()
    saved = [f.allow_tf32 for f in flags]
    for f in flags:
        f.allow_tf32 = tf32
    try:
        with torch.autocast(kind, dtype=dtype, enabled=dtype is not None):
            yield
    finally:
        for f, on in zip(flags, saved):
            f.allow_tf32 = on


def work_dir_files(work) -> dict:
    """``{name: (size, mtime_ns)}`` of a work dir's entries other than mmengine's timestamped log
    folders (``YYYYMMDD_HHMMSS``): what a refused run must leave as it found ({} for no folder)."""
    import re
    if not osp.isdir(str(work)):
        return {}
    out = {}
    for name in os.listdir(str(work)):
        if re.fullmatch(r'\d{8}_\d{6}', name) and osp.isdir(osp.join(str(work), name)):
            continue
        st = os.stat(osp.join(str(work), name))
        out[name] = (st.st_size, st.st_mtime_ns)
    return out
