""" mlp_vision.train_text: learning on real text, bit-exact resume, NaN stop, MLM masking statistics, the unigram
baseline, 2-process gloo DDP, outputs and the clear errors for bad input.

Learning is measured on real text, Tiny Shakespeare and WikiText-2 from ``../shared/data`` (those tests skip with
the path when it is absent); the behaviour tests (resume, NaN stop, DDP, bad input) run on a small text each test
writes itself. The models are tiny (tens of thousands of parameters) and run on one CPU thread.
"""
import random
import csv
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mlp_vision.text as mt
import mlp_vision.train_text as text_train
import mlp_vision.training.tasks.language_model as text_lm
from mlp_vision.training.tasks.text_task import lm_schedule
from mlp_vision.training.tasks.text_data import (
    MLMMasker, build_tokenizer, causal_eval_batches, mlm_segments, subset_batches, unigram_mlm_baseline)
from mlp_vision.training.run.training_run import create_lr_scheduler

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / 'shared' / 'data'
SHAKESPEARE = DATA / 'tinyshakespeare' / 'input.txt'
WIKITEXT = DATA / 'wikitext-2'

TINY_GPT = ['--model', 'gpt_mlp_attention', '--model-kwargs', 'num_hidden_layers=1', 'hidden_size=32',
            'num_attention_heads=2', 'max_position_embeddings=32', 'mlp_attention_hidden_size=32',
            'hidden_dropout_prob=0.1']
TINY_GMLP = ['--model', 'amlp_base', '--model-kwargs', 'num_hidden_layers=2', 'hidden_size=32', 'intermediate_size=64',
             'tiny_attention_size=16', 'max_position_embeddings=32', 'hidden_dropout_prob=0.1']
TINY_BIGS = ['--model', 'bigs_small', '--model-kwargs', 'hidden_size=32', 'intermediate_size=64', 'num_hidden_layers=2',
             'num_ssm_states=8', 'max_position_embeddings=32']
COMMON = ['--threads', '1', '--log-interval', '1000']


def _need(path: Path) -> str:
    if not path.exists():
        pytest.skip(f'needs {path} (the shared data folder ../shared/data beside the repository)')
    return str(path)


@pytest.fixture(scope='module')
def shakespeare():
    return _need(SHAKESPEARE)


@pytest.fixture(scope='module')
def tiny_text(tmp_path_factory):
    """About 20 kB of generated text (a fixed word list in a seeded random order), made by the test itself."""
    words = ('the of and to in is was for on that with as by at from his her it an be are this which or had not but '
             'king queen lord night day love death sword crown house, say: speak! well? come go thee thou').split()
    rng = random.Random(0)
    lines = [' '.join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(500)]
    path = tmp_path_factory.mktemp('text') / 'tiny.txt'
    path.write_text('\n'.join(lines) + '\n')
    return str(path)


@pytest.fixture(scope='module')
def wikitext():
    return _need(WIKITEXT / 'valid.txt'), _need(WIKITEXT / 'test.txt')


def _rows(path):
    with open(path, newline='') as f:
        return list(csv.DictReader(f))


def _state(path):
    return torch.load(path, map_location='cpu', weights_only=True)


