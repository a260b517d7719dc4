"""tests/compare.py, the comparison of two runs that sum in different orders: it lets through what
summation order can change and nothing else. The cases are built by hand from the rules in its
docstring (the measured batch-of-two noise, a detection at the score threshold, a near-tie pixel)
and from changes no rounding makes (another score, a lost detection, a moved box, another label)."""
import numpy as np
import pytest

import compare

RULES = dict(score_thr=0.05, nms_iou=0.5, max_per_img=100)


def dets(boxes, scores, labels):
    return dict(bboxes=np.array(boxes, float), scores=np.array(scores, float),
                labels=np.array(labels))


WANT = dets([[10, 10, 50, 60], [70, 20, 120, 90], [15, 80, 40, 110]], [0.5312231, 0.5088961, 0.2],
            [0, 1, 0])


def test_the_measured_batch_noise_passes():
    # scores measured for a batch of two against one image alone: 1.9e-5 relative apart
    got = dets(WANT['bboxes'] + 1e-3, [0.5312162, 0.5088862, 0.2000001], [0, 1, 0])
    pairs = compare.assert_same_detections(got, WANT, **RULES)
    assert sorted(pairs) == [(0, 0), (1, 1), (2, 2)]


@pytest.mark.parametrize('change', ['score', 'box', 'label', 'lost', 'extra'])
def test_what_rounding_cannot_do_fails(change):
    got = {k: v.copy() for k, v in WANT.items()}
    if change == 'score':
        got['scores'][1] *= 1.01
    elif change == 'box':
        got['bboxes'][0, 2] += 2.0
    elif change == 'label':
        got['labels'][2] = 1
    elif change == 'lost':
        got = {k: v[:2] for k, v in got.items()}
    else:
        got = dets(np.concatenate([got['bboxes'], [[200, 200, 240, 240]]]),
                   np.concatenate([got['scores'], [0.4]]), np.concatenate([got['labels'], [2]]))
    with pytest.raises(AssertionError, match='without a counterpart'):
        compare.assert_same_detections(got, WANT, **RULES)


def test_a_detection_at_a_decision_boundary_may_come_and_go():
    at_thr = dets(np.concatenate([WANT['bboxes'], [[200, 200, 240, 240]]]),
                  np.concatenate([WANT['scores'], [0.05 + 1e-7]]),
                  np.concatenate([WANT['labels'], [2]]))
    compare.assert_same_detections(at_thr, WANT, **RULES)  # kept in one run only: allowed
    with pytest.raises(AssertionError):  # without the threshold rule it is a real difference
        compare.assert_same_detections(at_thr, WANT, score_thr=None)
    # overlapping a higher-scored box of its class at exactly the NMS threshold: IoU 0.5
    box = [10, 10, 50, 60]
    other = [10, 10, 50, 60 + 50 * 1.0]  # twice the area, the first box inside: IoU 0.5
    at_nms = dets([box, other], [0.9, 0.3], [0, 0])
    alone = dets([box], [0.9], [0])
    compare.assert_same_detections(at_nms, alone, **RULES)
    with pytest.raises(AssertionError):
        compare.assert_same_detections(at_nms, alone, score_thr=0.05, nms_iou=0.7)


def test_label_maps_differ_only_at_near_ties():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 8, 8))
    want = logits.argmax(0)
    logits[:, 3, 3] = [1.0, 1.0 - 1e-6, -1, -1]  # a near-tie: class 0 or 1
    want[3, 3] = 0
    got = want.copy()
    got[3, 3] = 1
    assert compare.assert_same_label_maps(got, logits, want) == 1
    got[5, 5] = (want[5, 5] + 1) % 4  # a clear pixel
    with pytest.raises(AssertionError, match='1 of 64 pixels'):
        compare.assert_same_label_maps(got, logits)


def test_saturated_scores_still_need_most_detections_matched():
    """100 kept detections all scored within RTOL of each other (an untrained toy detector): each
    one is at the max_per_img cut, but a wholly different set is still a real change."""
    rng = np.random.default_rng(1)
    xy = rng.uniform(0, 100, (100, 2))
    boxes = np.concatenate([xy, xy + 20], 1)
    want = dets(boxes, 0.9999 + rng.uniform(0, 1e-5, 100), np.zeros(100, int))
    noisy = dets(boxes + 1e-3, want['scores'] * (1 + 1e-6), want['labels'])
    assert len(compare.assert_same_detections(noisy, want, **RULES)) == 100
    moved = dets(boxes + 30, want['scores'], want['labels'])
    with pytest.raises(AssertionError, match='0 of 100 detections matched'):
        compare.assert_same_detections(moved, want, **RULES)
