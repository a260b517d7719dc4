"""Timing and memory helpers of the benchmark scripts in this folder (benchmark.py,
benchmark_attention.py), which import it as a sibling module: Python puts a script's folder first on
``sys.path``."""
import time

import torch


def timeit(fn, min_time: float = 0.3, max_reps: int = 50) -> float:
    """Best wall time of ``fn()`` over repetitions (after one warm-up call), in seconds."""
    fn()
    reps, total, best = 0, 0.0, float('inf')
    while reps < max_reps and (total < min_time or reps < 3):
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, total, reps = min(best, dt), total + dt, reps + 1
        if dt > 2.0:
            break
    return best


def peak_memory(fn) -> int:
    """Peak bytes that ``fn()`` allocates beyond what existed when it started (CPU: torch profiler
    memory events; CUDA: the caching allocator's peak)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.cpu_memory_usage),
                    key=lambda e: e.time_range.start)
    cur = peak = 0
    for e in events:
        cur += e.cpu_memory_usage
        peak = max(peak, cur)
    return peak