# ------------------------------------------------------------------------------------------------ learning
def test_causal_lm_learns_tiny_shakespeare(shakespeare, tmp_path):
    res = text_train.main(TINY_GPT + COMMON + [
        '--task', 'causal', '--train-file', shakespeare, '--steps', '300', '-b', '16', '--lr', '3e-3',
        '--sched', 'cosine', '--warmup-steps', '20', '--eval-interval', '100', '--eval-batches', '8',
        '--final-eval-batches', '40', '--sample-prompt', 'ROMEO:', '--sample-tokens', '40',
        '--output', str(tmp_path), '--experiment', 'gpt'])
    exp = tmp_path / 'gpt'
    rows = _rows(exp / 'summary.csv')
    assert [r['step'] for r in rows] == ['100', '200', '300']
    assert (exp / 'summary.csv').read_text().count('step,') == 1
    # uniform over 65 characters is ln 65 = 4.17 nats; a 1-layer, 32-wide model gets well below 2.9 in 300 steps
    assert res['val_final']['loss'] < 2.9 and float(rows[-1]['val_loss']) < float(rows[0]['val_loss']) - 0.1
    assert res['params'] == sum(p.numel() for p in mt.create_model(
        'gpt_mlp_attention', num_hidden_layers=1, hidden_size=32, num_attention_heads=2, max_position_embeddings=32,
        mlp_attention_hidden_size=32).parameters())
    assert res['tokenizer'] == {'type': 'char', 'vocab_size': 65}  # the papers' Tiny Shakespeare vocabulary
    assert res['data']['val_tokens'] == 111_540 and res['val_final_batches'] == 40
    assert res['tokens_per_sec'] > 0 and res['command'].startswith('python -m mlp_vision.train_text')
    for name in ('curves.png', 'last.pth', 'model_best.pth', 'args.yaml', 'train.log', 'results.json'):
        assert (exp / name).is_file(), name
    samples = (exp / 'samples.txt').read_text()
    assert '\nROMEO:' in samples and len(samples.split('ROMEO:', 1)[1]) >= 40
    # the saved model + tokenizer reload and reproduce the final evaluation
    model = mt.from_pretrained(str(exp / 'pretrained'))
    tok = model.tokenizer  # saved beside the weights
    text = Path(shakespeare).read_text()
    ids = torch.tensor(tok.encode(text[int(len(text) * 0.9):], add_special_tokens=False))
    batches = subset_batches(causal_eval_batches(ids, 32, 16), 40, 42)  # the run's fixed subset
    again = text_lm.evaluate_lm(model, batches, task='causal', device=torch.device('cpu'))
    assert again['loss'] == pytest.approx(res['val_final']['loss'], rel=1e-5)


def test_mlm_learns_wikitext_and_beats_unigram(wikitext, tmp_path):
    train_file, val_file = wikitext
    res = text_train.main(TINY_GMLP + COMMON + [
        '--task', 'mlm', '--train-file', train_file, '--val-file', val_file, '--steps', '300', '-b', '16',
        '--lr', '3e-3', '--warmup-steps', '20', '--eval-interval', '150', '--eval-batches', '8',
        '--final-eval-batches', '30', '--output', str(tmp_path), '--experiment', 'mlm'])
    final, base = res['val_final'], res['unigram_baseline']
    assert res['tokenizer']['vocab_size'] == 122 + 5  # valid.txt's characters + <pad> <cls> <sep> <mask> <unk>
    assert base['tokens'] == final['tokens'] == 30 * 16 * 4  # round(15 % of 30 text tokens) per segment
    assert final['loss'] < base['loss'] - 0.1 and final['masked_acc'] > base['masked_acc'] + 3
    rows = _rows(tmp_path / 'mlm' / 'summary.csv')
    assert {'val_masked_acc', 'val_mask_token_acc', 'val_ppl'} <= set(rows[0])
    # the recipe is amlp's; the record says which of its fields the command line replaced
    assert res['optimizer']['recipe'] == 'gmlp/masked_lm' and res['optimizer']['overridden'] == ['lr']
    assert res['optimizer']['lr'] == 3e-3 and 'overridden on the command line: lr' in res['optimizer']['source']


def test_the_log_describes_the_tokenizer_in_one_short_line(tiny_text, tmp_path):
    text_train.main(TINY_GMLP + COMMON + [
        '--task', 'mlm', '--train-file', tiny_text, '--tokenizer', 'wordpiece', '--vocab-size', '200',
        '--steps', '1', '-b', '2', '--eval-interval', '1', '--eval-batches', '1', '--final-eval-batches', '1',
        '--output', str(tmp_path), '--experiment', 'run'])
    log = (tmp_path / 'run' / 'train.log').read_text()
    assert 'AddedToken' not in log
    line = next(line for line in log.splitlines() if line.startswith('Data:') or ' Data: ' in line)
    description = line[line.rindex('; ') + 2:]
    assert description.startswith('TokenizersBackend (subword, WordPiece): ') and len(description) < 200
    assert "5 special ['[UNK]'" in description or "5 special ['[PAD]'" in description, description


# ------------------------------------------------------------------------------------------------ resume
@pytest.mark.parametrize('task,model', [('causal', TINY_GPT), ('mlm', TINY_GMLP), ('mlm', TINY_BIGS)],
                         ids=['causal-gpt', 'mlm-amlp', 'mlm-bigs'])
