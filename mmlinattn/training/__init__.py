"""Training support, one wing over the core: what tools/train.py and tools/test.py (and mmdet's /
mmseg's / mmpretrain's own tools on our configs) use around a model.

* :mod:`.apis` - the pre-flight checks, the Runner set-up the tools share, tools in subprocesses,
  the work-dir lock;
* :mod:`.hooks`, :mod:`.safe_checkpoint` - the registered hooks (non-finite loss, preemption,
  atomic checkpoint writes);
* :mod:`.fileio`, :mod:`.resume` - writing checkpoints atomically, the ``--resume`` search;
* :mod:`.datafaults` - an unreadable data file named at first use;
* :mod:`.distributed` - the CPU DDP wrapper (registered);
* :mod:`.seg_postprocess` - segmentation of large images without full-size float logits;
* :mod:`.compat` - the fixes for upstream breakage, applied by :mod:`mmlinattn.upstream_fixes`.

Stands on :mod:`mmlinattn.core` only; the core never imports it. Importing this package imports no
submodule.
"""
