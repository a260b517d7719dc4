"""Helpers shared by the tests: authors'-layout checkpoints made from random weights."""
import argparse
import sys
import types

import torch


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


def authors_state(model, family):
    """Our backbone's weights renamed/extended to the authors' classification checkpoint."""
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    if family == 'swin':
        sd = {k: v for k, v in sd.items() if not k.split('.')[0].startswith('norm')}
        c = model.embed_dims[-1]
        sd['norm.weight'], sd['norm.bias'] = torch.ones(c), torch.zeros(c)
        sd['head.weight'], sd['head.bias'] = torch.randn(1000, c), torch.zeros(1000)
        for name, m in model.named_modules():
            if hasattr(m, 'relative_position_bias_table'):
                sd[name + '.relative_position_index'] = m.relative_position_index.clone()
        # the shifted softmax blocks of the classification model carry an attn_mask buffer
        sd['layers.3.blocks.1.attn_mask'] = torch.zeros(1, 49, 49)
    elif family == 'pvt':
        c = model.embed_dims[-1]
        sd['head.weight'], sd['head.bias'] = torch.randn(1000, c), torch.zeros(1000)
    elif family == 'mavit':
        sd = {k: v for k, v in sd.items() if not k.startswith('extra_norms')}
        c, proj = model.embed_dims[-1], 2048
        sd['proj.weight'], sd['proj.bias'] = torch.randn(proj, c, 1, 1), torch.zeros(proj)
        for n in ('weight', 'bias', 'running_mean', 'running_var'):
            sd[f'norm.{n}'] = torch.ones(proj)
        sd['norm.num_batches_tracked'] = torch.tensor(5)
        sd['head.weight'], sd['head.bias'] = torch.randn(1000, proj, 1, 1), torch.zeros(1000)
    return sd
