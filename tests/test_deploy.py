"""ONNX export (mmlinattn.analysis.deploy, tools/deployment/export_onnx.py): the three T backbones
with every attention core of the table, one whole segmentor and a dynamic export, each run with ONNX
Runtime (CPU) against eager PyTorch in float32; the size rule of dynamic exports and the refusals
name what to change.

Parity criterion (the tool's): ``|onnx - eager| <= rtol * (|eager| + max|eager|)`` elementwise with
rtol 1e-4, i.e. relative to each value and to the output's scale. Skipped if onnx / onnxruntime are
not installed (``pip install -r requirements/deploy.txt``).
"""
import os
import os.path as osp
import re

import pytest
import torch

pytest.importorskip('onnx')
pytest.importorskip('onnxscript')
pytest.importorskip('onnxruntime')

from mmlinattn.analysis import deploy as E  # noqa: E402
from mmlinattn.core.models import InLinePVT, InLineSwin, MAViT  # noqa: E402
from mmlinattn.core.ops.cores import CORES  # noqa: E402
from mmlinattn.training.cli import load_config  # noqa: E402
from tools.deployment import export_onnx  # noqa: E402

from helpers import tiny_arch  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
# ONNX Runtime's kernels block and split the sums otherwise than torch's: measured up to 3.5e-6 of
# an output's scale (single cores at 9k tokens, the T backbones, the segmentor; 1 and 2 threads),
# 30x under RTOL, which is 100x under a wrong or missing term (1e-2)
RTOL = 1e-4
FAMILIES = {'InLinePVT': InLinePVT, 'InLineSwin': InLineSwin, 'MAViT': MAViT}


