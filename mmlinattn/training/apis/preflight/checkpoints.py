"""Checkpoint pre-flight for tools/train.py: the files a run will load, fitted before the Runner
exists.

- ``load_from`` given as an http(s) URL is fetched once into torch's hub cache and the config points
  at the cached file (:func:`mmlinattn.core.weights.local_checkpoint`);
- ``model.backbone.init_cfg=dict(type='Pretrained', checkpoint=...)`` (a path or a URL) is fitted
  against the backbone the config builds - its keys and shapes, read on the ``meta`` device, so no
  weights are loaded and no memory is taken - and a file of another architecture or size stops here
  with one :class:`~mmlinattn.core.weights.CheckpointError` line naming the checkpoint, the backbone
  and the first mismatched keys (mmengine would raise it from ``init_weights`` inside
  ``runner.train()``, as a traceback);
- ``load_from`` holding backbone weights only (no ``backbone.`` key, e.g. the output of
  ``tools/model_converters/convert_authors_checkpoint.py``) is moved to the backbone's ``init_cfg``:
  mmengine's ``load_from`` loads a file into the whole model by key, so such a file would load
  nothing; the file is read once, on the ``meta`` device, for both the detection and the fit.

The fit is :func:`mmlinattn.core.weights.fitting.fit_backbone_checkpoint`, the code the backbone's
``load_pretrained`` runs, with ``check_only=True``.
"""
import copy
import logging
from typing import Optional

import torch
from mmengine.config import Config

from ....core.weights import (
    CheckpointError,
    extract_state_dict,
    is_url,
    local_checkpoint,
    read_checkpoint,
)
from ....core.weights.fitting import fit_backbone_checkpoint
from ..config import model_registry


def _model_cfg(cfg: Config) -> Optional[dict]:
    model = cfg.get('model')
    if isinstance(model, dict) and isinstance(model.get('module'), dict):  # a TTA wrapper
        model = model['module']
    if isinstance(model, dict) and isinstance(model.get('backbone'), dict):
        return model
    return None


def _build_backbone(cfg: Config, bb_cfg: dict):
    """Our backbone built from ``bb_cfg`` on the meta device (no memory, no init); ``None`` for a
    backbone of another package or one that does not build (the Runner reports that itself)."""
    bb_cfg = copy.deepcopy(bb_cfg)
    bb_cfg['init_cfg'] = None
    try:
        with torch.device('meta'):
            backbone = model_registry(cfg).build(bb_cfg)
    except Exception:  # noqa: BLE001 - other pre-flights / the Runner name config problems
        return None
    if not hasattr(backbone, 'authors_layout') or \
            not type(backbone).__module__.startswith('mmlinattn'):
        return None
    return backbone


def prepare_checkpoints(cfg: Config, resume: bool = False,
                        logger: Optional[logging.Logger] = None) -> None:
    """The checkpoint pre-flight of a training run (see the module's docstring); changes ``cfg`` in
    place (``load_from`` URL -> cached file; a backbone-only ``load_from`` -> the backbone's
    ``init_cfg``). Raises :class:`CheckpointError` (one line) for a file that does not fit."""
    if logger is None:
        from mmengine.logging import MMLogger
        logger = MMLogger.get_current_instance()
    if is_url(cfg.get('load_from')):
        cfg.load_from = local_checkpoint(cfg.load_from, logger=logger)
    model = _model_cfg(cfg)
    if model is None:
        return
    backbone = None
    init = model['backbone'].get('init_cfg')
    if isinstance(init, dict) and init.get('type') == 'Pretrained' and init.get('checkpoint'):
        backbone = _build_backbone(cfg, model['backbone'])
        if backbone is not None:
            try:
                fit_backbone_checkpoint(backbone, init['checkpoint'], check_only=True,
                                        use_ema=init.get('use_ema', False),
                                        prefix=init.get('prefix', ''),
                                        allow_unsafe=init.get('allow_unsafe', False), logger=logger)
            except CheckpointError as e:
                raise CheckpointError(f'model.backbone.init_cfg.checkpoint: {e}') from None
    load_from = cfg.get('load_from')
    if resume or not load_from:
        return
    obj = read_checkpoint(load_from, map_location='meta', logger=logger)  # read once, fitted below
    if any(k.startswith('backbone.') for k in extract_state_dict(obj, path=load_from)):
        return  # a whole detector/segmentor: checked against the Runner's model when it is built
    backbone = backbone or _build_backbone(cfg, model['backbone'])
    if backbone is None:
        return
    try:
        report = fit_backbone_checkpoint(backbone, load_from, obj=obj, check_only=True,
                                         logger=logger)
    except CheckpointError as e:
        raise CheckpointError(
            f'load_from {load_from} holds no "backbone." keys, so it can only be backbone weights, '
            f'and as such: {e}') from None
    model['backbone']['init_cfg'] = dict(type='Pretrained', checkpoint=load_from)
    cfg.load_from = None
    logger.info(
        f'load_from {load_from} holds backbone weights only ({len(report["loaded"])} tensors, e.g. '
        f'the output of convert_authors_checkpoint.py): loading them into model.backbone, as '
        f'model.backbone.init_cfg=dict(type="Pretrained", checkpoint=...); the neck and heads are '
        f'initialised as the config says')
