""" mlp_vision.train_text on transformers.Trainer (causal / masked LM): learning on real text, the output folder
through the Auto classes and pipelines, exact resume, the stops Trainer lacks (SIGTERM, NaN loss), MLM masking,
2-process gloo DDP and the clear errors for bad input.

Learning is measured on real text, Tiny Shakespeare and WikiText-2 from ``../shared/data`` (those tests skip with
the path when it is absent); the behaviour tests run on a small text each test writes itself. The models are tiny
(tens of thousands of parameters) and run on one CPU thread.
"""
import json
import math
import os
import pickle
import random
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer, Trainer, pipeline

import mlp_vision.text as mt
import mlp_vision.train_text as text_train
from mlp_vision.errors import UsageError
from mlp_vision.text.training_data import LMBlocks, MaskedBlocks, build_tokenizer

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
COMMON = ['--threads', '1', '--log-interval', '1000', '--device', 'cpu']


def _need(path: Path) -> str:
    if not path.exists():
        pytest.skip(f'needs {path} (the shared data folder ../shared/data beside the repository)')
    return str(path)


def _words_text(path: Path, lines: int, seed: int = 0) -> str:
    """Generated text (a fixed word list in a seeded random order), written to ``path``."""
    words = ('the of and to in is was for on that with as by at from his her it an be are this which or had not but '
             'king queen lord night day love death sword crown house, say: speak! well? come go thee thou').split()
    rng = random.Random(seed)
    path.write_text('\n'.join(' '.join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(lines)))
    return str(path)


@pytest.fixture(scope='module')
def tiny_text(tmp_path_factory):
    """About 20 kB of generated text."""
    return _words_text(tmp_path_factory.mktemp('text') / 'tiny.txt', 500)


@pytest.fixture(scope='module')
def small_text(tmp_path_factory):
    """About 2 kB: a few training batches per epoch, so a short run crosses epochs."""
    return _words_text(tmp_path_factory.mktemp('text') / 'small.txt', 50, seed=1)


def _log(folder: Path, key: str) -> list:
    state = json.loads((folder / 'trainer_state.json').read_text())
    return [(row['step'], row[key]) for row in state['log_history'] if key in row]


def _weights(folder: Path) -> dict:
    return load_file(str(folder / 'model.safetensors'))


def _error(argv, code: int = 2) -> str:
    with pytest.raises(SystemExit) as e:
        text_train.main(argv)
    assert e.value.code == code, e.value
    assert '\n' not in e.value.message
    return e.value.message


# ------------------------------------------------------------------------------------------------ learning
def test_causal_lm_learns_tiny_shakespeare(tmp_path):
    shakespeare = _need(SHAKESPEARE)
    res = text_train.main(TINY_GPT + COMMON + [
        '--task', 'causal', '--train-file', shakespeare, '--val-fraction', '0.02', '--steps', '200', '-b', '16',
        '--lr', '3e-3', '--sched', 'cosine', '--warmup-steps', '20', '--eval-interval', '100', '--eval-batch-size',
        '128', '--output', str(tmp_path), '--experiment', 'gpt'])
    exp = tmp_path / 'gpt'
    evals = _log(exp, 'eval_loss')
    # uniform over 65 characters is ln 65 = 4.17 nats; a 1-layer, 32-wide model gets well below 2.9 in 200 steps
    assert [s for s, _ in evals] == [100, 200] and res['eval_loss'] < 2.9 and res['eval_loss'] < evals[0][1]
    assert res['eval_ppl'] == pytest.approx(math.exp(res['eval_loss']))
    assert json.loads((exp / 'eval_results.json').read_text())['eval_loss'] == res['eval_loss']
    tok = AutoTokenizer.from_pretrained(str(exp))
    assert len(tok) == 65  # the papers' Tiny Shakespeare vocabulary
    model, weights = AutoModelForCausalLM.from_pretrained(str(exp)), _weights(exp)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    out = pipeline('text-generation', model=str(exp))('ROMEO:', max_new_tokens=20, do_sample=False)
    assert out[0]['generated_text'].startswith('ROMEO:') and len(out[0]['generated_text']) == 26


