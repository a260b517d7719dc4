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
  ``tools/model_converters/convert_authors_checkpoint.py``) stops in one line giving the
  ``init_cfg`` to write instead: mmengine's ``load_from`` loads a file into the whole model by key,
  so such a file would load nothing, in mmdet's and mmseg's own tools as in ours (the config is
  not rewritten, so it means the same run everywhere).

``load_from`` (or the ``--resume`` file) is read once, on the CPU, the way the Runner reads it
(:func:`mmlinattn.core.weights.reading.read_contents`): the backbone-only test, the fit, the
whole-model check against the Runner's model and the Runner's own load all take those contents
(:class:`~mmlinattn.training.runner.LinAttnRunner`). The backbone is the run's one
:class:`~.backbone.MetaBackbone`, shared with the channels check.

The fit is :func:`mmlinattn.core.weights.fitting.fit_backbone_checkpoint`, the code the backbone's
``load_pretrained`` runs, with ``check_only=True``.
"""
import logging
from typing import Optional

from mmengine.config import Config

from mmlinattn.core.weights import CheckpointError, extract_state_dict, is_url, local_checkpoint
from mmlinattn.core.weights.fitting import fit_backbone_checkpoint
from mmlinattn.core.weights.reading import CheckpointContents, read_contents

from .backbone import MetaBackbone, model_cfg


def _ours_with_layout(backbone: MetaBackbone):
    """The run's meta backbone if it is ours with an authors' layout (what the fit needs)."""
    module = backbone.ours()
    return module if module is not None and hasattr(module, 'authors_layout') else None


def prepare_checkpoints(cfg: Config, resume: bool = False,
                        logger: Optional[logging.Logger] = None, *,
                        backbone: Optional[MetaBackbone] = None,
                        contents: Optional[CheckpointContents] = None
                        ) -> Optional[CheckpointContents]:
    """The checkpoint pre-flight of a training run (see the module's docstring); changes ``cfg`` in
    place (``load_from`` URL -> cached file; a backbone-only ``load_from`` -> the backbone's
    ``init_cfg``). Raises :class:`CheckpointError` (one line) for a file that does not fit or does
    not read.

    ``backbone``: the run's :class:`MetaBackbone` (the pre-flight's, so the backbone is built once;
    else one is made here). ``contents``: ``load_from`` as the caller has read it already (the
    ``--resume`` file). Returns the contents of the ``load_from`` the Runner will load - read here
    once, on the CPU, unless given - for :class:`~mmlinattn.training.runner.LinAttnRunner` to hand
    on (None when the Runner loads no file)."""
    if logger is None:
        from mmengine.logging import MMLogger
        logger = MMLogger.get_current_instance()
    backbone = backbone or MetaBackbone(cfg, logger)
    if is_url(cfg.get('load_from')):
        cfg.load_from = local_checkpoint(cfg.load_from, logger=logger)
    model = model_cfg(cfg)
    init = model['backbone'].get('init_cfg') if model is not None else None
    if isinstance(init, dict) and init.get('type') == 'Pretrained' and init.get('checkpoint'):
        ours = _ours_with_layout(backbone)
        if ours is not None:
            try:
                fit_backbone_checkpoint(ours, init['checkpoint'], check_only=True,
                                        use_ema=init.get('use_ema', False),
                                        prefix=init.get('prefix', ''),
                                        allow_unsafe=init.get('allow_unsafe', False), logger=logger)
            except CheckpointError as e:
                raise CheckpointError(f'model.backbone.init_cfg.checkpoint: {e}') from None
    load_from = cfg.get('load_from')
    if not load_from:
        return None
    if contents is None or not contents.matches(load_from):
        # read once, here: the backbone-only test below, the whole-model check against the
        # Runner's model and the Runner's own load all take these contents
        contents = read_contents(load_from, foreign=not resume, logger=logger)
    if resume or model is None:
        return contents
    if any(k.startswith('backbone.') for k in extract_state_dict(contents.obj, path=load_from)):
        return contents  # a whole detector/segmentor: checked against the Runner's model when built
    ours = _ours_with_layout(backbone)
    if ours is None:
        return contents
    try:
        report = fit_backbone_checkpoint(ours, load_from, obj=contents.obj, check_only=True,
                                         logger=logger)
    except CheckpointError as e:
        raise CheckpointError(
            f'load_from {load_from} holds no "backbone." keys, so it can only be backbone weights, '
            f'and as such: {e}') from None
    # mmdet's / mmseg's own train.py would load nothing of it (no key starts with "backbone."):
    # one config must mean one run, so the config is not rewritten here; the line to write is given
    raise CheckpointError(
        f'load_from {load_from} holds backbone weights only ({len(report["loaded"])} tensors, e.g. '
        'the output of convert_authors_checkpoint.py): load_from loads a whole model by key, so '
        'mmengine would load none of them (no key starts with "backbone."). Load it into the '
        'backbone instead: --cfg-options load_from=None model.backbone.init_cfg.type=Pretrained '
        f'model.backbone.init_cfg.checkpoint={load_from} (in a config: load_from = None; model = '
        f'dict(backbone=dict(init_cfg=dict(type="Pretrained", checkpoint="{load_from}"))))')
