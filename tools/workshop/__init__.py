"""The tools' workshop: what the train and test tools share around a run (:mod:`.apis`), and what
the benchmark, profiling, FLOP, analysis, export and demo tools share (:mod:`.benchmarking`,
:mod:`.profiling`, :mod:`.flops`, :mod:`.analysis`, :mod:`.deploy`, :mod:`.visualization`).
Stands on :mod:`mmlinattn.core` and :mod:`mmlinattn.training`; neither imports it.
Importing this package imports no submodule.
"""
