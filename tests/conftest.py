""" Fixtures shared by the test files, and where the suite's temporary files go.

What the suite writes under the temp folder is removed when it ends: pytest's ``tmp_path`` folders of passing tests
(``tmp_path_retention_policy`` in pyproject.toml; a failing test's folder is kept to look at) and torch.compile's
caches, which inductor otherwise keeps in ``<tmp>/torchinductor_<user>`` across runs (hundreds of MB): they go in
one folder of this session (a ``TORCHINDUCTOR_CACHE_DIR`` set by the user is left as it is).
"""
import os
import random
import shutil
import tempfile

import numpy as np
import pytest
import torch

_SESSION_TEMP = tempfile.mkdtemp(prefix='mlp_vision_tests_')
os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', os.path.join(_SESSION_TEMP, 'torchinductor'))

# pytest-xdist's workers share the machine's cores: each takes its share of torch's intra-op threads (two workers
# of two threads each on 2 cores would oversubscribe them)
if os.environ.get('PYTEST_XDIST_WORKER_COUNT'):
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ['PYTEST_XDIST_WORKER_COUNT'])))


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_TEMP, ignore_errors=True)


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



@pytest.fixture(scope='module')
def images(tmp_path_factory):
    """train/ and val/ of 2 classes (8 + 4 generated 16x16 PNGs each: noise around a class colour)."""
    from PIL import Image
    root = tmp_path_factory.mktemp('images')
    rng = np.random.default_rng(0)
    for split, n in (('train', 8), ('val', 4)):
        for c, colour in enumerate(((200, 40, 40), (40, 40, 200))):
            folder = root / split / f'class{c}'
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = np.clip(rng.normal(colour, 40, size=(16, 16, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f'{i}.png')
    return root


@pytest.fixture(scope='module')
def text_file(tmp_path_factory):
    """150 lines of 8 words from a 16-word vocabulary."""
    rng = random.Random(1)
    words = 'to be or not that is the question whether tis nobler in mind suffer slings arrows'.split()
    path = tmp_path_factory.mktemp('text') / 'tiny.txt'
    path.write_text('\n'.join(' '.join(rng.choice(words) for _ in range(8)) for _ in range(150)) + '\n')
    return str(path)
