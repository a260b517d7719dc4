"""FLOP counting (mmlinattn.analysis.flops, tools/analysis_tools/get_flops.py) against the papers'
tables.

The expected numbers are typed here from the papers (InLine: Tab. 5 backbones at 224, Tab. 7 Mask /
Cascade Mask R-CNN on COCO at 1280x800, Tab. 9 and 13 Semantic FPN / UperNet on ADE20K at 2048x512;
MALA: Tab. 2 backbones, Tab. 3 and 4 COCO, Tab. 5 ADE20K), not read from the library's own table.
Each whole model is counted under its paper's convention (InLine: every matmul; MALA: the layers
only, no attention core products) and must come within 5 %; the zoo's metafiles
(configs/*/metafile.yml) must hold the paper numbers typed here and the counts made here. The
smallest variants run by default, the rest are marked heavy (a large model at 1280x800 takes about
a minute on 2 cores)."""
import os.path as osp
import re

import pytest
import torch
import yaml

from mmlinattn.analysis import flops

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

# (config, convention, the paper's GFLOPs)
PAPERS = [
    # InLine, Tab. 7 (a): Mask R-CNN 1x
    ('inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco', 'inline', 211),
    ('inline_pvt/mask-rcnn_inline-pvt-s_fpn_1x_coco', 'inline', 250),
    ('inline_pvt/mask-rcnn_inline-pvt-m_fpn_1x_coco', 'inline', 310),
    ('inline_pvt/mask-rcnn_inline-pvt-l_fpn_1x_coco', 'inline', 377),
    # InLine, Tab. 7 (b): Cascade Mask R-CNN 3x
    ('inline_swin/cascade-mask-rcnn_inline-swin-s_fpn_ms-3x_coco', 'inline', 835),
    ('inline_swin/cascade-mask-rcnn_inline-swin-b_fpn_ms-3x_coco', 'inline', 978),
    # InLine, Tab. 9 (PVT-M: appendix Tab. 13): Semantic FPN and UperNet on ADE20K
    ('inline_pvt/fpn_inline-pvt-t_80k_ade20k-512x512', 'inline', 127),
    ('inline_pvt/fpn_inline-pvt-s_80k_ade20k-512x512', 'inline', 168),
    ('inline_pvt/fpn_inline-pvt-m_80k_ade20k-512x512', 'inline', 229),
    ('inline_pvt/fpn_inline-pvt-l_80k_ade20k-512x512', 'inline', 298),
    ('inline_swin/upernet_inline-swin-t_160k_ade20k-512x512', 'inline', 941),
    # InLine, Tab. 13 (appendix): UperNet with the larger InLine-Swin
    ('inline_swin/upernet_inline-swin-s_160k_ade20k-512x512', 'inline', 1035),
    ('inline_swin/upernet_inline-swin-b_160k_ade20k-512x512', 'inline', 1183),
    # MALA, Tab. 4: Mask R-CNN 1x and RetinaNet 1x
    ('mavit/mask-rcnn_mavit-t_fpn_1x_coco', 'mala', 219),
    ('mavit/mask-rcnn_mavit-s_fpn_1x_coco', 'mala', 262),
    ('mavit/mask-rcnn_mavit-b_fpn_1x_coco', 'mala', 372),
    ('mavit/mask-rcnn_mavit-l_fpn_1x_coco', 'mala', 501),
    ('mavit/retinanet_mavit-t_fpn_1x_coco', 'mala', 201),
    ('mavit/retinanet_mavit-s_fpn_1x_coco', 'mala', 244),
    ('mavit/retinanet_mavit-b_fpn_1x_coco', 'mala', 353),
    ('mavit/retinanet_mavit-l_fpn_1x_coco', 'mala', 482),
    # MALA, Tab. 3: Mask R-CNN 3x + MS and Cascade Mask R-CNN 3x + MS
    ('mavit/mask-rcnn_mavit-s_fpn_ms-3x_coco', 'mala', 262),
    ('mavit/mask-rcnn_mavit-b_fpn_ms-3x_coco', 'mala', 372),
    ('mavit/mask-rcnn_mavit-l_fpn_ms-3x_coco', 'mala', 501),
    ('mavit/cascade-mask-rcnn_mavit-s_fpn_ms-3x_coco', 'mala', 741),
    ('mavit/cascade-mask-rcnn_mavit-b_fpn_ms-3x_coco', 'mala', 851),
    ('mavit/cascade-mask-rcnn_mavit-l_fpn_ms-3x_coco', 'mala', 979),
    # MALA, Tab. 5: Semantic FPN 80k and UperNet 160k
    ('mavit/fpn_mavit-t_80k_ade20k-512x512', 'mala', 136),
    ('mavit/fpn_mavit-s_80k_ade20k-512x512', 'mala', 180),
    ('mavit/fpn_mavit-b_80k_ade20k-512x512', 'mala', 292),
    ('mavit/fpn_mavit-l_80k_ade20k-512x512', 'mala', 424),
    ('mavit/upernet_mavit-t_160k_ade20k-512x512', 'mala', 893),
    ('mavit/upernet_mavit-s_160k_ade20k-512x512', 'mala', 937),
    ('mavit/upernet_mavit-b_160k_ade20k-512x512', 'mala', 1050),
    ('mavit/upernet_mavit-l_160k_ade20k-512x512', 'mala', 1182),
]
# the default suite: one detector and one segmentor of each paper, smallest variants (~5-10 s each)
FAST = {'inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco',
        'inline_pvt/fpn_inline-pvt-t_80k_ade20k-512x512',
        'mavit/mask-rcnn_mavit-t_fpn_1x_coco', 'mavit/fpn_mavit-t_80k_ade20k-512x512'}
