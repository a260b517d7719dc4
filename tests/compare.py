"""Comparing two forwards of one model that sum in different orders.

Two runs of the same float32 network agree bit for bit only when they execute the same kernels on
the same shapes with the same thread split. A batch of two padded images against one image alone,
two DDP ranks against one process, 1 thread against 2, a compiled graph against eager: each changes
the order of the sums inside GEMMs and convolutions (blocking, padding, the split over threads).

How far apart that can put the outputs (the tolerance below): float32's unit roundoff is
u = 2**-24 ~ 6e-8. A reduction of n terms summed in another order moves by about sqrt(n) * u
relative in practice (n * u in the worst case); our widest reductions are a 3x3 convolution or a
linear layer over 512 channels (n ~ 4.6k: ~4e-6), and a detector stacks about ten such layers
between the image and a score (backbone stage, FPN, RPN, RoI head), so about 4e-5 relative at
the scores - what was measured (1.9e-5 on a batch of two against one image, AMD EPYC). RTOL = 2e-4
leaves a factor of five over that and is still three orders of magnitude below what a real
difference gives (another weight, another pipeline, a padded token in an attention: 1e-2 and up).

What such noise cannot change, and is compared exactly: the labels, which detections exist except
at the model's own decision boundaries, and a label map except at near-ties. What it can change:
a score or a box coordinate within RTOL; a detection whose score sits within RTOL of the score
threshold, of the last place kept by ``max_per_img``, or whose overlap with a higher-scored box of
its class sits within RTOL of the NMS threshold (it may be kept in one run and dropped in the
other); a pixel whose two best class logits are within RTOL of each other.
"""
import numpy as np

RTOL = 2e-4
# box coordinates are pixels: RTOL of a coordinate up to ~2000 px is 0.4 px; the absolute floor
# covers the boxes' offsets near the origin (RTOL * 0 = 0)
BOX_ATOL = 1e-2
# a score lies in [0, 1]; the absolute floor covers scores near 0
SCORE_ATOL = 1e-6


