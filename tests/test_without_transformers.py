""" The import-without-transformers rule: ``import mlp_vision``, the vision models and the image commands need no
``transformers``; ``import mlp_vision.text`` without it stops with one line naming the extra to install.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _run_without_transformers(code: str):
    root = str(Path(__file__).resolve().parents[1])  # this checkout's package, wherever pytest runs from
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([root, os.environ.get('PYTHONPATH', '')])}
    return subprocess.run([sys.executable, '-c', 'import sys; sys.modules["transformers"] = None\n' + code],
                          capture_output=True, text=True, timeout=120, cwd=root, env=env)


@pytest.fixture(scope='module')
def without_transformers():
    """The output lines of one Python with transformers blocked (a process per check is a start of Python and an
    import of torch more): a vision model's class count, then whether the image commands import, then the error
    of ``import mlp_vision.text``, as its traceback's last line would read."""
    out = _run_without_transformers(
        'import mlp_vision, timm, torch\n'
        'm = timm.create_model("gmlp_ti", num_classes=3, img_size=32, num_blocks=2)\n'
        'print("classes", m(torch.zeros(1, 3, 32, 32)).shape[-1])\n'
        # the image commands import no text module at import time (benchmark.py builds its BERT layer on demand)
        'import mlp_vision.train, mlp_vision.validate, mlp_vision.benchmark, mlp_vision.visualize, '
        'mlp_vision.complexity\n'
        'print("commands ok")\n'
        'try:\n'
        '    import mlp_vision.text\n'
        'except ImportError as e:\n'
        '    print("text", f"{type(e).__name__}: {e}".strip().splitlines()[-1])\n'
        'else:\n'
        '    print("text imported")\n')
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_vision_package_imports_without_transformers(without_transformers):
    assert without_transformers[0] == 'classes 3'


def test_vision_commands_run_without_transformers(without_transformers):
    assert without_transformers[1] == 'commands ok'


def test_text_package_without_transformers_names_the_extra(without_transformers):
    last = without_transformers[2].removeprefix('text ')
    assert last.startswith('ImportError: mlp_vision.text needs transformers') and 'mlp_vision[text]' in last