# backbones at 224x224: InLine Tab. 5, MALA Tab. 2
BACKBONES = [('InLinePVT', 'tiny', 'inline', 2.0), ('InLinePVT', 'small', 'inline', 3.9),
             ('InLinePVT', 'medium', 'inline', 6.9), ('InLinePVT', 'large', 'inline', 10.2),
             ('InLineSwin', 'tiny', 'inline', 4.5), ('InLineSwin', 'small', 'inline', 8.7),
             ('InLineSwin', 'base', 'inline', 15.4), ('MAViT', 'tiny', 'mala', 2.5),
             ('MAViT', 'small', 'mala', 4.6), ('MAViT', 'base', 'mala', 9.9),
             ('MAViT', 'large', 'mala', 16.1)]
BACKBONE_CASES = [pytest.param(*b, marks=() if b[1] == 'tiny' else (pytest.mark.heavy,))
                  for b in BACKBONES]


def _cases():
    for config, conv, paper in PAPERS:
        marks = () if config in FAST else (pytest.mark.heavy,)
        yield pytest.param(config, conv, paper, marks=marks, id=config.split('/')[1])


@pytest.mark.parametrize('config,convention,paper', list(_cases()))
def test_whole_model_within_5_percent_of_the_paper(config, convention, paper):
    path = osp.join(ROOT, 'configs', config + '.py')
    params, count, _, shape = flops.model_flops(path, convention=convention)
    assert shape == ((800, 1280) if config.endswith('_coco') else (512, 2048))
    assert abs(count / 1e9 - paper) / paper < 0.05, (count / 1e9, paper)
    # the zoo entry holds this count (and, where the paper counts everything, as its FLOPs)
    meta = _zoo_metadata()[config.split('/')[1]]
    assert f'{count / 1e9:.1f}' == f'{meta["Paper-Convention FLOPs (G)"]:.1f}'
    assert params == meta['Parameters']
    if convention == 'inline':
        assert count == meta['FLOPs']


@pytest.mark.parametrize('name,arch,convention,paper', BACKBONE_CASES)
def test_backbone_at_224_within_5_percent_of_the_paper(name, arch, convention, paper):
    _, count, _ = flops.backbone_flops(name, arch, convention=convention)
    assert abs(count / 1e9 - paper) / paper < 0.05, (count / 1e9, paper)