def test_resume_equals_uninterrupted_run(task, model, tiny_text, tmp_path):
    # dropout, random blocks, masking, grad accumulation, clipping and a cosine schedule with warmup are all on
    args = model + COMMON + ['--task', task, '--train-file', tiny_text, '--steps', '12', '-b', '4',
                             '--grad-accum-steps', '2', '--lr', '3e-3', '--sched', 'cosine', '--warmup-steps', '3',
                             '--eval-interval', '4', '--eval-batches', '2', '--final-eval-batches', '4',
                             '--seed', '3']
    text_train.main(args + ['--output', str(tmp_path), '--experiment', 'ref'])
    stopped = text_train.main(args + ['--output', str(tmp_path), '--experiment', 'cut', '--stop-after-step', '6'])
    assert stopped['stopped_at_step'] == 6 and _state(tmp_path / 'cut' / 'last.pth')['step'] == 6
    resumed = text_train.main(['--resume', str(tmp_path / 'cut' / 'last.pth')])  # its settings, in 'cut'
    ref, cut = _state(tmp_path / 'ref' / 'last.pth'), _state(tmp_path / 'cut' / 'last.pth')
    assert ref['step'] == cut['step'] == 12
    for k, v in ref['state_dict'].items():
        assert torch.equal(v, cut['state_dict'][k]), k
    for pid, s in ref['optimizer']['state'].items():
        for k, v in s.items():
            assert torch.equal(v, cut['optimizer']['state'][pid][k]), (pid, k)
    assert ref['scheduler'] == cut['scheduler'] and ref['optimizer']['param_groups'] == cut['optimizer']['param_groups']
    # the summary of the resumed folder has each step once and the same numbers
    keys = ('step', 'lr', 'train_loss', 'val_loss')
    r_rows, c_rows = _rows(tmp_path / 'ref' / 'summary.csv'), _rows(tmp_path / 'cut' / 'summary.csv')
    assert [[r[k] for k in keys] for r in r_rows] == [[r[k] for k in keys] for r in c_rows]
    assert [r['step'] for r in c_rows] == ['4', '8', '12']
    assert resumed['val_final']['loss'] == json.loads((tmp_path / 'ref' / 'results.json').read_text())[
        'val_final']['loss']


def test_recipe_fills_are_derived_and_a_resume_fills_them_again(tiny_text, tmp_path):
    """Issue 35 item 3: the recipe's optimizer values and the model's block size are derived values (derived.yaml,
    the checkpoint's 'derived'); args.yaml keeps the flags as given, so a resume with more --steps caps the recipe's
    warmup at a tenth of the new count, not at the first run's."""
    import yaml
    from mlp_vision.training.tasks.text_task import load_recipe
    unset = ('lr', 'opt_betas', 'opt_eps', 'weight_decay', 'sched', 'warmup_steps', 'block_size')
    text_train.main(TINY_GMLP + COMMON + [
        '--task', 'mlm', '--train-file', tiny_text, '--steps', '20', '-b', '2', '--eval-interval', '10',
        '--eval-batches', '1', '--final-eval-batches', '1', '--output', str(tmp_path), '--experiment', 'run',
        '--stop-after-step', '10'])
    recipe = load_recipe('gmlp_masked_lm')
    given = yaml.safe_load((tmp_path / 'run' / 'args.yaml').read_text())
    derived = yaml.safe_load((tmp_path / 'run' / 'derived.yaml').read_text())
    assert {k: given[k] for k in unset} == dict.fromkeys(unset) and given['model'] == 'amlp_base'
    assert derived == {**{k: recipe[k] for k in unset[:5]}, 'warmup_steps': 2, 'block_size': 32}  # 2: 20 // 10
    assert _state(tmp_path / 'run' / 'last.pth')['derived'] == derived
    text_train.main(['--resume', str(tmp_path / 'run' / 'last.pth'), '--steps', '40', '--stop-after-step', '11'])
    resumed = _state(tmp_path / 'run' / 'last.pth')
    assert resumed['step'] == 11 and resumed['args']['warmup_steps'] is None and resumed['args']['steps'] == 40
    assert resumed['derived'] == {**derived, 'warmup_steps': 4} and resumed['schedule']['warmup_epochs'] == 4