@pytest.mark.slow
def test_mlm_learns_wikitext_and_beats_unigram(tmp_path):
    train_file, val_file = _need(WIKITEXT / 'valid.txt'), _need(WIKITEXT / 'test.txt')
    res = text_train.main(TINY_GMLP + COMMON + [
        '--task', 'mlm', '--train-file', train_file, '--val-file', val_file, '--steps', '300', '-b', '16',
        '--lr', '3e-3', '--warmup-steps', '20', '--eval-interval', '300', '--eval-batch-size', '256',
        '--output', str(tmp_path), '--experiment', 'mlm'])
    # the unigram baseline: every masked character predicted from the training text's character frequencies
    train, val = Counter(Path(train_file).read_text()), Path(val_file).read_text()
    total = sum(train.values()) + len(set(val) | set(train))
    unigram = -sum(math.log((train[c] + 1) / total) for c in val) / len(val)
    assert res['eval_loss'] < unigram - 0.1, (res['eval_loss'], unigram)


# ------------------------------------------------------------------------------------------------ outputs
def test_mlm_folder_loads_with_auto_classes_fill_mask_and_init_from(tiny_text, tmp_path):
    text_train.main(TINY_GMLP + COMMON + ['--task', 'mlm', '--tokenizer', 'byte', '--train-file', tiny_text,
                                          '--steps', '6', '-b', '4', '--eval-interval', '3', '--output', str(tmp_path),
                                          '--experiment', 'mlm'])
    exp = tmp_path / 'mlm'
    assert sorted(p.name for p in exp.glob('checkpoint-*')) == ['checkpoint-3', 'checkpoint-6']
    final, last = _weights(exp), _weights(exp / 'checkpoint-6')  # the final weights, at the top of the run folder
    assert final.keys() == last.keys() and all(torch.equal(final[k], last[k]) for k in final)
    model = AutoModelForMaskedLM.from_pretrained(str(exp))
    assert type(model).__name__ == 'GMLPForMaskedLM' and len(AutoTokenizer.from_pretrained(str(exp))) == 260
    preds = pipeline('fill-mask', model=str(exp))('the kin<mask> and queen', top_k=3)
    ids = model.tokenizer('the kin<mask> and queen', split_special_tokens=False, return_tensors='pt')['input_ids']
    with torch.no_grad():
        logits = model.eval()(ids).logits[0, ids[0] == model.tokenizer.mask_token_id][0]
    assert [p['token'] for p in preds] == logits.topk(3).indices.tolist()


# ------------------------------------------------------------------------------------------------ resume and stops
def _run(args, tmp_path, name, extra=()):
    return text_train.main(args + COMMON + ['--output', str(tmp_path), '--experiment', name, *extra])


@pytest.mark.parametrize('task,model', [('causal', TINY_GPT), ('mlm', TINY_GMLP), ('mlm', TINY_BIGS)],
                         ids=['causal-gpt', 'mlm-amlp', 'mlm-bigs'])
def test_resume_equals_uninterrupted_run(task, model, small_text, tmp_path):
    # 14 updates of 8 blocks cross two epochs of the ~40 training blocks; dropout and the MLM masks are random
    args = model + ['--task', task, '--train-file', small_text, '--val-fraction', '0.2', '--block-size', '16',
                    '--steps', '14', '-b', '8', '--eval-interval', '5', '--warmup-steps', '3', '--sched', 'cosine']
    _run(args, tmp_path, 'whole')
    assert _run(args, tmp_path, 'parts', ['--stop-after-step', '10']) is None
    assert not (tmp_path / 'parts' / 'model.safetensors').exists()
    res = text_train.main(args + COMMON + ['--resume', str(tmp_path / 'parts')])  # the run folder: its latest
    whole, parts = _weights(tmp_path / 'whole'), _weights(tmp_path / 'parts')
    assert all(torch.equal(whole[k], parts[k]) for k in whole)
    assert res['eval_loss'] == json.loads((tmp_path / 'whole' / 'eval_results.json').read_text())['eval_loss']


