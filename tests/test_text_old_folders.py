""" Folders written by save_pretrained before the text models were transformers classes (config.json as
``{"architecture", "config", "format_version", "model_type"}``; the same weight names) load with our entry point and
transformers' Auto classes and give the logits they gave when written (tests/fixtures/text_folders_v2, written by
commit 52d79d2's code: a gMLP masked LM and a BiGS classifier with a byte tokenizer and labels.json, an MLP-Attention
GPT without a tokenizer). The import-without-transformers rule is here too.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification, \
    PreTrainedModel

import mlp_vision.text as mt

FIXTURES = Path(__file__).resolve().parent / 'fixtures' / 'text_folders_v2'
AUTO = {'gmlp_masked_lm': AutoModelForMaskedLM, 'bigs_classifier': AutoModelForSequenceClassification,
        'gpt_causal_lm': AutoModelForCausalLM}


@pytest.mark.parametrize('name', sorted(AUTO))
def test_folder_of_the_previous_format_loads_with_equal_logits(name, tmp_path):
    folder = str(FIXTURES / name)
    expected = load_file(os.path.join(folder, 'expected_logits.safetensors'))
    inputs = {'input_ids': expected['input_ids'], 'attention_mask': expected['attention_mask']}
    logits = []
    for model in (mt.from_pretrained(folder), AUTO[name].from_pretrained(folder)):
        assert isinstance(model, PreTrainedModel) and not model.training
        with torch.no_grad():
            logits.append(model(**inputs).logits)
        # the fixture's logits come from another machine: its CPU's GEMM kernels may sum in another order
        torch.testing.assert_close(logits[-1], expected['logits'], rtol=1e-5, atol=1e-6)
    assert torch.equal(logits[0], logits[1])  # here, both entry points: the same model, bit for bit
    model = mt.from_pretrained(folder)
    assert (model.tokenizer is None) == (name == 'gpt_causal_lm')
    if name == 'bigs_classifier':  # labels.json names the labels
        assert model.config.id2label == {0: 'negative', 1: 'neutral', 2: 'positive'}
    model.save_pretrained(str(tmp_path))  # re-saved in transformers' layout, the same model
    again = mt.from_pretrained(str(tmp_path))
    with torch.no_grad():
        assert torch.equal(again(**inputs).logits, logits[0])
    assert again.config.text_fields() == model.config.text_fields()


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