def test_a_stop_inside_an_update_saves_the_state_before_it_and_resume_is_exact(tiny_text, tmp_path, monkeypatch):
    """SIGINT during micro-batch 2 of update 7 (3 micro-batches each): the update is abandoned, its data position and
    RNG states put back, step 6 saved; the resumed run ends bit-identical to an uninterrupted one."""
    args = TINY_GPT + COMMON + ['--task', 'causal', '--train-file', tiny_text, '--steps', '9', '-b', '2',
                                '--grad-accum-steps', '3', '--lr', '3e-3', '--eval-interval', '4', '--eval-batches',
                                '1', '--final-eval-batches', '1', '--seed', '4', '--output', str(tmp_path)]
    text_train.main(args + ['--experiment', 'ref'])
    calls = {'n': 0}
    real_loss = text_lm.lm_loss

    def loss_then_signal(logits, targets):
        calls['n'] += 1
        if calls['n'] == 6 * 3 + 2:
            os.kill(os.getpid(), signal.SIGINT)  # the run's handler only sets its flag
        return real_loss(logits, targets)

    monkeypatch.setattr(text_lm, 'lm_loss', loss_then_signal)
    with pytest.raises(SystemExit) as e:
        text_train.main(args + ['--experiment', 'cut'])
    assert e.value.code == 128 + signal.SIGINT and 'interrupted by SIGINT at step 6' in e.value.message
    assert calls['n'] == 6 * 3 + 2 and _state(tmp_path / 'cut' / 'last.pth')['step'] == 6
    monkeypatch.setattr(text_lm, 'lm_loss', real_loss)
    text_train.main(['--resume', str(tmp_path / 'cut' / 'last.pth')])
    ref, cut = _state(tmp_path / 'ref' / 'last.pth'), _state(tmp_path / 'cut' / 'last.pth')
    assert ref['step'] == cut['step'] == 9
    for k, v in ref['state_dict'].items():
        assert torch.equal(v, cut['state_dict'][k]), k


@pytest.mark.parametrize('backend', ['eager', pytest.param('inductor', marks=pytest.mark.slow)])
def test_torchcompile_trains_what_the_uncompiled_model_trains(backend, tiny_text, tmp_path):
    """--torchcompile compiles the training forward and backward (dynamo; 'eager' runs the captured graphs
    without code generation, so the weights must be bit-identical; inductor's fused kernels round differently)."""
    args = TINY_BIGS + COMMON + ['--task', 'mlm', '--train-file', tiny_text, '--steps', '4', '-b', '4',
                                 '--grad-accum-steps', '2', '--eval-interval', '4', '--eval-batches', '1',
                                 '--final-eval-batches', '1', '--seed', '3', '--output', str(tmp_path)]
    plain = text_train.main(args + ['--experiment', 'plain'])
    compiled = text_train.main(args + ['--experiment', 'compiled', '--torchcompile', backend])
    ref, out = _state(tmp_path / 'plain' / 'last.pth'), _state(tmp_path / 'compiled' / 'last.pth')
    assert ref['state_dict'].keys() == out['state_dict'].keys()  # the plain model is saved, not the wrapper
    if backend == 'eager':
        for k, v in ref['state_dict'].items():
            assert torch.equal(v, out['state_dict'][k]), k
        assert compiled['val_final'] == {**plain['val_final'], 'seconds': compiled['val_final']['seconds']}
        return
    # inductor: an Adam step moves a weight by at most about lr, so rounding that flips the sign of a near-zero
    # gradient parts two runs by at most 2 lr per step; anything more is a different computation
    lr = ref['optimizer']['param_groups'][0]['initial_lr']
    for k, v in ref['state_dict'].items():
        assert (out['state_dict'][k] - v).abs().max() <= 2 * lr * 4, k
    assert compiled['val_final']['loss'] == pytest.approx(plain['val_final']['loss'], rel=2e-3)


# ------------------------------------------------------------------------------------------------ NaN stop
def test_nan_loss_stops_and_keeps_last_good_checkpoint(tiny_text, tmp_path, monkeypatch):
    calls = {'n': 0}
    real_loss = text_lm.lm_loss

    def loss_that_diverges(logits, targets):  # the 5th training loss is NaN (update 5)
        calls['n'] += 1
        loss = real_loss(logits, targets)
        return loss * float('nan') if calls['n'] == 5 else loss

    monkeypatch.setattr(text_lm, 'lm_loss', loss_that_diverges)
    with pytest.raises(SystemExit) as e:
        text_train.main(TINY_GPT + COMMON + [
            '--task', 'causal', '--train-file', tiny_text, '--steps', '10', '-b', '4', '--eval-interval', '2',
            '--eval-batches', '1', '--output', str(tmp_path), '--experiment', 'nan'])
    assert e.value.code == 1
    msg = e.value.message
    assert 'training loss is nan at step 5' in msg and 'last good checkpoint' in msg and '(step 4)' in msg
    ckpt = _state(tmp_path / 'nan' / 'last.pth')
    assert ckpt['step'] == 4
    assert all(torch.isfinite(v).all() for v in ckpt['state_dict'].values() if v.is_floating_point())
    assert 'loss is nan' in (tmp_path / 'nan' / 'train.log').read_text()
    assert not (tmp_path / 'nan' / 'results.json').exists()