def _np(x):
    if hasattr(x, 'detach'):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def iou_matrix(a, b):
    """IoU of every box of ``a`` (n, 4) with every box of ``b`` (m, 4), x1 y1 x2 y2."""
    a, b = _np(a).reshape(-1, 4), _np(b).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area = lambda x: np.clip(x[:, 2:] - x[:, :2], 0, None).prod(-1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return inter / np.maximum(union, 1e-12)


def _as_dets(d):
    """(bboxes (n, 4), scores (n,), labels (n,)) from a dict, an InstanceData or a data sample."""
    if hasattr(d, 'pred_instances'):
        d = d.pred_instances
    get = (lambda k: d[k]) if isinstance(d, dict) else (lambda k: getattr(d, k))
    return _np(get('bboxes')).reshape(-1, 4), _np(get('scores')).reshape(-1), \
        _np(get('labels')).reshape(-1).astype(np.int64)


def _borderline(i, boxes, scores, labels, score_thr, nms_iou, max_per_img):
    """Whether detection ``i`` may be kept by one run and dropped by another that differs by
    summation order only (see the module docstring)."""
    s = scores[i]
    near = lambda v, ref: abs(v - ref) <= RTOL * max(abs(ref), 1.0) + SCORE_ATOL  # noqa: E731
    if score_thr is not None and near(s, score_thr):
        return True
    if max_per_img is not None and len(scores) >= max_per_img and near(s, scores.min()):
        return True
    if nms_iou is not None:
        higher = (labels == labels[i]) & (scores >= s)
        higher[i] = False
        if higher.any():
            ious = iou_matrix(boxes[i:i + 1], boxes[higher])[0]
            if (np.abs(ious - nms_iou) <= RTOL * 10).any():  # IoU is a ratio of sums: 10x margin
                return True
    return False


def assert_same_detections(got, want, score_thr=None, nms_iou=None, max_per_img=None,
                           what='detections', min_matched=0.9):
    """``got`` and ``want`` are the same model's detections on one image from two runs that may sum
    in different orders. Each detection of one is matched to one of the other with the same label,
    IoU >= 0.999, coordinates within RTOL / BOX_ATOL and score within RTOL / SCORE_ATOL; a detection
    left unmatched must be borderline (``score_thr``, ``nms_iou``, ``max_per_img``: the model's
    test-time settings, None for a rule that does not apply). No more than 2 detections, or
    ``1 - min_matched`` of the larger set, may go unmatched all the same: where the scores are
    saturated (an untrained toy detector: 100 kept, all within RTOL of the cut) every detection is
    borderline, and rounding swaps the few at the cut, a real change all of them. Returns the
    matched pairs as (index in ``want``, index in ``got``)."""
    ga, wa = _as_dets(got), _as_dets(want)
    (gb, gs, gl), (wb, ws, wl) = ga, wa
    ious = iou_matrix(wb, gb) if len(wb) and len(gb) else np.zeros((len(wb), len(gb)))
    used = np.zeros(len(gb), bool)
    pairs, unmatched_want = [], []
    for i in np.argsort(-ws, kind='stable'):
        cand = [j for j in np.argsort(-ious[i]) if not used[j] and gl[j] == wl[i]
                and ious[i, j] >= 0.999
                and np.allclose(gb[j], wb[i], rtol=RTOL, atol=BOX_ATOL)
                and np.isclose(gs[j], ws[i], rtol=RTOL, atol=SCORE_ATOL)]
        if cand:
            used[cand[0]] = True
            pairs.append((int(i), int(cand[0])))
        else:
            unmatched_want.append(int(i))
    unmatched_got = [int(j) for j in np.flatnonzero(~used)]
    rules = dict(score_thr=score_thr, nms_iou=nms_iou, max_per_img=max_per_img)
    bad = [('want', i, ws[i], wl[i]) for i in unmatched_want
           if not _borderline(i, wb, ws, wl, **rules)]
    bad += [('got', j, gs[j], gl[j]) for j in unmatched_got
            if not _borderline(j, gb, gs, gl, **rules)]
    assert not bad, (
        f'{what}: {len(bad)} detection(s) without a counterpart and not at a decision boundary '
        f'(side, index, score, label): {bad[:5]}; {len(gs)} got, {len(ws)} wanted')
    n, excused = max(len(gs), len(ws)), len(unmatched_want) + len(unmatched_got)
    assert excused <= max(2, (1 - min_matched) * n), (
        f'{what}: {len(pairs)} of {n} detections matched; the other {excused} all sit at a '
        'decision boundary, but rounding moves only the few at the cut')
    return pairs


def assert_same_label_maps(got, want_logits, want_labels=None):
    """``got``: a label map (H, W) from one run; ``want_logits``: the other run's class logits
    (C, H, W) at the same size. Equal wherever the two best logits are more than RTOL apart (a
    near-tie can go either way). ``want_labels`` (default: the logits' argmax) is checked against
    the logits' argmax under the same rule. Returns the number of pixels allowed to differ."""
    got = np.asarray(got)
    logits = _np(want_logits)
    assert logits.ndim == 3 and logits.shape[1:] == got.shape, (logits.shape, got.shape)
    top2 = -np.sort(-logits, axis=0)[:2]
    tie = (top2[0] - top2[1]) <= RTOL * np.maximum(np.abs(top2[0]), 1.0)
    argmax = logits.argmax(0)
    for name, labels in (('label map', got), ('reference labels', want_labels)):
        if labels is None:
            continue
        differ = (np.asarray(labels) != argmax) & ~tie
        assert not differ.any(), (
            f'{name}: {int(differ.sum())} of {differ.size} pixels differ from the reference where '
            f'its two best logits are more than {RTOL} apart (first at {np.argwhere(differ)[0]})')
    return int(tie.sum())


def detection_rules(cfg):
    """The test-time settings of a detector's last stage as :func:`assert_same_detections` takes
    them: mmdet's ``test_cfg.rcnn`` (two-stage) or ``test_cfg`` (one-stage)."""
    tc = cfg.model.get('test_cfg') or {}
    tc = tc.get('rcnn', tc)
    nms = tc.get('nms') or {}
    return dict(score_thr=tc.get('score_thr'), nms_iou=nms.get('iou_threshold'),
                max_per_img=tc.get('max_per_img'))
