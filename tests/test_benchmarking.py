"""tools.workshop.benchmarking's measuring helpers against allocations of known size (numel x 4
B)."""
import torch

from tools.workshop.benchmarking import peak_memory

MB4 = 1000 * 1000 * 4  # a 1000 x 1000 float32 tensor


def _close(measured: int, expected: int) -> bool:
    return abs(measured - expected) <= 0.01 * expected


def test_peak_memory_counts_a_nested_allocation_once():
    """randn allocates through a nested aten::empty: one 4 MB tensor, not 8 MB."""
    assert _close(peak_memory(lambda: torch.randn(1000, 1000).sum()), MB4)


def test_peak_memory_follows_frees():
    def two_alive():
        a = torch.randn(1000, 1000)
        b = torch.ones(500, 1000)
        return a.sum() + b.sum()

    def one_after_another():
        a = torch.randn(1000, 1000)
        s = a.sum()
        del a
        b = torch.ones(500, 1000)
        return s + b.sum()
    assert _close(peak_memory(two_alive), MB4 + MB4 // 2)
    assert _close(peak_memory(one_after_another), MB4)


def test_count_passes_counts_the_floor_by_its_definition():
    """The floor is two products forward (K^T V, Q (K^T V)) and four gradient products backward;
    an elementwise op on (N x d) is a pass, one on (N x 1) and a view are not."""
    from tools.workshop.profiling import count_passes
    n, d = 37, 6
    q, k, v = (torch.randn(1, 2, n, d, requires_grad=True) for _ in range(3))
    g = torch.randn(1, 2, n, d)

    def floor():
        return torch.matmul(q, torch.matmul(k.transpose(-2, -1), v))
    with torch.no_grad():
        assert len(count_passes(floor, n, d)) == 2
        x = q.detach()
        assert count_passes(lambda: (x.transpose(-2, -1).exp() + 1).sum(-2, keepdim=True).exp(),
                            n, d) == ['aten::exp', 'aten::add', 'aten::sum']
    assert len(count_passes(lambda: torch.autograd.grad(floor(), (q, k, v), g), n, d)) == 6


def _detections(fixed_heads):
    from tools.workshop.benchmarking import bench_model
    torch.manual_seed(0)
    bench = bench_model('configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py', size=(96, 128),
                        fixed_heads=fixed_heads)
    model = bench.model.eval()
    with torch.no_grad():
        data = model.data_preprocessor(bench.make(1, bench.test_hw), False)
        feats = model.extract_feat(data['inputs'])
        proposals = model.rpn_head.predict(feats, data['data_samples'], rescale=False)
        dets = model.roi_head.predict(feats, proposals, data['data_samples'], rescale=True)
    return len(proposals[0]), len(dets[0]), bench.cfg.model.test_cfg


def test_same_head_work_keeps_every_proposal_and_detection():
    """mmdet's own heads: with --same-head-work a randomly initialised COCO Mask R-CNN hands on
    exactly its test_cfg's max_per_img proposals and detections (the mask head runs on all of
    them); without it the 0.05 score threshold keeps fewer (random class scores are ~1/81)."""
    n_prop, n_det, cfg = _detections(True)
    assert n_det == cfg.rcnn.max_per_img and n_prop == cfg.rpn.max_per_img
    assert cfg.rpn.nms.iou_threshold == 1.0 and cfg.rcnn.score_thr == 0.0
    _, n_det_default, cfg_default = _detections(False)
    assert n_det_default < n_det and cfg_default.rcnn.score_thr > 0


def test_infer_together_times_every_model_in_one_process():
    """--infer-together: one row per model, whole inference no faster than its backbone alone,
    and the table's ratio columns filled from the reference row."""
    from tools.analysis_tools.benchmark_step import table
    from tools.workshop.benchmarking import infer_together
    rows = infer_together([('configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py', None),
                           ('configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py', 'Swin-T')],
                          size=(96, 128), reps=2)
    assert [r['backbone'] for r in rows] == ['InLinePVT', 'Swin-T']
    for r in rows:
        assert r['infer_s'] >= r['infer_backbone_s'] > 0 and r['together'] and r['fixed_heads']
    md = table(rows)
    ratio = rows[1]['infer_s'] / rows[0]['infer_s']
    assert f'- / {ratio:.2f} (backbone ' in md