# ------------------------------------------------------------------------------------------------ MLM data
@pytest.fixture(scope='module')
def masking_text(tiny_text):
    """200,000 characters to mask: WikiText-2 when the shared data is there, else the generated text repeated in a
    seeded shuffled order of its lines (the statistics below are about the masker, not the language)."""
    if (WIKITEXT / 'valid.txt').exists():
        return (WIKITEXT / 'valid.txt').read_text()[:200_000]
    lines = Path(tiny_text).read_text().splitlines()
    rng = random.Random(1)
    out = []
    while sum(len(line) + 1 for line in out) < 200_000:
        out.extend(rng.sample(lines, len(lines)))
    return '\n'.join(out)[:200_000]


def test_mlm_masking_statistics(masking_text):
    tok = build_tokenizer('char', 'mlm', masking_text)
    ids = torch.tensor(tok.encode(masking_text, add_special_tokens=False))
    masker = MLMMasker(tok)
    # 1,500 segments of 64 (<cls> + 62 text + <sep>), the last rows shortened so that they are padded
    starts = torch.arange(1500) * 62
    starts[-50:] = len(ids) - 30
    segments, attention = mlm_segments(ids, starts, 64, tok)
    assert (segments[:, 0] == tok.cls_token_id).all()
    assert (segments[-1, 31] == tok.sep_token_id) and (segments[-1, 32:] == tok.pad_token_id).all() and not attention[-1, 32:].any()
    inputs, labels = masker(segments, torch.Generator().manual_seed(0))
    special = torch.isin(segments, torch.tensor(tok.all_special_ids))
    selected = labels != -100
    assert not (selected & special).any(), 'a special token was selected'
    assert torch.equal(inputs[special], segments[special]), 'a special token was changed'
    assert torch.equal(labels[selected], segments[selected])
    per_row = selected.sum(1).double() / (~special).sum(1)
    assert (per_row - 0.15).abs().max() < 0.5 / 30 + 1e-9  # exactly round(15 %) of every row's text tokens
    n = selected.sum().item()
    as_mask = (inputs[selected] == tok.mask_token_id).sum().item() / n
    kept = (inputs[selected] == segments[selected]).sum().item() / n
    other = 1 - as_mask - kept
    assert abs(as_mask - 0.8) < 0.01 and abs(kept - 0.1) < 0.01 and abs(other - 0.1) < 0.01, (as_mask, kept, other)
    replaced = selected & (inputs != tok.mask_token_id) & (inputs != segments)
    assert (inputs[replaced] < tok.vocab_size - len(tok.all_special_ids)).all(), 'random replacement by a special'
    # unselected positions are untouched; same seed -> same masks
    assert torch.equal(inputs[~selected], segments[~selected])
    again, again_labels = masker(segments, torch.Generator().manual_seed(0))
    assert torch.equal(again, inputs) and torch.equal(again_labels, labels)


def test_unigram_baseline_by_hand():
    # training tokens: 0 x3, 1 x1 (num_base 3: add-one counts 4, 2, 1 -> p = 4/7, 2/7, 1/7)
    train_ids = torch.tensor([0, 0, 0, 1])
    x = torch.tensor([[9, 9, 5, 9]])  # inputs (9 = <mask>)
    y = torch.tensor([[0, 2, -100, 1]])
    res = unigram_mlm_baseline(train_ids, [(x, None, y)], base_ids=torch.arange(3), mask_id=9)
    assert res['predicted_token_id'] == 0 and res['tokens'] == 3
    assert res['masked_acc'] == pytest.approx(100 / 3)
    assert res['loss'] == pytest.approx(-(math.log(4 / 7) + math.log(1 / 7) + math.log(2 / 7)) / 3)


