""" Straightforward reference models: each written the obvious way, operator by operator, as the papers and
the official code describe it. They are not part of the installed package.

* :mod:`reference.smlpnet`: sMLPNet (arXiv:2109.05422) with 1x1 convs on permuted tensors, concat and fuse.
* :mod:`reference.bigs`: the BiGS layer (arXiv:2212.10544 §4) with real flips, seven ``nn.Linear`` and one FFT
  convolution per direction.
* :mod:`reference.longconv`: the Triton route's bidirectional long convolution as dense Toeplitz matrices.

The tests import them as ``reference.<name>`` (pytest puts ``tests/`` on the path, as for ``_helpers``);
``benchmark.py`` loads them from this folder for its ``ref:`` contenders. Both check that ours computes the same
function, and the benchmark times ours against them.
"""
