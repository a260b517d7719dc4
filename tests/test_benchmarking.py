"""mmlinattn.benchmarking's measuring helpers against allocations of known size (numel x 4 B)."""
import torch

from mmlinattn.benchmarking import peak_memory

MB4 = 1000 * 1000 * 4  # a 1000 x 1000 float32 tensor


def _close(measured: int, expected: int) -> bool:
    return abs(measured - expected) <= 0.01 * expected


def test_peak_memory_counts_a_nested_allocation_once():
    """randn allocates through a nested aten::empty: one 4 MB tensor, not 8 MB."""
    assert _close(peak_memory(lambda: torch.randn(1000, 1000).sum()), MB4)


def test_peak_memory_follows_frees():
    def two_alive():
        a = torch.randn(1000, 1000)
        b = torch.ones(500, 1000)
        return a.sum() + b.sum()

    def one_after_another():
        a = torch.randn(1000, 1000)
        s = a.sum()
        del a
        b = torch.ones(500, 1000)
        return s + b.sum()
    assert _close(peak_memory(two_alive), MB4 + MB4 // 2)
    assert _close(peak_memory(one_after_another), MB4)
