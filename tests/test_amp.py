"""--amp, the precision the authors trained with: one AmpOptimWrapper training step per backbone
family against fp32 on a GPU. mmengine's AmpOptimWrapper refuses the CPU, so without CUDA that test
is skipped (the CPU numerics of fp16 / bf16 autocast are tested in test_backbones.py, test_ops.py
and test_core_grads.py; their CUDA cases are `make gpu-check`'s). On each device: what the linear
cores keep for the backward of a tiny backbone's training step under bf16 autocast."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmlinattn.core.models import backbones
from mmlinattn.core.registry import model_registry

from helpers import on_devices

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CASES = ['inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py',
         'inline_swin/upernet_inline-swin-t_160k_ade20k-512x512.py',
         'mavit/fpn_mavit-t_80k_ade20k-512x512.py']
# stated tolerance: the fp16 loss of the same model and batch within 2 % of the fp32 loss
REL_TOL = 2e-2

CORE_NODES = ('InlineAttentionFunctionBackward', 'MalaAttentionFunctionBackward')


@pytest.mark.parametrize('name', ['InLinePVT', 'InLineSwin', 'MAViT'])
@pytest.mark.parametrize('device', on_devices())
def test_bf16_autocast_cores_keep_half_activations(device, name):
    """A tiny backbone's training step under bf16 autocast: every InLine / MALA core keeps the
    q, k, v it was given, in bfloat16 (no float32 copies; they are what the Functions save first),
    and its small states in float32; the gradients are finite."""
    torch.manual_seed(0)
    model = getattr(backbones, name)(arch='tiny', drop_path_rate=0.0).train()  # as constructed
    x = torch.randn(1, 3, 64, 64)
    model, x = model.to(device), x.to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        outs = model(x)
    loss = sum(o.float().mean() for o in outs)
    nodes, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ in CORE_NODES:
            nodes.append(node)
        stack.extend(f for f, _ in node.next_functions)
    assert nodes
    for node in nodes:
        saved = [t for t in node.saved_tensors if t is not None]
        assert all(t.dtype == torch.bfloat16 for t in saved[:3])
        assert all(t.dtype == torch.float32 for t in saved[3:])
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason='--amp needs a CUDA GPU (mmengine AmpOptimWrapper)')
@pytest.mark.parametrize('path', CASES, ids=lambda p: p.split('/')[0])
def test_amp_step_matches_fp32(path):
    for module in ('mmdet', 'mmseg', 'mmcv._ext'):  # a GPU node may have mmcv-lite, without ops
        pytest.importorskip(module, reason='the detectors and segmentors need mmdet, mmseg and '
                            'mmcv with its compiled ops')
    from mmengine.model import revert_sync_batchnorm
    from mmengine.optim import build_optim_wrapper

    from mmlinattn.analysis.benchmarking import det_batch, seg_batch
    cfg = Config.fromfile(osp.join(ROOT, 'configs', path))
    cfg.model.backbone.init_cfg = None
    cfg.model.backbone.drop_path_rate = 0.0
    torch.manual_seed(0)
    model = revert_sync_batchnorm(model_registry(cfg).build(cfg.model)).cuda()
    model.init_weights()
    model.train()
    if cfg.default_scope == 'mmdet':
        batch = det_batch(2, (256, 320), with_mask=True)
    else:
        batch = seg_batch(2, (256, 256))
        model.data_preprocessor.size = (256, 256)

    def loss_of(amp):
        data = model.data_preprocessor(batch, True)
        with torch.autocast('cuda', dtype=torch.float16, enabled=amp):
            loss, _ = model.parse_losses(model(**data, mode='loss'))
        return loss
    torch.manual_seed(1)
    ref = loss_of(False).item()
    ow = build_optim_wrapper(model,
                             dict(cfg.optim_wrapper, type='AmpOptimWrapper', loss_scale='dynamic'))
    torch.manual_seed(1)
    with ow.optim_context(model):
        data = model.data_preprocessor(batch, True)
        loss, _ = model.parse_losses(model(**data, mode='loss'))
    ow.update_params(loss)
    assert torch.isfinite(loss)
    assert abs(loss.item() - ref) / abs(ref) < REL_TOL, (loss.item(), ref)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