def _lrs(steps, warmup, sched, min_ratio=0.):
    """The LR of every update of a text run's schedule (timm's scheduler, stepped per update as the trainer does)."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.)
    scheduler, _ = create_lr_scheduler(optimizer, lm_schedule(1., steps, warmup, sched, min_ratio))
    lrs = []
    for step in range(steps):
        lrs.append(optimizer.param_groups[0]['lr'])
        scheduler.step_update(step + 1)
    return lrs


def test_lr_schedule_shapes():
    # warmup rises linearly from lr / warmup; then constant, cosine towards min_lr_ratio x lr, linear towards 0
    assert _lrs(6, 4, 'constant') == pytest.approx([0.25, 0.4375, 0.625, 0.8125, 1., 1.])
    cos, lin = _lrs(10, 2, 'cosine', 0.1), _lrs(10, 2, 'linear')
    assert cos[:2] == lin[:2] == pytest.approx([0.5, 0.75])
    assert all(a > b for a, b in zip(cos[2:], cos[3:])) and 0.1 < cos[-1] < 0.15
    assert lin[2:] == pytest.approx([1 - t / 10 for t in range(2, 10)])  # timm's poly (power 1) over all steps


# ------------------------------------------------------------------------------------------------ DDP
def test_ddp_two_processes_gloo(tiny_text, tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    env['PYTHONPATH'] = os.pathsep.join([str(REPO)] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
           '-m', 'mlp_vision.train_text'] + TINY_GPT + COMMON + [
        '--task', 'causal', '--train-file', tiny_text, '--steps', '6', '-b', '4', '--eval-interval', '3',
        '--eval-batches', '3', '--final-eval-batches', '5', '--device', 'cpu',
        '--output', str(tmp_path), '--experiment', 'ddp']
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'x 2 processes (gloo)' in proc.stdout
    res = json.loads((tmp_path / 'ddp' / 'results.json').read_text())
    assert res['world_size'] == 2 and res['tokens_per_step'] == 2 * 4 * 32
    digests = res['weights_sha256_per_rank']
    assert len(digests) == 2 and digests[0] == digests[1]
    # the sharded evaluation (5 batches over 2 ranks) equals a one-process evaluation of the saved model
    model = mt.from_pretrained(str(tmp_path / 'ddp' / 'pretrained'))
    tok = model.tokenizer
    text = Path(tiny_text).read_text()
    ids = torch.tensor(tok.encode(text[int(len(text) * 0.9):], add_special_tokens=False))
    batches = subset_batches(causal_eval_batches(ids, 32, 4), 5, 42)
    one = text_lm.evaluate_lm(model, batches, task='causal', device=torch.device('cpu'))
    assert one['loss'] == pytest.approx(res['val_final']['loss'], rel=1e-5) and one['tokens'] == 5 * 4 * 32


def _children(pid: int) -> list:
    return [int(p.name) for p in Path('/proc').iterdir() if p.name.isdigit() and _parent(p) == pid]


def _parent(proc: Path) -> int:
    try:
        return int((proc / 'stat').read_text().rsplit(')', 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


@pytest.mark.slow
@pytest.mark.skipif(not Path('/proc/self/stat').exists(), reason='finds the worker processes in /proc')
def test_ddp_sigterm_to_one_rank_stops_every_rank_inside_a_long_update(tiny_text, tmp_path):
    """SIGTERM to one of two ranks during an update of a million micro-batches: the ranks agree at the update's next
    agreement (a few seconds away, at the same micro-batch on both), abandon it, save step 0 and exit 143; without
    the agreement inside the update they would run for hours, and a rank acting alone would leave the other in a
    collective."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    env['PYTHONPATH'] = os.pathsep.join([str(REPO)] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
           '-m', 'mlp_vision.train_text'] + TINY_GPT + COMMON + [
        '--task', 'causal', '--train-file', tiny_text, '--steps', '2', '-b', '2', '--grad-accum-steps', '1000000',
        '--device', 'cpu', '--output', str(tmp_path), '--experiment', 'term']
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith('Task causal'):  # both ranks hold their signal handlers (a collective came before)
                break
        workers = _children(proc.pid)
        assert len(workers) == 2, seen
        os.kill(max(workers), signal.SIGTERM)  # one rank only, not torchrun (which would signal both)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = ''.join(seen) + out
    # rank 0 stops with the one line (whichever rank got the signal); torchrun reports its exit status 143 (and may
    # SIGTERM the other rank, whose handler is spent after one signal, while it exits)
    assert 'error: interrupted by SIGTERM at step 0; the resumable checkpoint is' in out, out[-3000:]
    assert 'rank      : 0 (local_rank: 0)\n  exitcode  : 143' in out, out[-3000:]
    assert _state(tmp_path / 'term' / 'last.pth')['step'] == 0


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_inputs(tiny_text, tmp_path):
    base = COMMON + ['--steps', '2', '-b', '2', '--output', str(tmp_path)]

    def err(*argv):
        with pytest.raises(SystemExit) as e:
            text_train.main(base + list(argv))
        assert e.value.code == 2
        return e.value.message

    ok = ['--train-file', tiny_text]
    assert 'does not exist' in err(*TINY_GPT, '--train-file', str(tmp_path / 'missing.txt'))
    empty = tmp_path / 'empty.txt'
    empty.write_text('  \n\n')
    assert 'is empty' in err(*TINY_GPT, '--train-file', str(empty))
    assert 'no training text file given' in err(*TINY_GPT)
    msg = err(*TINY_GPT, *ok, '--block-size', '64')
    assert 'larger than the model\'s maximum length 32' in msg and 'max_position_embeddings=64' in msg
    msg = err('--model', 'no_such_model', *ok)
    assert 'unknown text model' in msg and 'gpt_sdpa' in msg
    msg = err(*TINY_GMLP, *ok, '--task', 'causal')
    assert 'is a masked_lm model' in msg and 'gpt_mlp_attention' in msg
    assert 'vocab_size' in err(*TINY_GPT, 'vocab_size=100', *ok)
    short = tmp_path / 'short.txt'
    short.write_text('To be, or not to be: that is the question.\n')
    assert 'fewer than one block' in err(*TINY_GPT, '--train-file', str(short))
    binary = tmp_path / 'binary.txt'
    binary.write_bytes(b'\xff\xfe\x00 not text')
    assert 'not UTF-8' in err(*TINY_GPT, '--train-file', str(binary))
    msg = err(*TINY_GPT, '--train-file', str(short), '--val-file', str(short), '--block-size', '8',
              '--sample-prompt', 'Zounds')
    assert "--sample-prompt has character 'Z'" in msg
    msg = err(*TINY_GPT, '--train-file', tiny_text, '--sample-prompt', 'ROMEO:', '--task', 'mlm')
    assert '--sample-prompt needs --task causal' in msg
    vision_ckpt = tmp_path / 'vision.pth'
    torch.save({'arch': 'smlpnet_t', 'state_dict': {}, 'optimizer': {}}, vision_ckpt)
    assert 'is a checkpoint of the image trainer' in err(*TINY_GPT, *ok, '--resume', str(vision_ckpt))
    assert '--stop-after-step must be' in err(*TINY_GPT, *ok, '--stop-after-step', '9')
    bad_kwargs = err('--model', 'gpt_sdpa', '--model-kwargs', 'hidden_size=30', 'num_attention_heads=4', *ok)
    assert 'cannot build gpt_sdpa' in bad_kwargs and 'not divisible' in bad_kwargs


