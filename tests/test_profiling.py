"""benchmark_step.py --profile (mmlinattn.analysis.profiling): one warm training step under
torch.profiler, its time and saved memory charged to the model's parts. The checks are accounting
identities and the model's known structure, not timings."""
import pytest

from mmlinattn.analysis.profiling import profile_step, summary_table

MAVIT_CFG = 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py'  # MAViT-T, the toy's light heads


# a whole (toy) Mask R-CNN, two training steps at 64x64 (one profiled)
pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def mavit_profile():
    return profile_step(MAVIT_CFG, batch=1, size=(64, 64), warmup=1)


def test_profile_charges_every_part_of_a_mavit_detector(mavit_profile):
    res = mavit_profile
    parts = {r['path'] for r in res['rows']}
    # MAViT-T: stages 1-2 MALA, 3-4 softmax with RoPE applied to q, k (the authors' layout)
    for stage in ('s1', 's2'):
        assert f'backbone/{stage}/attn/core:mala' in parts, sorted(parts)
    for stage in ('s3', 's4'):
        assert f'backbone/{stage}/attn/core:softmax' in parts, sorted(parts)
    assert any(p.endswith('/rope') for p in parts), sorted(parts)
    for head in ('neck', 'rpn_head', 'roi_head'):
        assert head in parts, sorted(parts)
    rows = {r['path']: r for r in res['rows']}
    assert rows['backbone/s1/attn/core:mala']['bwd_ms'] > 0  # backward reached the core's range
    assert rows['backbone/s1/ffn']['saved_mb'] > 0  # the FFN keeps activations for backward


def test_profile_forward_adds_up_to_the_measured_forward(mavit_profile):
    """Every operator's self time and every range's own time is charged once: the parts sum to the
    profiled forward's wall time, less what runs outside any operator (a few %), never more."""
    res = mavit_profile
    fwd = sum(r['fwd_ms'] for r in res['rows']) / 1e3
    assert 0.8 * res['forward_s'] <= fwd <= 1.02 * res['forward_s'], (fwd, res['forward_s'])
    bwd = sum(r['bwd_ms'] for r in res['rows']) / 1e3
    assert 0.5 * res['backward_s'] <= bwd <= 1.02 * res['backward_s'], (bwd, res['backward_s'])


def test_summary_table_has_one_row_per_part(mavit_profile):
    md = summary_table([mavit_profile])
    for row in ('| backbone: core:mala |', '| backbone: core:softmax |', '| backbone: ffn |',
                '| neck |', '| roi_head |', '| **step (wall)** |'):
        assert row in md, md


def test_a_cascades_stage_heads_are_charged_to_the_roi_heads():
    """mmdet's CascadeRoIHead holds a head per stage in ModuleLists (``bbox_head.0``, ...), which
    its loss() calls one by one: each is the RoI heads' (was: 'other', 95 % of a Cascade step)."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    from mmlinattn.analysis.profiling import detector_part
    init_default_scope('mmdet')
    cfg = Config.fromfile('configs/_base_/models/cascade-mask-rcnn_fpn_4conv1fc-giou.py')
    head = MODELS.build(cfg.model.roi_head)
    stages = [f'roi_head.{n}' for n, _ in head.named_modules() if n.count('.') == 1]
    assert len(stages) == 12, stages  # 3 stages x (bbox, mask) x (extractor, head)
    assert {detector_part(n, None) for n in stages} == {'roi_head'}
    assert detector_part('roi_head.bbox_head.0.shared_convs', None) is None  # inside the range