def _on_step(monkeypatch, step: int, act):
    """Trainer.training_step calls ``act(loss)`` on its ``step``-th call (1-based) and returns what it gives."""
    calls = []
    original = Trainer.training_step

    def training_step(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        calls.append(1)
        return act(loss) if len(calls) == step else loss
    monkeypatch.setattr(Trainer, 'training_step', training_step)


def test_sigterm_saves_a_checkpoint_and_resume_is_exact(small_text, tmp_path, monkeypatch):
    args = TINY_GMLP + ['--task', 'mlm', '--train-file', small_text, '--block-size', '16', '--steps', '9', '-b', '8',
                        '--eval-interval', '4']
    _run(args, tmp_path, 'whole')
    with monkeypatch.context() as m:
        _on_step(m, 6, lambda loss: (signal.raise_signal(signal.SIGTERM), loss)[1])
        msg = _error(args + COMMON + ['--output', str(tmp_path), '--experiment', 'stopped'], code=128 + 15)
    ckpt = tmp_path / 'stopped' / 'checkpoint-6'
    assert f'interrupted by SIGTERM: checkpoint {ckpt} saved; continue with --resume {ckpt}' in msg
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the command's handler is gone
    text_train.main(args + COMMON + ['--resume', str(ckpt)])
    whole, resumed = _weights(tmp_path / 'whole'), _weights(tmp_path / 'stopped')
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def test_nan_loss_stops_and_names_the_last_checkpoint(small_text, tmp_path, monkeypatch):
    _on_step(monkeypatch, 7, lambda loss: loss * float('nan'))
    msg = _error(TINY_GPT + COMMON + ['--task', 'causal', '--train-file', small_text, '--block-size', '16',
                                      '--steps', '9', '-b', '8', '--eval-interval', '5', '--output', str(tmp_path),
                                      '--experiment', 'nan'], code=1)
    last = tmp_path / 'nan' / 'checkpoint-5'
    assert f'loss is not finite (NaN / inf) at step 7; the last checkpoint kept: {last}' in msg and '--lr' in msg
    assert sorted(p.name for p in (tmp_path / 'nan').iterdir()) == ['checkpoint-5']  # nothing saved after the NaN


def test_resume_refuses_a_checkpoint_file_that_would_run_code(small_text, tmp_path):
    args = TINY_GPT + COMMON + ['--task', 'causal', '--train-file', small_text, '--block-size', '16', '-b', '8',
                                '--eval-interval', '2']
    text_train.main(args + ['--steps', '4', '--stop-after-step', '2', '--output', str(tmp_path), '--experiment', 'r'])
    marker = tmp_path / 'ran'

    class Payload:
        def __reduce__(self):
            return os.system, (f'touch {marker}',)
    ckpt = tmp_path / 'r' / 'checkpoint-2'
    (ckpt / 'rng_state.pth').write_bytes(pickle.dumps(Payload(), protocol=2))
    msg = _error(args + ['--steps', '4', '--resume', str(ckpt)])
    assert 'rng_state.pth' in msg and 'refused' in msg and not marker.exists()


# ------------------------------------------------------------------------------------------------ masking
def test_mlm_masking_statistics_and_masks_fixed_per_seed_epoch_and_block(tiny_text):
    text = Path(tiny_text).read_text() * 10
    tok = build_tokenizer('char', 'mlm', text)
    blocks = LMBlocks(torch.tensor(tok.encode(text, add_special_tokens=False)), 64, 'mlm', tok, 'text')
    segments = torch.stack([b['input_ids'] for b in blocks])
    assert (segments[:, 0] == tok.cls_token_id).all() and (segments[:, -1] == tok.sep_token_id).all()
    data = MaskedBlocks(blocks, tok, 0.15, seed=3)
    inputs, labels = data.mask(segments, torch.Generator().manual_seed(0))
    special = torch.isin(segments, torch.tensor(tok.all_special_ids))
    selected = labels != -100
    assert not (selected & special).any() and torch.equal(inputs[special], segments[special])
    assert torch.equal(labels[selected], segments[selected]) and torch.equal(inputs[~selected], segments[~selected])
    per_row = selected.sum(1).double() / (~special).sum(1)
    assert (per_row - 0.15).abs().max() < 0.5 / 62 + 1e-9  # exactly round(15 %) of every row's text tokens
    n = selected.sum().item()
    as_mask = (inputs[selected] == tok.mask_token_id).sum().item() / n
    kept = (inputs[selected] == segments[selected]).sum().item() / n
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.02, (as_mask, kept)
    first = [data[i]['input_ids'] for i in range(5)]
    assert all(torch.equal(a, data[i]['input_ids']) for i, a in enumerate(first))  # read again: the same masks
    data.epoch = 1
    assert not all(torch.equal(a, data[i]['input_ids']) for i, a in enumerate(first))  # a new epoch: new masks


# ------------------------------------------------------------------------------------------------ distributed
@pytest.mark.slow
def test_ddp_two_processes_gloo(tiny_text, tmp_path):
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', '29531',
           '-m', 'mlp_vision.train_text', *TINY_GMLP, *COMMON, '--task', 'mlm', '--tokenizer', 'wordpiece',
           '--vocab-size', '120', '--train-file', tiny_text, '--steps', '6', '-b', '4', '--eval-interval', '3',
           '--output', str(tmp_path), '--experiment', 'ddp']
    env = {**os.environ, 'PYTHONPATH': str(REPO), 'OMP_NUM_THREADS': '1'}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    exp = tmp_path / 'ddp'
    state = json.loads((exp / 'checkpoint-6' / 'trainer_state.json').read_text())
    # both ranks ran every update on one vocabulary (rank 0's, sent to rank 1): 2 x 4 blocks per update
    assert state['global_step'] == 6 and state['train_batch_size'] == 4
    assert len(AutoTokenizer.from_pretrained(str(exp))) == mt.from_pretrained(str(exp)).config.vocab_size
    assert all(torch.isfinite(v).all() for v in _weights(exp).values())


