"""The legacy ONNX exporter (``torch.onnx.export`` tracing with the jit: the route mmdeploy takes,
and the only one before torch 2.5), through tools/deployment/export_onnx.py ``--exporter jit``:
height and width stay dynamic, and ONNX Runtime matches eager PyTorch at a size other than the
example's.

Runs in ``make test`` and in ``make test-compat`` (torch 2.1, where the tool picks this exporter by
itself). Needs onnx and onnxruntime only (not onnxscript, which the dynamo exporter uses).
Parity: the tool's own check, ``|onnx - eager| <= rtol * (|eager| + max|eager|)`` with rtol 1e-4,
eager PyTorch being the oracle.
"""
import os.path as osp

import pytest
import torch

pytest.importorskip('onnx')
pytest.importorskip('onnxruntime')

from mmlinattn.analysis import deploy as E  # noqa: E402
from mmlinattn.core.models import InLinePVT, InLineSwin, MAViT  # noqa: E402
from mmlinattn.core.ops.cores import CORES  # noqa: E402
from tools.deployment import export_onnx  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
RTOL = 1e-4
CASES = {
    # (config, part, example H W, second H W): a segmentor's and a detector's backbone + neck, and
    # the third family's backbone (within the size rule: InLine-Swin's multiples of 32)
    'segmentor-neck': ('configs/toy/fpn_inline-pvt-t_toy-ade.py', 'neck', (64, 64), (96, 128)),
    'detector-neck': ('configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py', 'neck', (128, 128),
                      (192, 160)),
    'swin-backbone': ('configs/toy/upernet_inline-swin-t_toy-ade.py', 'backbone', (64, 64),
                      (96, 128)),
    # the example at the position tables' own size (224 / 4 = 56): their resize must stay in the
    # graph, though at the example it is the identity
    'pvt-at-224': ('configs/toy/fpn_inline-pvt-t_toy-ade.py', 'backbone', (224, 224), (256, 192)),
}


def _props(path):
    import onnx
    return {p.key: p.value for p in onnx.load(path).metadata_props}


@pytest.mark.parametrize('case', list(CASES))
def test_dynamic_jit_export_matches_at_another_size(case, tmp_path, capsys):
    config, part, shape, other = CASES[case]
    out = str(tmp_path / 'x.onnx')
    rc = export_onnx.main([osp.join(ROOT, config), '--part', part, '--shape', *map(str, shape),
                           '--dynamic', '--exporter', 'jit', '--check-shape', *map(str, other),
                           '--out', out, '--rtol', str(RTOL)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert 'with the jit exporter' in text
    assert f'matches eager PyTorch within rtol {RTOL} at {shape[0]}x{shape[1]}, ' \
           f'{other[0]}x{other[1]}' in text
    props = _props(out)
    assert props['mmlinattn.exporter'] == 'jit' and props['mmlinattn.part'] == part


class _Holder(torch.nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone


@pytest.mark.parametrize('family', [InLinePVT, InLineSwin, MAViT], ids=lambda f: f.__name__)
def test_every_core_traces_with_dynamic_sizes(family, tmp_path):
    """Each stage with another core of the table (one letter per stage, the rest mixed in): the
    traced graph serves a second size. Eager inference runs the linear cores in chunks of
    CHUNK_TOKENS (4096) tokens; the first stage sees 5184 tokens at the example's size and 9216 at
    the second, so a chunk loop unrolled at the example's size (two chunks) would drop tokens."""
    letters = [c.letter for c in CORES.values()]
    stages = [letters[i::4] for i in range(4)]
    attn = ''.join(s[0] if len(s) == 1 else '(' + ''.join(f'{x}1' for x in s[:-1]) + s[-1] + ')'
                   for s in stages)
    torch.manual_seed(0)
    depths = [2, 2, 2, 2]
    kw = dict(embed_dims=16 if family is InLineSwin else [16, 32, 32, 32], depths=depths,
              num_heads=[1, 1, 1, 1], **({'mlp_ratio': 4} if family is InLinePVT else {}))
    m = family(arch=kw, attn_type=attn, drop_path_rate=0.0)
    m.init_weights()
    w = E.Exportable(_Holder(m).eval(), 'backbone')
    out = str(tmp_path / 'b.onnx')
    shape, other = (288, 288), (384, 384)
    rule = E.export(w, shape, out, dynamic=True, exporter='jit')
    rule.check(other)
    rows = E.check(out, w, [shape, other], rtol=RTOL)
    assert len(rows) == 8
    for r in rows:
        assert r['ok'], f"{r['output']} at {r['input']}: max rel err {r['max_rel']:.2e} > {RTOL}"


def test_static_jit_export_of_a_whole_segmentor(tmp_path, capsys):
    """A whole Semantic FPN through the decode head (its scale-factor upsampling keeps it
    static)."""
    out = str(tmp_path / 'seg.onnx')
    rc = export_onnx.main([osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py'), '--part', 'model',
                           '--shape', '64', '96', '--exporter', 'jit', '--out', out])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert 'seg_logits' in text and 'matches eager PyTorch' in text


def test_the_dynamo_exporter_on_a_torch_without_it_is_one_line(tmp_path, capsys, monkeypatch):
    from mmlinattn.core.ops import probes
    monkeypatch.setattr(probes, 'has_export', lambda: False)  # what torch < 2.5 answers
    assert E.default_exporter() == 'jit'
    out = str(tmp_path / 'x.onnx')
    cfg = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
    assert export_onnx.main([cfg, '--shape', '64', '64', '--exporter', 'dynamo', '--out', out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'torch >= 2.5' in err[0] and '--exporter jit' in err[0]
    assert not osp.exists(out)
