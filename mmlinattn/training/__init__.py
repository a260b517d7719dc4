"""Training support, one wing over the core: what a config names or imports around a model, under
our tools and under mmdet's / mmseg's / mmpretrain's own.

* :mod:`.hooks`, :mod:`.safe_checkpoint` - the registered hooks (non-finite loss, preemption,
  atomic checkpoint writes);
* :mod:`.fileio` - writing checkpoints atomically, reading a work dir's ``last_checkpoint``;
* :mod:`.distributed` - the CPU DDP wrapper (registered);
* :mod:`.compat` - the fixes for upstream breakage, applied by :mod:`mmlinattn.upstream_fixes`.

What only our tools do (the pre-flight, their Runner set-up, the work-dir lock, the ``--resume``
search, naming an unreadable data file, lean segmentation post-processing) lives beside them, in
``tools/workshop/apis``.

Stands on :mod:`mmlinattn.core` only; the core never imports it. Importing this package imports no
submodule.
"""
