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


@pytest.fixture(autouse=True)
def onednn_route_on():
    """Every test runs with the oneDNN channel route switched on, as on an AVX-512 host, so that the route and the
    cases that must leave it (hooks, replacements, tracers) are tested on any host (by default it is on only where
    the CPU has AVX-512: mlp_vision.layers.linear)."""
    from mlp_vision.layers.linear import set_onednn_channel_linear
    previous = set_onednn_channel_linear(True)
    try:
        yield
    finally:
        set_onednn_channel_linear(previous)