def test_mala_convention_counts_the_layers_only():
    """MAViT-T (at 128x128) under 'mala' counts what the same model counts under 'all' with every
    attention core replaced by one that does no arithmetic (returns v): the layers, no token mixing.
    Under 'all' the difference is at least the softmax stages' QK^T and AV (stages 3 and 4, global
    attention over N = 8x8 and 4x4 tokens: 2 N^2 C multiply-adds per block)."""
    model = flops.BACKBONES['MAViT'](arch='tiny').eval()
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        all_ = flops.count(model, (x,), 'all')[0]
        mala = flops.count(model, (x,), 'mala')[0]
        softmax = 0
        for i, stage in enumerate(model.layers):
            n = (128 // (4 * 2 ** i)) ** 2
            for blk in stage.blocks:
                softmax += 2 * n * n * blk.attn.dim if blk.attn.core == 'softmax' else 0
                blk.attn._run_core = lambda q, k, v, **context: v
        layers = flops.count(model, (x,), 'all')[0]
    assert softmax > 0
    assert mala == layers
    assert all_ - mala > softmax


def test_sdpa_and_baddbmm_are_counted():
    """mmengine's analyzer skips both; by definition QK^T + AV is 2 L S E and baddbmm B n k m."""
    class M(torch.nn.Module):
        def forward(self, q, a, b):
            sdpa = torch.nn.functional.scaled_dot_product_attention(q, q, q)
            return sdpa, torch.baddbmm(q[0], a, b)
    q, a, b = torch.randn(1, 2, 10, 4), torch.randn(2, 10, 3), torch.randn(2, 3, 4)
    count, _ = flops.count(M(), (q, a, b))
    assert count == 2 * (2 * 10 * 10 * 4) + 2 * 10 * 3 * 4
    assert flops.count(M(), (q, a, b), 'mala')[0] == 0      # neither is a layer


MASK_RCNN = osp.join(ROOT, 'configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py')


def test_roi_heads_counted_as_mmdet2_forward_dummy():
    """Mask R-CNN's RoI heads, by their definition in the config: 1000 boxes through the shared
    2-fc bbox head (RoI 7x7x256 -> 1024 -> 1024 -> classes + 1 scores and 4 x classes deltas) and
    the first 100 through the mask head (four 3x3 convs on 14x14x256, a 2x2 stride-2 deconvolution,
    a 1x1 conv to one mask per class). The image size does not change them.

    The whole-model conventions hold those two numbers (mmdet 2's ``forward_dummy``); the count
    itself runs one model (built once) on 100 boxes and their first 10 masks, which checks the same
    per-box and per-mask arithmetic and that :class:`flops.WholeModel` takes both numbers from its
    convention (1000 boxes and 100 masks would add ~60 GFLOPs of RoI heads to count, ~7 s)."""
    from mmengine.config import Config
    for name in ('all', 'inline', 'mala'):
        conv = flops.CONVENTIONS[name]
        assert (conv.roi_heads, conv.num_proposals, conv.num_mask_rois) == (True, 1000, 100), name
    cfg = Config.fromfile(MASK_RCNN)
    bbox, mask = cfg.model.roi_head.bbox_head, cfg.model.roi_head.mask_head
    c, k, fc, cls = bbox.in_channels, bbox.roi_feat_size, bbox.fc_out_channels, bbox.num_classes
    per_box = c * k * k * fc + fc * fc + fc * (cls + 1) + fc * 4 * cls
    m, s = mask.conv_out_channels, 14
    per_mask = (mask.num_convs * m * m * 9 * s * s + m * m * 4 * s * s
                + m * mask.num_classes * (2 * s) ** 2)
    model, _ = flops.build_model(cfg)   # as flops.model_flops builds and counts it
    x = torch.randn(1, 3, 128, 160)
    with torch.no_grad():
        counted = {}
        for key, conv in (('whole', flops.Convention(num_proposals=100, num_mask_rois=10)),
                          ('dense', flops.Convention(roi_heads=False))):
            counted[key] = flops.count(flops.WholeModel(model, conv), (x,), conv)[0]
    assert counted['whole'] - counted['dense'] == 100 * per_box + 10 * per_mask


def _zoo_metadata():
    """config name -> the Metadata of its zoo entry (configs/<family>/metafile.yml)."""
    meta = {}
    for family in ('inline_pvt', 'inline_swin', 'mavit'):
        with open(osp.join(ROOT, 'configs', family, 'metafile.yml')) as f:
            meta.update((m['Name'], m['Metadata']) for m in yaml.safe_load(f)['Models'])
    return meta


def test_metafile_paper_flops_are_the_papers_and_within_5_percent():
    """Each zoo entry's "Paper FLOPs (G)" is the paper number typed above, and its
    "Paper-Convention FLOPs (G)" (our count under the paper's convention) is within 5 % of it;
    models the papers do not report have neither."""
    typed = {c.split('/')[1]: p for c, _, p in PAPERS}
    seen = set()
    for name, meta in _zoo_metadata().items():
        if name not in typed:
            assert 'Paper FLOPs (G)' not in meta and 'Paper-Convention FLOPs (G)' not in meta, name
            continue
        ours, paper = meta['Paper-Convention FLOPs (G)'], meta['Paper FLOPs (G)']
        assert paper == typed[name], name
        assert abs(ours - paper) / paper < 0.05, name
        seen.add(name)
    assert seen == set(typed)


def test_cli_counts_a_config_whole_shape_one_value_is_a_square_and_cfg_options_apply(capsys):
    """The tool counts a config's whole model (``--shape H W``); mmseg's ``--shape S`` (one value:
    S x S) and ``--cfg-options`` of every OpenMMLab tool. (One test: the whole-model count and the
    square's reference are the same ``--shape 64 64`` run.)"""
    from tools.analysis_tools import get_flops
    cfg = osp.join(ROOT, 'configs/toy/mask-rcnn_inline-pvt-t_fpn_toy-coco.py')
    get_flops.main([cfg, '--shape', '64', '64'])
    out = capsys.readouterr().out
    assert re.search(r'@ 64x64: params [\d.]+ M, FLOPs [\d.]+ G \(whole model', out), out
    get_flops.main([cfg, '--shape', '64'])
    square = capsys.readouterr().out
    assert '@ 64x64:' in square
    assert out == square
    # the small backbone through --cfg-options: the InLine paper's Tab. 5 gives InLine-PVT-T 12.0 M
    # and InLine-PVT-S 21.6 M parameters (same widths, so the neck and heads do not change)
    get_flops.main([cfg, '--shape', '64', '--cfg-options', 'model.backbone.arch=small'])
    small = capsys.readouterr().out
    params = [float(re.search(r'params ([\d.]+) M', o).group(1)) for o in (square, small)]
    assert abs((params[1] - params[0]) - (21.6 - 12.0)) < 0.2, params


def test_cli_bad_cfg_option_and_missing_dataset_are_named(tmp_path, capsys):
    from tools.analysis_tools import get_flops
    cfg = osp.join(ROOT, 'configs/toy/mask-rcnn_inline-pvt-t_fpn_toy-coco.py')
    with pytest.raises(SystemExit) as e:
        get_flops.main([cfg, '--cfg-options', 'model.backbone.arhc=small'])
    assert e.value.code == 2 and 'model.backbone.arhc' in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        get_flops.main([cfg, '--num-images', '2', '--cfg-options',
                        f'val_dataloader.dataset.data_root={tmp_path}/none'])
    err = capsys.readouterr().err
    assert e.value.code == 2 and 'val_dataloader.dataset.data_root' in err and 'none' in err
    with pytest.raises(SystemExit):
        get_flops.main([cfg, '--shape', '64', '64', '64'])


@pytest.mark.parametrize('config,convention,paper_params,paper_gflops', [
    ('inline-pvt-t_in1k', 'inline', 12.0, 2.0),  # InLine paper, Tab. 5
    ('mavit-t_in1k', 'mala', 16, 2.5),            # MALA paper, Tab. 2
])
def test_cli_counts_a_classification_config(capsys, config, convention, paper_params,
                                            paper_gflops):
    """mmpretrain configs (were a KeyError): the whole classifier at 224, head included, as the
    papers' ImageNet tables count it."""
    from tools.analysis_tools import get_flops
    get_flops.main([osp.join(ROOT, 'configs/classification', config + '.py'),
                    '--convention', convention])
    m = re.search(r'@ 224x224: params ([\d.]+) M, FLOPs ([\d.]+) G', capsys.readouterr().out)
    params, gflops = float(m.group(1)), float(m.group(2))
    assert abs(params - paper_params) / paper_params < 0.05
    assert abs(gflops - paper_gflops) / paper_gflops < 0.05