class _Holder(torch.nn.Module):
    """A model with only a backbone, as ``Exportable`` expects."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone


def every_letter(n_stages: int = 4) -> str:
    """One attn_type with every letter of the core table, one stage each (cycling if the table has
    more letters than stages: mixed stages then)."""
    letters = [c.letter for c in CORES.values()]
    stages = [letters[i::n_stages] for i in range(n_stages)]
    return ''.join(s[0] if len(s) == 1 else '(' + ''.join(f'{x}1' for x in s[:-1]) + s[-1] + ')'
                   for s in stages)


def export_depths(family: str, attn_type: str):
    """Blocks a stage for the exported backbones (T's widths and heads otherwise): as few as show
    each of the stage's cores, 1 for a single-core stage and one a core for a mixed one, plus
    InLine-Swin's shifted-window block (the second of a softmax stage). A stage's further blocks are
    the same block again (MAViT-T and InLine-Swin-T have 6 in stage 3), so exporting them checks
    nothing more, while the export's time grows with the graph: torch.export and the ONNX
    translation are ~all of it (MAViT-T with every core 26 s, the dynamic MAViT-T 68 s on one
    thread; ONNX Runtime and eager under 1 s)."""
    depths = []
    for stage in re.findall(r'\([^)]*\)|[A-Z]', attn_type):
        n = len(re.findall('[A-Z]', stage))
        depths.append(n + (family == 'InLineSwin' and 'S' in stage))
    return depths


def _backbone(family: str, depths=None, **kw):
    """The family's T backbone; with ``depths``, that many blocks in each stage (T's widths and
    heads)."""
    torch.manual_seed(0)
    arch = tiny_arch(FAMILIES[family], depths) if depths else 'tiny'
    m = FAMILIES[family](arch=arch, drop_path_rate=0.0, **kw)
    m.init_weights()
    return E.Exportable(_Holder(m).eval(), 'backbone')


def _assert_parity(rows, n_outputs, shapes):
    assert len(rows) == n_outputs * len(shapes)
    assert sorted({tuple(r['input']) for r in rows}) == sorted(tuple(s) for s in shapes)
    for r in rows:
        assert r['ok'], f"{r['output']} at {r['input']}: max rel err {r['max_rel']:.2e} > {RTOL}"
        assert r['max_rel'] < RTOL


class _Core(torch.nn.Module):
    def __init__(self, core):
        super().__init__()
        self.core = core

    def forward(self, q, k, v):
        return self.core(q, k, v)


@pytest.mark.parametrize('name', list(CORES))
def test_core_exports_with_dynamic_tokens(name, tmp_path):
    """Each core of the table alone, N dynamic: the linear attentions stream over N in chunks of
    4096 tokens without autograd (eager, here), but not while torch.export traces, so one graph
    serves any N; ONNX Runtime matches the chunked eager result at N below, across and above one
    chunk."""
    import onnxruntime as ort
    from torch.export import Dim

    from mmlinattn.core.ops.attention import CHUNK_TOKENS
    core = CORES[name]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, CHUNK_TOKENS + 904, 8, generator=g) for _ in range(3))
    n = Dim('tokens', min=2)
    with torch.no_grad():
        program = torch.export.export(_Core(core), (q, k, v), strict=False,
                                      dynamic_shapes=({2: n}, {2: n}, {2: n}))
    path = str(tmp_path / f'{name}.onnx')
    torch.onnx.export(program, (q, k, v), path, dynamo=True, external_data=False, verbose=False)
    sess = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    feeds = [i.name for i in sess.get_inputs()]
    for tokens in (1000, CHUNK_TOKENS + 904, 2 * CHUNK_TOKENS + 17):
        qkv = [t[:, :, :tokens] if tokens <= t.shape[2] else
               torch.randn(1, 1, tokens, 8, generator=g) for t in (q, k, v)]
        with torch.no_grad():
            ref = core(*qkv)
        got = sess.run(None, dict(zip(feeds, (t.numpy() for t in qkv))))[0]
        row = E.compare([got], [ref], [name], RTOL)[0]
        assert row['ok'], f'{name} at N={tokens}: max rel err {row["max_rel"]:.2e}'


def test_every_letter_covers_the_table():
    spec = every_letter()
    assert all(c.letter in spec for c in CORES.values())


@pytest.mark.parametrize('family', list(FAMILIES))
def test_t_backbone_with_every_core_matches_onnxruntime(family, tmp_path):
    """Each T backbone (blocks a stage: export_depths) with every core of the table (one per stage;
    InLine-Swin's softmax stage in shifted 7x7 windows with padding at this size), static 64x96,
    four outputs within rtol 1e-4."""
    spec = every_letter()
    w = _backbone(family, depths=export_depths(family, spec), attn_type=spec)
    out = str(tmp_path / 'bb.onnx')
    assert E.export(w, (64, 96), out) is None
    rows = E.check(out, w, [(64, 96)], rtol=RTOL)
    _assert_parity(rows, 4, [(64, 96)])
    assert [r['output'] for r in rows] == ['out0', 'out1', 'out2', 'out3']


def test_segmentor_matches_onnxruntime(tmp_path):
    """The whole Semantic FPN with InLine-PVT-T, through the neck, the decode head and the resize
    to the input: one output, the logits at the input size. The backbone has a block a stage (T's
    widths, heads and cores): its second blocks are the first again, and its cores are checked by
    test_t_backbone_with_every_core_matches_onnxruntime; 2 fewer blocks save ~4 s of export."""
    cfg = load_config(osp.join(ROOT, 'configs/inline_pvt/fpn_inline-pvt-t_80k_ade20k-512x512.py'))
    cfg.model.backbone.arch = tiny_arch(FAMILIES['InLinePVT'], [1, 1, 1, 1])
    torch.manual_seed(0)
    w = E.Exportable(E.build_model(cfg), 'model')
    out = str(tmp_path / 'seg.onnx')
    E.export(w, (128, 128), out)
    rows = E.check(out, w, [(128, 128)], rtol=RTOL)
    _assert_parity(rows, 1, [(128, 128)])
    assert rows[0]['output'] == 'seg_logits' and rows[0]['shape'] == [1, 150, 128, 128]
    # what the graph computes is mmseg's encode_decode (logits resized to the input)
    x = E.example_input((128, 128), seed=3)
    with torch.no_grad():
        ref = w.model.encode_decode(x, [dict(img_shape=(128, 128), pad_shape=(128, 128))])
        assert torch.equal(w(x)[0], ref)  # the wrapper makes this very call: equal bit for bit


def test_dynamic_export_serves_two_sizes(tmp_path):
    """MAViT-T (its cores MMSS, a block a stage: export_depths) with dynamic height / width: one
    file, checked at a square and a non-square size."""
    w = _backbone('MAViT', depths=export_depths('MAViT', 'MMSS'), attn_type='MMSS')
    out = str(tmp_path / 'dyn.onnx')
    rule = E.export(w, (64, 64), out, dynamic=True)
    assert rule.low == (64, 64) and rule.multiple == 1 and rule.high == (None, None)
    rows = E.check(out, w, [(64, 64), (96, 128)], rtol=RTOL)
    _assert_parity(rows, 4, [(64, 64), (96, 128)])
    import onnx
    props = {p.key: p.value for p in onnx.load(out).metadata_props}
    assert props['mmlinattn.size_rule'] == rule.text() and props['mmlinattn.part'] == 'backbone'


def test_compare_fails_on_a_wrong_output():
    """The parity check can fail: a 1e-3 relative change of one value is caught, 1e-6 is not."""
    e = torch.randn(2, 8, 4, 4)
    o = e.numpy().copy()
    assert E.compare([o], [e], ['out0'], RTOL)[0]['ok']
    o[0, 0, 0, 0] += 1e-3 * float(e.abs().max())
    row = E.compare([o], [e], ['out0'], RTOL)[0]
    assert not row['ok'] and row['max_rel'] == pytest.approx(1e-3, rel=1e-3)
    assert not E.compare([o[:, :4]], [e], ['out0'], RTOL)[0]['ok']  # a wrong shape fails too


# --------------------------------------------------------------------------------------------------
# size rules and refusals (no export: fast)
# --------------------------------------------------------------------------------------------------
def test_size_rule_of_each_family():
    pvt = E.size_rule(_backbone('InLinePVT'), (64, 96))
    assert (pvt.multiple, pvt.low, pvt.high) == (1, (64, 64), (None, None))
    # InLine-Swin-T: stage 4 (stride 32) is softmax in 7x7 windows: one window up to 224 px
    swin = _backbone('InLineSwin')  # one build for the three example shapes
    small = E.size_rule(swin, (64, 96))
    assert (small.multiple, small.low, small.high) == (32, (64, 64), (224, 224))
    large = E.size_rule(swin, (256, 320))
    assert (large.low, large.high) == ((256, 256), (None, None))
    mixed = E.size_rule(swin, (128, 288))
    assert (mixed.low, mixed.high) == ((64, 256), (224, None))
    assert mixed.allows((224, 256)) and not mixed.allows((256, 256)) and not mixed.allows((96, 240))
    assert mixed.near((128, 288)) == (192, 320) and mixed.allows(mixed.near((128, 288)))


def test_dynamic_refuses_a_shape_outside_the_rule():
    w = _backbone('InLineSwin')
    with pytest.raises(E.ExportError, match=r'the example shape 64x100 is outside the size rule.*'
                                            r'a multiple of 32'):
        E.size_rule(w, (64, 100))
    rule = E.size_rule(w, (64, 96))
    with pytest.raises(E.ExportError, match=r'--check-shape 256x256 is outside.*<= 224'):
        rule.check((256, 256), '--check-shape')


def test_cli_refusals(tmp_path, capsys):
    det = osp.join(ROOT, 'configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py')
    out = str(tmp_path / 'x.onnx')
    assert export_onnx.main([det, '--shape', '128', '128', '--part', 'model', '--out', out]) == 2
    assert "mmdeploy's job" in capsys.readouterr().err
    upernet = osp.join(ROOT, 'configs/mavit/upernet_mavit-t_160k_ade20k-512x512.py')
    assert export_onnx.main([upernet, '--shape', '64', '64', '--part', 'neck', '--out', out]) == 2
    assert 'has no neck' in capsys.readouterr().err
    # the detector's neck (FPN with a stride-64 level): 2 x 64 px at least for a dynamic export
    assert export_onnx.main([det, '--shape', '96', '128', '--part', 'neck', '--dynamic',
                             '--out', out]) == 2
    assert 'largest feature stride (64)' in capsys.readouterr().err
    assert not osp.exists(out)


def _no_model(monkeypatch):
    """export_onnx's model building replaced by a recorder that fails: a check that passes it came
    too late."""
    built = []

    def build_model(*args, **kwargs):
        built.append(args)
        raise RuntimeError('the model was built')
    monkeypatch.setattr(export_onnx, 'build_model', build_model)
    return built


def test_cli_refuses_a_check_shape_before_writing_the_file(tmp_path, capsys, monkeypatch):
    """A ``--check-shape`` a static export cannot take (another size) is refused before the model
    is built, one outside a dynamic export's size rule before the export: one line, exit 2, no
    ONNX file. Was: the file written first, then exit 2 with the file left behind."""
    det = osp.join(ROOT, 'configs/toy/retinanet_mavit-t_fpn_toy-coco.py')
    out = tmp_path / 'x.onnx'
    built = _no_model(monkeypatch)

    def run(*args):
        rc = export_onnx.main([det, '--shape', '128', '128', *args, '--out', str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and not out.exists(), (rc, err)
        return err[0]
    assert run('--check-shape', '96', '96') == ('export_onnx: error: --check-shape 96 96: a static '
                                                'export takes only its own 128x128 (add --dynamic)')
    assert not built
    monkeypatch.undo()
    exported = []
    monkeypatch.setattr(E, 'export', lambda *args, **kwargs: exported.append(args))
    # MAViT-T's largest stride is 32: a dynamic graph takes sides of 64 px and more
    said = run('--dynamic', '--check-shape', '32', '32')
    assert said.startswith('export_onnx: error: --check-shape 32x32 is outside the size rule of '
                           'this dynamic export: height >= 64; width >= 64'), said
    assert not exported


@pytest.mark.parametrize('args, said', [
    (['--shape', '0', '0'], '--shape 0 0: height and width must be positive'),
    (['--shape', '-64', '64'], '--shape -64 64: height and width must be positive'),
    (['--shape', '64', '64', '--dynamic', '--check-shape', '96', '0'],
     '--check-shape 96 0: height and width must be positive'),
    (['--shape', '64', '64', '--batch', '0'], '--batch 0: the batch size must be at least 1'),
], ids=['zero', 'negative', 'check-shape', 'batch'])
def test_cli_refuses_a_size_that_is_not_positive_before_any_work(args, said, tmp_path, capsys,
                                                                 monkeypatch):
    """One line naming the flag and its values, exit 2, before the config is read (it does not
    exist here) or a model built. Was: a traceback from the model or the exporter."""
    built = _no_model(monkeypatch)
    out = tmp_path / 'x.onnx'
    rc = export_onnx.main([str(tmp_path / 'none.py'), *args, '--out', str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f'export_onnx: error: {said}'), err
    assert not built and not out.exists()


def test_cli_refuses_an_out_it_cannot_write_before_the_export(tmp_path, capsys, monkeypatch):
    """--out under a regular file (its folder cannot be created, also as root), on a read-only
    file system (the probe write made to fail with EROFS: root writes anywhere else), or naming a
    folder: one line naming --out and why, exit 2, before the model is built. Was: a traceback
    after the whole export."""
    import errno
    import tempfile
    det = osp.join(ROOT, 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py')
    built = _no_model(monkeypatch)
    blocker = tmp_path / 'file'
    blocker.write_text('a file, not a folder')

    def run(out):
        rc = export_onnx.main([det, '--shape', '64', '64', '--out', str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, err
        return err[0]
    said = run(blocker / 'sub' / 'x.onnx')
    assert said == (f'export_onnx: error: --out {blocker / "sub" / "x.onnx"}: its folder cannot be '
                    f'created, {blocker} is a file; give --out a path in a folder you can write')
    assert run(tmp_path).startswith(f'export_onnx: error: --out {tmp_path} is a folder; give the '
                                    'ONNX file to write')

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(tempfile, 'mkstemp', read_only)
    said = run(tmp_path / 'new' / 'x.onnx')
    assert said == (f'export_onnx: error: --out {tmp_path / "new" / "x.onnx"}: cannot write in '
                    f'{tmp_path} ({os.strerror(errno.EROFS)}); give --out a path in a folder you '
                    'can write')
    assert not built and not (tmp_path / 'new').exists()


@pytest.mark.parametrize('config, what', [
    ('configs/mavit/upernet_mavit-t_160k_ade20k-512x512.py', 'adaptive pooling to 2'),
    ('configs/inline_pvt/fpn_inline-pvt-t_80k_ade20k-512x512.py', 'scale factor 2'),
], ids=['upernet', 'semantic-fpn'])
def test_dynamic_refused_where_the_head_fixes_the_size(config, what, tmp_path, capsys):
    """mmseg's heads: UperNet's pyramid pooling and Semantic FPN's scale-factor upsampling keep the
    whole segmentor static; the refusal names the module and says to export per size."""
    out = str(tmp_path / 'x.onnx')
    assert export_onnx.main([osp.join(ROOT, config), '--shape', '64', '64', '--part', 'model',
                             '--dynamic', '--out', out]) == 2
    err = capsys.readouterr().err
    assert 'cannot be exported with a dynamic height / width' in err and what in err
    assert 'decode_head.' in err and 'one file per input size' in err