def _children(pid: int) -> list:
    """The ids of the processes whose parent is ``pid`` (from /proc)."""
    found = []
    for proc in Path('/proc').iterdir():
        try:
            if proc.name.isdigit() and int((proc / 'stat').read_text().rsplit(')', 1)[1].split()[1]) == pid:
                found.append(int(proc.name))
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            continue
    return found


TORCHRUN_TEXT = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2',
                 '-m', 'mlp_vision.train_text']
DDP_STOP_ARGS = [*TINY_GPT, *COMMON, '--task', 'causal', '--block-size', '16', '-b', '2', '--steps', '60',
                 '--eval-interval', '50', '--log-interval', '1']


def _sigterm_one_rank_of_two(argv: list, env: dict) -> str:
    """Starts a two-rank gloo run of ``argv``, sends SIGTERM to one rank (not torchrun, which would signal both) once
    rank 0 printed the first update's loss (both ranks are then in the loop, their handlers set); returns the output."""
    proc = subprocess.Popen(TORCHRUN_TEXT + argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "{'loss'" in line:
                break
        workers = _children(proc.pid)
        assert len(workers) == 2, ''.join(seen)[-3000:]
        os.kill(max(workers), signal.SIGTERM)
        out = ''.join(seen) + proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path('/proc/self/stat').exists(), reason='finds the worker processes in /proc')
