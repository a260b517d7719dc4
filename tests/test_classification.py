"""mmpretrain: each backbone under an ImageClassifier with the authors' heads, loading their
file."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from tools.model_converters import convert_authors_checkpoint as conv

from helpers import save_authors_file

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CASES = [('inline_swin', 'inline-swin-t', 'swin'), ('inline_pvt', 'inline-pvt-t', 'pvt'),
         ('mavit', 'mavit-t', 'mavit')]


@pytest.mark.parametrize('family,name,kind', CASES, ids=[c[0] for c in CASES])
def test_classifier_loads_authors_file_and_classifies(tmp_path, family, name, kind):
    """An authors'-layout file (their key names and shapes) converted with --classifier loads into
    the mmpretrain classifier without a missing or unexpected key, and the logits equal the authors'
    head math applied to the last stage."""
    path = tmp_path / 'authors.pth'
    state = save_authors_file(path, family, 'tiny')
    out = tmp_path / 'cls.pth'
    conv.main([family, 'tiny', str(path), str(out), '--classifier'])

    cfg = Config.fromfile(osp.join(ROOT, 'configs/classification', f'{name}_in1k.py'))
    init_default_scope('mmpretrain')
    from mmpretrain.registry import MODELS
    model = MODELS.build(cfg.model).eval()
    ck = torch.load(out, map_location='cpu', weights_only=True)
    missing, unexpected = model.load_state_dict(ck['state_dict'], strict=False)
    assert not unexpected
    assert not [k for k in missing if not k.endswith('num_batches_tracked')], missing

    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        logits = model(x, mode='tensor')
        feat = model.backbone(x)[-1]                  # (B, C, 7, 7)
        if kind == 'swin':
            ref = feat.mean((2, 3))                   # out norm 3 == the authors' final norm
        elif kind == 'pvt':
            ref = feat.mean((2, 3))
        else:
            y = torch.nn.functional.conv2d(feat, state['proj.weight'], state['proj.bias'])
            y = torch.nn.functional.batch_norm(y, state['norm.running_mean'],
                                               state['norm.running_var'],
                                               state['norm.weight'], state['norm.bias'], eps=1e-5)
            ref = (y * torch.sigmoid(y)).mean((2, 3))
        w = state['head.weight'].flatten(1)
        ref = ref @ w.t() + state['head.bias']
    assert logits.shape == (2, 1000)
    # one backbone forward (same batch, same kernels) under mmpretrain's pooling and head and under
    # the math above: the head's sums over <= 2048 channels have |terms| adding to <= 5 (measured),
    # ~1e-5 in another order; logits are O(0.3-1), and a wrong norm or bias moves them by ~1e-1
    assert torch.allclose(logits, ref, atol=1e-4, rtol=1e-4)
