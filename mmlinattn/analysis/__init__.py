"""What the measuring and export tools compute, so that they run from an installed wheel:
:mod:`.benchmarking` (timing, memory, the config matrix, synthetic batches, one measured step),
:mod:`.profiling` (a training step by model part; passes over memory), :mod:`.flops` (FLOPs as the
papers count them) and :mod:`.deploy` (ONNX export and its check against eager PyTorch). The
scripts are ``tools/analysis_tools/{benchmark,benchmark_step,benchmark_attention,get_flops}.py``
and ``tools/deployment/export_onnx.py``. Stands on the core; nothing else of the package imports
it, and importing this package imports no submodule (``import mmlinattn`` stays cheap)."""
