"""What a run of a config needs, under our tools and under mmdet's / mmseg's / mmpretrain's own
and ``mim`` alike (docs/design.md, "One run"):

* :mod:`.runner` - ``LinAttnRunner``, the Runner our ``_base_`` runtimes name: the checks before a
  run (:mod:`.preflight`, :mod:`.workdir_lock`, :mod:`.resume`), the hooks, naming an unreadable
  data file (:mod:`.datafaults`), one-line errors;
* :mod:`.hooks`, :mod:`.safe_checkpoint` - the registered hooks (non-finite loss, preemption,
  atomic checkpoint writes); :mod:`.fileio` - writing checkpoints atomically, reading a work dir's
  ``last_checkpoint``;
* :mod:`.distributed` - the CPU DDP wrapper (registered);
* :mod:`.compat` - the fixes for upstream breakage, applied by :mod:`mmlinattn.upstream_fixes`;
* :mod:`.cli`, :mod:`.testing`, :mod:`.runs` - what the command-line tools share before a Runner
  exists (options, reading a config, the test tools' flags as config edits, tools run in
  subprocesses and the metrics they record).

Stands on :mod:`mmlinattn.core` only; the core never imports it. Importing this package imports no
submodule.
"""
