"""Developer tooling, in the repository and not in the wheel: what the benchmark, profiling, FLOP,
analysis and export tools share (:mod:`.benchmarking`, :mod:`.profiling`, :mod:`.flops`,
:mod:`.authors_code`, :mod:`.deploy`). Stands on the package; the package never
imports it. Importing this package imports no submodule.
"""