def test_threads_flag_does_not_leak_into_the_caller(tmp_path):
    # an in-process run with --threads 1 must leave the caller's thread count as it was (a later in-process
    # computation, e.g. another test's reference run, would otherwise silently run single-threaded)
    path = tmp_path / 'tiny.txt'
    path.write_text('to be or not to be, that is the question. ' * 200)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        text_train.main(COMMON + TINY_GPT + [
            '--task', 'causal', '--train-file', str(path), '--block-size', '16', '--steps', '2', '-b', '2',
            '--eval-interval', '2', '--eval-batches', '1', '--output', str(tmp_path), '--experiment', 'threads'])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before


# ------------------------------------------------------------------------------------------------ the moved command
def test_the_models_import_nothing_of_the_trainers():
    code = ('import sys, mlp_vision.text, mlp_vision.text.fill_mask, mlp_vision.text.registry; '
            'print([m for m in sys.modules if m.startswith("mlp_vision.training")])')
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == '[]', res.stderr


def test_error_lines_start_with_the_name_the_command_was_run_as(capsys):
    for prog in ('mlp-vision-text-train', 'python -m mlp_vision.train_text'):
        with pytest.raises(SystemExit):
            text_train.main(['--steps', '0'], prog=prog)
        assert capsys.readouterr().err.strip() == f'{prog}: error: --steps must be >= 1, got 0'
