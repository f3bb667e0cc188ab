""" Fixtures shared by the test files. """
import pytest
import torch


@pytest.fixture
def single_thread():
    """Run a test on one intra-op thread. Tiny models are latency bound; with 2 threads on a busy 2-core machine
    every small GEMM waits on the second thread (measured up to 6x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)

