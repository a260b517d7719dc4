"""Segmentation of large images within memory, for our tools (tools/test.py, tools/image_demo.py).

mmseg's ``postprocess_result`` resizes the class logits to the original image size before the
argmax and keeps them: C x H x W floats, 7.2 GB for ADE20K's 150 classes on a 4000 x 3000 photo
(82 s and 11.2 GB peak for one image through a shipped Semantic FPN, measured). Where that tensor
would exceed :func:`full_logits_budget`, :func:`lean_postprocess` lets mmseg's own method do its
part at the logits' own size (padding removed, flips undone) and then computes the label map band
by band of output rows: bilinear resizing is separable, ``out = R_h X R_w^T``, with the matrices
``R`` taken from ``F.interpolate`` itself (applied to an identity), so each band is what mmseg's
resize gives for those rows, up to float rounding. The full-resolution logits are not kept
(``seg_logits`` is left out of such a sample); the label map equals mmseg's except where two
classes tie within rounding. The configs keep mmseg's own segmentor types: only the model objects
our tools build are given this method, and only for outputs that large.
"""

import torch
import torch.nn.functional as F


def full_logits_budget() -> int:
    """Full-resolution logits above this size (bytes) are not materialised:
    ``MMLINATTN_FULL_LOGITS_BUDGET`` (:mod:`mmlinattn.core.settings`; default 1 GiB; a huge value
    gives mmseg's own path for every image)."""
    from mmlinattn.core import settings
    return settings.get('MMLINATTN_FULL_LOGITS_BUDGET')

#: the size (bytes) of one band of upsampled logits
BAND_BYTES = 64 << 20


def _resize_matrix(n_in: int, n_out: int, align_corners: bool, dtype) -> torch.Tensor:
    """(n_out, n_in): row i holds the weights of ``F.interpolate``'s bilinear resize for output i
    along one axis (read off the function itself, so its coordinate rules are its own)."""
    eye = torch.eye(n_in, dtype=dtype)[None, None]
    return F.interpolate(eye, size=(n_out, n_in), mode='bilinear',
                         align_corners=align_corners)[0, 0]


def banded_argmax(logits: torch.Tensor, size, align_corners: bool = False,
                  band_bytes: int = BAND_BYTES) -> torch.Tensor:
    """``resize(logits, size).argmax(0)`` (bilinear, C x h x w -> H x W, int64) without the C x H x
    W tensor: at most ``band_bytes`` of upsampled logits at a time."""
    c, h, w = logits.shape
    out_h, out_w = int(size[0]), int(size[1])
    x = logits.float()
    rh = _resize_matrix(h, out_h, align_corners, x.dtype).to(x.device)
    rw = _resize_matrix(w, out_w, align_corners, x.dtype).to(x.device)
    rows = max(1, band_bytes // max(1, c * out_w * x.element_size()))
    labels = torch.empty(out_h, out_w, dtype=torch.long, device=x.device)
    for r0 in range(0, out_h, rows):
        band = torch.matmul(rh[r0:r0 + rows], x)       # c x rows x w (rows interpolated)
        band = torch.matmul(band, rw.t())              # c x rows x W
        labels[r0:r0 + rows] = band.argmax(0)
    return labels


def lean_postprocess(model, budget: int = None):
    """Give ``model`` (an mmseg segmentor object) a ``postprocess_result`` that keeps to the memory
    budget for large outputs (module docstring); returns ``model``. Other segmentors and smaller
    outputs run mmseg's own method unchanged."""
    original = getattr(model, 'postprocess_result', None)
    if original is None or getattr(original, '_mmlinattn_lean', False):
        return model

    def postprocess_result(seg_logits, data_samples=None):
        limit = full_logits_budget() if budget is None else budget
        c = seg_logits.shape[1]
        big = data_samples is not None and c > 1 and \
            all('ori_shape' in s.metainfo for s in data_samples) and any(
                c * int(s.metainfo['ori_shape'][0]) * int(s.metainfo['ori_shape'][1]) *
                seg_logits.element_size() > limit for s in data_samples)
        if not big:
            return original(seg_logits, data_samples)
        ori = [tuple(s.metainfo['ori_shape']) for s in data_samples]
        for s in data_samples:  # mmseg's own crop and flip, at the logits' own size
            pad = s.metainfo.get('img_padding_size', s.metainfo.get('padding_size', [0] * 4))
            left, right, top, bottom = pad
            s.set_metainfo(dict(ori_shape=(seg_logits.shape[2] - top - bottom,
                                           seg_logits.shape[3] - left - right)))
        try:
            samples = original(seg_logits, data_samples)
        finally:
            for s, shape in zip(data_samples, ori):
                s.set_metainfo(dict(ori_shape=shape))
        from mmengine.structures import PixelData
        align = bool(getattr(model, 'align_corners', False))
        for s, shape in zip(samples, ori):
            small = s.seg_logits.data
            del s.seg_logits
            s.pred_sem_seg = PixelData(data=banded_argmax(small, shape, align)[None])
        return samples

    postprocess_result._mmlinattn_lean = True
    model.postprocess_result = postprocess_result
    return model
