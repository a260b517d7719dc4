"""mmlinattn: InLine and MALA linear attention for OpenMMLab detection and segmentation.

The package has two parts (docs/design.md, section 5):

* :mod:`mmlinattn.core` - the product: attention math, attention modules, backbones, the authors'
  weights, the family table, registration. It imports nothing else of mmlinattn.
* :mod:`mmlinattn.training` - what a run of a config needs under any toolbox's tools: the
  Runner our runtimes name (``LinAttnRunner``: the pre-flight, the work-dir lock, the checkpoint
  checks), the hooks, atomic checkpoint files, the CPU DDP wrapper, the fixes for upstream breakage;
* :mod:`mmlinattn.apis` - inferencers from a config and checkpoint, drawing predictions, large-image
  segmentation;
* :mod:`mmlinattn.analysis` - what the benchmark, FLOP and ONNX export tools compute; imported by
  those tools only, not by ``import mmlinattn``.

``import mmlinattn`` registers our modules and changes nothing else in the process: the backbones
``InLinePVT``, ``InLineSwin`` and ``MAViT`` (and the ImageNet classifier parts) in mmengine's root
model registry, visible from mmdet, mmseg and mmpretrain configs, with ``LinAttnEncoderDecoder``
(mmseg's segmentor with the large-image post-processing, :mod:`mmlinattn.apis.large_image`); the
hooks
(``SafeCheckpointHook``, ``NonFiniteLossHook``, ``PreemptionHook``, ``PlainParamGroupsHook``) in its
hook registry; the CPU DDP wrapper in its model-wrapper registry; ``LinAttnRunner`` in its runner
registry. The fixes for upstream breakage
are applied by :mod:`mmlinattn.upstream_fixes` (our tools import it, our configs list it in
``custom_imports``).

The core's modules live under ``mmlinattn.core`` only (the 0.1 paths ``mmlinattn.ops``,
``mmlinattn.models`` and ``mmlinattn.registry`` were removed in 0.3.0; docs/changelog.md).
"""
from . import core  # noqa: F401  (registers the backbones)
from .apis import large_image as _large_image

# registers the hooks, the DDP wrapper and LinAttnRunner
from .training import distributed, hooks, runner  # noqa: F401
from .version import __version__

_large_image.register()  # LinAttnEncoderDecoder (mmseg is imported when one is built)

__all__ = ['__version__', 'core']
