"""Segmentation of large images within memory: above :func:`full_logits_budget`, mmseg's
``postprocess_result`` works at the logits' own size, then the label map is taken in bands of output
rows with the separable bilinear resize ``out = R_h X R_w^T`` (``R`` read off ``F.interpolate``),
not from the C x H x W logits (7.2 GB for ADE20K on a 4000 x 3000 photo); ``seg_logits`` is left out
of such a sample.

It is the model's own: our segmentation configs build ``LinAttnEncoderDecoder``
(:func:`build_segmentor`, registered in mmengine's root ``MODELS``), mmseg's ``EncoderDecoder``
with this post-processing, so it holds under any Runner, any tool and any hook list.
:func:`lean_postprocess` gives an already built mmseg segmentor the same (the inferencers)."""

import torch
import torch.nn.functional as F


def full_logits_budget() -> int:
    """``MMLINATTN_FULL_LOGITS_BUDGET``: bytes of full-resolution logits kept at most."""
    from mmlinattn.core import settings
    return settings.get('MMLINATTN_FULL_LOGITS_BUDGET')


#: the size (bytes) of one band of upsampled logits
BAND_BYTES = 64 << 20


def _resize_matrix(n_in: int, n_out: int, align_corners: bool, dtype) -> torch.Tensor:
    """(n_out, n_in): row i holds ``F.interpolate``'s bilinear weights for output i on one axis."""
    eye = torch.eye(n_in, dtype=dtype)[None, None]
    return F.interpolate(eye, size=(n_out, n_in), mode='bilinear',
                         align_corners=align_corners)[0, 0]


def banded_argmax(logits: torch.Tensor, size, align_corners: bool = False,
                  band_bytes: int = BAND_BYTES) -> torch.Tensor:
    """``resize(logits, size).argmax(0)`` (bilinear) in bands of ``band_bytes``, int64."""
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
    """Give ``model`` (mmseg) a ``postprocess_result`` within the budget (module docstring)."""
    original = getattr(model, 'postprocess_result', None)
    if original is None or getattr(original, '_mmlinattn_lean', False) or \
            getattr(type(model), '_mmlinattn_lean', False):
        return model

    def postprocess_result(seg_logits, data_samples=None):
        return lean_result(model, original, seg_logits, data_samples, budget)

    postprocess_result._mmlinattn_lean = True
    model.postprocess_result = postprocess_result
    return model


_SEGMENTOR = {}


def build_segmentor(**kwargs):
    """``LinAttnEncoderDecoder``: mmseg's ``EncoderDecoder`` (the same modules, parameters and
    forward) whose ``postprocess_result`` takes a large image's label map in bands (module
    docstring). Built from a config's ``model = dict(type='LinAttnEncoderDecoder', ...)``; mmseg is
    imported when the first one is built."""
    if not _SEGMENTOR:
        from mmseg.models import EncoderDecoder

        class LinAttnEncoderDecoder(EncoderDecoder):
            _mmlinattn_lean = True
            #: False inside a test-time-augmentation wrapper, which merges the full-size logits
            #: (``RunChecksHook`` sets it; ``lean=False`` in the config does too)
            lean = True

            def postprocess_result(self, seg_logits, data_samples=None):
                if not self.lean:
                    return super().postprocess_result(seg_logits, data_samples)
                return lean_result(self, super().postprocess_result, seg_logits, data_samples)

        LinAttnEncoderDecoder.__module__ = __name__
        globals()['LinAttnEncoderDecoder'] = LinAttnEncoderDecoder  # pickles by this name
        _SEGMENTOR['cls'] = LinAttnEncoderDecoder
    lean = kwargs.pop('lean', True)
    model = _SEGMENTOR['cls'](**kwargs)
    model.lean = bool(lean)
    return model


def register() -> None:
    """Register :func:`build_segmentor` as ``LinAttnEncoderDecoder`` in mmengine's root
    ``MODELS`` (mmseg's registry falls back to it); imports no toolbox."""
    from mmengine.registry import MODELS
    if 'LinAttnEncoderDecoder' not in MODELS.module_dict:
        MODELS.register_module(name='LinAttnEncoderDecoder', module=build_segmentor)


def lean_result(model, original, seg_logits, data_samples=None, budget: int = None):
    """``original(seg_logits, data_samples)`` (mmseg's ``postprocess_result``), or the banded label
    maps where a sample's full-size logits would pass the budget."""
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