def test_ddp_sigterm_to_one_rank_stops_both_at_one_update_and_resume_completes(small_text, tmp_path):
    """SIGTERM to one of two gloo ranks mid-run: the ranks agree at the end of the update (RunStops), both save
    and stop at that step -- one checkpoint-N, the one error line naming it, both ranks ended -- and ``--resume`` of
    it runs the remaining updates to the end."""
    args = [*DDP_STOP_ARGS, '--train-file', small_text]
    env = {**os.environ, 'PYTHONPATH': str(REPO), 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    out = _sigterm_one_rank_of_two(args + ['--output', str(tmp_path), '--experiment', 'term'], env)
    exp = tmp_path / 'term'
    checkpoints = sorted(exp.glob('checkpoint-*'))
    assert len(checkpoints) == 1, (checkpoints, out[-3000:])  # the stop's checkpoint only, saved once
    ckpt = checkpoints[0]
    step = json.loads((ckpt / 'trainer_state.json').read_text())['global_step']
    assert ckpt.name == f'checkpoint-{step}' and 1 <= step < 50
    assert out.count('error: interrupted by SIGTERM') == 1, out[-3000:]  # reported once, by rank 0
    assert f'checkpoint {ckpt} saved; continue with --resume {ckpt}' in out, out[-3000:]
    # torchrun's failure report: both ranks ended, neither left waiting in a collective; the first to exit did so with
    # 128 + 15, the other with 143 of its own, or by torchrun's SIGTERM once it saw the first exit (after its report)
    assert sorted(re.findall(r'exitcode  : (-?\d+)', out)) in (['143', '143'], ['-15', '143']), out[-3000:]
    res = subprocess.run(TORCHRUN_TEXT + args + ['--resume', str(ckpt)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    state = json.loads((exp / 'trainer_state.json').read_text())
    assert state['global_step'] == 60 and (exp / 'eval_results.json').is_file()
    assert all(torch.isfinite(v).all() for v in _weights(exp).values())


SLOW_RANK_0_SAVE = """
import os, time
if os.environ.get('RANK') == '0':  # the workers only: torchrun's agent has no RANK
    from transformers import Trainer
    save = Trainer._save_optimizer_and_scheduler

    def slow_save(self, output_dir):  # a slow disk: longer than torchrun waits after SIGTERM before SIGKILL (30 s)
        time.sleep(float(os.environ['SLOW_SAVE_S']))
        save(self, output_dir)
        open(os.environ['SLOW_SAVE_DONE'], 'w').close()
    Trainer._save_optimizer_and_scheduler = slow_save
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path('/proc/self/stat').exists(), reason='finds the worker processes in /proc')
def test_ddp_sigterm_no_rank_exits_before_the_slow_save_of_rank_0_is_written(small_text, tmp_path):
    """The stop's checkpoint is whole though rank 0 takes longer to write it than torchrun waits after SIGTERM: had
    rank 1 exited after its own share, torchrun would SIGTERM rank 0 and SIGKILL it 30 s later, mid-save."""
    inject = tmp_path / 'inject'
    inject.mkdir()
    (inject / 'sitecustomize.py').write_text(SLOW_RANK_0_SAVE)
    env = {**os.environ, 'PYTHONPATH': f'{inject}{os.pathsep}{REPO}', 'OMP_NUM_THREADS': '1',
           'PYTHONUNBUFFERED': '1', 'SLOW_SAVE_S': '35', 'SLOW_SAVE_DONE': str(inject / 'done')}
    out = _sigterm_one_rank_of_two([*DDP_STOP_ARGS, '--train-file', small_text, '--output', str(tmp_path),
                                    '--experiment', 'term'], env)
    assert (inject / 'done').is_file(), out[-3000:]  # the slow save ran (and ended)
    checkpoints = sorted((tmp_path / 'term').glob('checkpoint-*'))
    assert len(checkpoints) == 1, (checkpoints, out[-3000:])
    ckpt = checkpoints[0]
    written = {f.name for f in ckpt.iterdir()}
    assert {'trainer_state.json', 'optimizer.pt', 'scheduler.pt', 'rng_state_0.pth', 'rng_state_1.pth'} <= written, (
        written, out[-3000:])
    assert out.count(f'error: interrupted by SIGTERM: checkpoint {ckpt} saved') == 1, out[-3000:]
    assert 'forcefully exiting' not in out, out[-3000:]  # no rank needed torchrun's SIGKILL


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_inputs(tiny_text, tmp_path):
    base = COMMON + ['--steps', '2', '-b', '2', '--output', str(tmp_path)]

    def err(*argv):
        return _error(base + list(argv))
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
    assert '--stop-after-step must be' in err(*TINY_GPT, *ok, '--stop-after-step', '9')
    assert '--val-fraction must be' in err(*TINY_GPT, *ok, '--val-fraction', '1.5')
    assert '--init-from is for --task classify' in err(*TINY_GPT, *ok, '--init-from', str(tmp_path))
    bad_kwargs = err('--model', 'gpt_sdpa', '--model-kwargs', 'hidden_size=30', 'num_attention_heads=4', *ok)
    assert 'cannot build gpt_sdpa' in bad_kwargs and 'not divisible' in bad_kwargs
    assert 'is not a folder' in err(*TINY_GPT, *ok, '--resume', str(tmp_path / 'nothing'))
    assert 'holds no checkpoint-N/' in err(*TINY_GPT, *ok, '--resume', str(tmp_path))
    (tmp_path / 'taken').mkdir()
    (tmp_path / 'taken' / 'keep.txt').write_text('a file of another run')
    assert 'exists already' in err(*TINY_GPT, *ok, '--experiment', 'taken')
    assert (tmp_path / 'taken' / 'keep.txt').read_text() == 'a file of another run'


def test_a_recipe_file_gives_flag_values_that_the_command_line_overrides(tmp_path):
    args = text_train.parse_args(['-c', str(REPO / 'configs' / 'text' / 'bigs_masked_lm.yaml'), '--lr', '1e-3'])
    assert (args.lr, args.weight_decay, args.opt_betas, args.sched) == (1e-3, 0.05, [0.9, 0.98], 'cosine')
    (tmp_path / 'bad.yaml').write_text('banana: 1\n')
    with pytest.raises(UsageError, match="unknown key 'banana'"):
        text_train.parse_args(['-c', str(tmp_path / 'bad.yaml')])


def test_threads_flag_does_not_leak_into_the_caller(small_text, tmp_path):
    # an in-process run with --threads 1 must leave the caller's thread count as it was
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _run(TINY_GPT + ['--task', 'causal', '--train-file', small_text, '--block-size', '16', '--steps', '2', '-b',
                         '2', '--eval-interval', '2'], tmp_path, 'threads')
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_models_import_nothing_of_the_trainers():
    code = ('import sys, mlp_vision.text, mlp_vision.text.registry; '
            'print([m for m in sys.modules if m in ("mlp_vision.image_data", "mlp_vision.image_model", '
            '"mlp_vision.run_files", "mlp_vision.train", "mlp_vision.train_text")])')
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == '[]', res.stderr


def test_error_lines_start_with_the_name_the_command_was_run_as(capsys):
    for prog in ('mlp-vision-text-train', 'python -m mlp_vision.train_text'):
        with pytest.raises(SystemExit):
            text_train.main(['--steps', '0'], prog=prog)
        assert capsys.readouterr().err.strip() == f'{prog}: error: --steps must be >= 1, got 0'
