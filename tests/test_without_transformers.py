""" The import-without-transformers rule: ``import mlp_vision``, the vision models and the image commands need no
``transformers``; ``import mlp_vision.text`` without it stops with one line naming the extra to install.
"""
import os
import subprocess
import sys
from pathlib import Path


def _run_without_transformers(code: str):
    root = str(Path(__file__).resolve().parents[1])  # this checkout's package, wherever pytest runs from
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([root, os.environ.get('PYTHONPATH', '')])}
    return subprocess.run([sys.executable, '-c', 'import sys; sys.modules["transformers"] = None\n' + code],
                          capture_output=True, text=True, timeout=120, cwd=root, env=env)


def test_vision_package_imports_without_transformers():
    out = _run_without_transformers('import mlp_vision, timm, torch\n'
                                    'm = timm.create_model("gmlp_ti16_224", num_classes=3)\n'
                                    'print(m(torch.zeros(1, 3, 224, 224)).shape[-1])\n')
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '3'


def test_vision_commands_run_without_transformers():
    # the image commands import no text module at import time (benchmark.py builds its BERT layer on demand)
    out = _run_without_transformers('import mlp_vision.train, mlp_vision.validate, mlp_vision.benchmark, '
                                    'mlp_vision.visualize, mlp_vision.complexity\nprint("ok")\n')
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'ok'


def test_text_package_without_transformers_names_the_extra():
    out = _run_without_transformers('import mlp_vision.text\n')
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith('ImportError: mlp_vision.text needs transformers') and 'mlp_vision[text]' in last
