""" --task classify of mlp_vision.train_text (mlp_vision/training/tasks/text_classification.py): learning a toy sentiment task made
here, sentence pairs, GLUE's metrics against scikit-learn, --init-from a tiny MLM run / its pretrained folder / an
official-BiGS-layout folder (the log lists loaded vs new weights; the encoder equals the MLM run's), and the
one-line errors for bad files. One slow test fine-tunes on ../shared/data/rt-polarity (skipped without it).
"""
import json
import random
from pathlib import Path

import pytest
import torch

import mlp_vision.train_text as text_train
from mlp_vision.training.tasks.text_classification import (
    classification_metrics, collate, encode_examples, init_classifier, label_ids, read_labelled_file)
from mlp_vision.text.tokenizer import byte_tokenizer, tokenizer_to_dict

TINY_BERT = ['--model', 'bert_small', '--model-kwargs', 'num_hidden_layers=2', 'hidden_size=32',
             'intermediate_size=64', 'num_attention_heads=2', 'max_position_embeddings=64']
TINY_GMLP = ['--model', 'gmlp_base', '--model-kwargs', 'num_hidden_layers=2', 'hidden_size=32',
             'intermediate_size=64', 'max_position_embeddings=64']
COMMON = ['--threads', '1', '--log-interval', '1000']

FILLER = 'the movie was a film plot actor story it and this that very quite really scene'.split()
POSITIVE, NEGATIVE = 'good great fine nice'.split(), 'bad awful poor dull'.split()


def _toy(path: Path, n: int, seed: int, pair: bool = False, sep: str = '\t') -> Path:
    """Sentences of filler words with one sentiment word; label 1 = positive. Pairs: label 1 when both halves
    carry the same sentiment."""
    rng = random.Random(seed)

    def sentence(y):
        w = [rng.choice(FILLER) for _ in range(rng.randint(3, 8))]
        w.insert(rng.randint(0, len(w)), rng.choice(POSITIVE if y else NEGATIVE))
        return ' '.join(w)

    rows = ['sentence1\tsentence2\tlabel' if pair else 'sentence\tlabel']
    for _ in range(n):
        y = rng.randint(0, 1)
        if pair:
            a = rng.randint(0, 1)
            rows.append(f'{sentence(a)}\t{sentence(a if y else 1 - a)}\t{y}')
        else:
            rows.append(f'{sentence(y)}\t{y}')
    path.write_text('\n'.join(r.replace('\t', sep) for r in rows) + '\n')
    return path


@pytest.fixture(scope='module')
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp('toy')
    return str(_toy(d / 'train.tsv', 400, 0)), str(_toy(d / 'dev.tsv', 100, 1))


def _run(args, out, name):
    return text_train.main(COMMON + ['--task', 'classify', '--output', str(out), '--experiment', name] + args)


def _error(args, out) -> str:
    with pytest.raises(SystemExit) as e:
        _run(args, out, 'bad')
    assert e.value.code != 0
    return e.value.message


# ------------------------------------------------------------------------------------------------ learning
def test_learns_toy_sentiment_and_keeps_best(toy, tmp_path):
    train, dev = toy
    res = _run(TINY_BERT + ['--train-file', train, '--val-file', dev, '--steps', '100', '-b', '16', '--lr', '5e-3',
                            '--eval-interval', '25', '--test-file', dev], tmp_path, 'toy')
    majority = res['data']['dev_majority_acc']
    assert 50. <= majority <= 65.
    assert res['val_best']['acc'] >= 80. >= majority + 15.
    exp = Path(res['experiment_dir'])
    rows = [line.split(',') for line in (exp / 'summary.csv').read_text().splitlines()]
    header = rows[0]
    for col in ('val_acc', 'val_f1', 'val_mcc', 'val_loss', 'train_loss'):
        assert col in header
    accs = [float(r[header.index('val_acc')]) for r in rows[1:]]
    assert len(accs) == 4 and res['val_best']['acc'] == pytest.approx(max(accs))
    best = torch.load(exp / 'model_best.pth', weights_only=True)
    assert best['metric'] == pytest.approx(max(accs)) and best['label_names'] == ['0', '1']
    # pretrained/ holds the best model: it reproduces the best dev accuracy
    from mlp_vision.text import from_pretrained
    model = from_pretrained(str(exp / 'pretrained')).eval()
    assert json.loads((exp / 'pretrained' / 'labels.json').read_text())['label_names'] == ['0', '1']
    data = read_labelled_file(dev)
    ids, types = encode_examples(model.tokenizer, data, 64)
    labels = torch.tensor([int(x) for x in data.labels])
    with torch.no_grad():
        preds = model(**{k: v for k, v in collate(ids, types, labels, model.tokenizer.pad_token_id, True).items()
                         if k != 'labels'}).logits.argmax(-1)
    assert classification_metrics(preds, labels, 2)['acc'] == pytest.approx(res['val_best']['acc'])
    assert res['init']['kind'] == 'none'
    # --test-file is scored by the best checkpoint: on the dev file itself it repeats the best dev numbers
    for k in ('acc', 'f1', 'mcc', 'loss'):
        assert res['test'][k] == pytest.approx(res['val_best'][k]), k
    assert res['test_file'] == dev


def test_metrics_equal_scikit_learn():
    sk = pytest.importorskip('sklearn.metrics')
    g = torch.Generator().manual_seed(0)
    for k in (2, 3):
        y = torch.randint(0, k, (200,), generator=g)
        p = torch.where(torch.rand(200, generator=g) < 0.6, y, torch.randint(0, k, (200,), generator=g))
        m = classification_metrics(p, y, k)
        assert m['acc'] == pytest.approx(100 * sk.accuracy_score(y, p))
        assert m['f1'] == pytest.approx(100 * sk.f1_score(y, p, average='binary' if k == 2 else 'macro'))
        assert m['mcc'] == pytest.approx(100 * sk.matthews_corrcoef(y, p))
    y = torch.tensor([0, 1, 1, 0]), torch.zeros(4, dtype=torch.long)  # constant predictions: MCC 0, F1 0
    m = classification_metrics(y[1], y[0], 2)
    assert (m['acc'], m['f1'], m['mcc']) == (50., 0., 0.) == (
        100 * sk.accuracy_score(y[0], y[1]), 100 * sk.f1_score(y[0], y[1], zero_division=0),
        100 * sk.matthews_corrcoef(y[0], y[1]))


# ------------------------------------------------------------------------------------------------ pairs, files
def test_pairs_detected_encoded_with_token_types_and_trained(tmp_path):
    train, dev = _toy(tmp_path / 'train.tsv', 64, 0, pair=True), _toy(tmp_path / 'dev.tsv', 16, 1, pair=True)
    data = read_labelled_file(str(train))
    assert data.text_columns == ('sentence1', 'sentence2') and len(data.pairs) == len(data.texts) == 64
    tok = byte_tokenizer()
    ids, types = encode_examples(tok, data, 24)  # truncated to 24 tokens, longest first
    assert max(len(r) for r in ids) == 24
    for r, t, a, b in zip(ids, types, data.texts, data.pairs):
        n_first = min(len(a.encode()), 24) + 2
        assert r[0] == tok.cls_token_id and r.count(tok.sep_token_id) == 2 and r[-1] == tok.sep_token_id
        assert t == [0] * (r.index(tok.sep_token_id) + 1) + [1] * (len(r) - r.index(tok.sep_token_id) - 1)
        assert r.index(tok.sep_token_id) + 1 <= n_first
    batch = collate(ids[:3], types[:3], torch.tensor([0, 1, 0]), tok.pad_token_id, True)
    assert batch['attention_mask'].sum(1).tolist() == [len(r) for r in ids[:3]]
    assert (batch['input_ids'][batch['attention_mask'] == 0] == tok.pad_token_id).all()
    res = _run(TINY_BERT + ['--tokenizer', 'byte', '--train-file', str(train), '--val-file', str(dev), '--steps', '2',
                            '-b', '8', '--block-size', '48'], tmp_path, 'pairs')
    assert res['data']['text_columns'] == ['sentence1', 'sentence2'] and res['val_final']['examples'] == 16


def test_csv_named_columns_and_string_labels(tmp_path):
    (tmp_path / 'train.csv').write_text('id,question,sentence,gold\n1,"is it good, really?",yes it is,entailment\n'
                                        '2,why,"because, well",not_entailment\n3,a,b,entailment\n')
    (tmp_path / 'dev.csv').write_text('id,question,sentence,gold\n1,x,y,not_entailment\n')
    data = read_labelled_file(str(tmp_path / 'train.csv'), ['question', 'sentence'], 'gold')
    assert data.texts[0] == 'is it good, really?' and data.pairs[1] == 'because, well'
    dev = read_labelled_file(str(tmp_path / 'dev.csv'), ['question', 'sentence'], 'gold')
    assert label_ids(data.labels, dev.labels) == ['entailment', 'not_entailment']
    assert label_ids(['10', '9', '2', '9'], ['2']) == ['2', '9', '10']  # numeric labels sort as numbers


# ------------------------------------------------------------------------------------------------ --init-from
@pytest.fixture(scope='module')
def mlm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp('mlm')
    corpus = out / 'corpus.txt'
    rng = random.Random(0)
    corpus.write_text('\n'.join(' '.join(rng.choice(FILLER + POSITIVE + NEGATIVE) for _ in range(10))
                                for _ in range(200)))
    res = text_train.main(COMMON + TINY_GMLP + ['--task', 'mlm', '--tokenizer', 'byte', '--train-file', str(corpus),
                                                '--steps', '4', '-b', '4', '--block-size', '32', '--eval-batches', '1',
                                                '--output', str(out), '--experiment', 'mlm'])
    return Path(res['experiment_dir'])


@pytest.mark.parametrize('which', ['last.pth', 'pretrained'])
def test_init_from_mlm_run_loads_encoder(mlm_run, toy, tmp_path, which):
    train, dev = toy
    mlm = torch.load(mlm_run / 'last.pth', weights_only=True)['state_dict']
    model, family, tok, report = init_classifier(str(mlm_run / which), 'ignored', {}, 2)
    assert family == 'gmlp' and tokenizer_to_dict(tok) == tokenizer_to_dict(byte_tokenizer())
    assert report.new == ['classifier.weight', 'classifier.bias']
    # the MLM head: its output bias (and in a training checkpoint the tied decoder, the embedding under its 2nd name)
    assert 'output_bias' in report.unused and set(report.unused) <= {'output_bias', 'decoder.weight'}
    sd = model.state_dict()
    assert set(report.loaded) == set(sd) - set(report.new) and report.loaded
    for k in report.loaded:
        assert torch.equal(sd[k], mlm[k]), k
    # the CLI logs the same report, and the classifier trains from there
    res = _run(['--init-from', str(mlm_run / which), '--train-file', train, '--val-file', dev, '--steps', '1',
                '-b', '8', '--block-size', '32'], tmp_path, 'ft')
    log = (Path(res['experiment_dir']) / 'train.log').read_text()
    assert 'Weights from ' in log and 'new 2: classifier.weight, classifier.bias' in log
    assert res['init']['loaded'] == report.loaded and res['family'] == 'gmlp'


def test_init_from_with_classifier_pooling(mlm_run, toy, tmp_path):
    """--model-kwargs classifier_pooling=mean changes how a pretrained encoder is read (no weight changes shape); an
    unknown pooling stops with one line and writes no run folder."""
    model, _, _, report = init_classifier(str(mlm_run / 'pretrained'), 'ignored', {'classifier_pooling': 'mean'}, 2)
    assert model.config.classifier_pooling == 'mean' and report.new == ['classifier.weight', 'classifier.bias']
    train, dev = toy
    msg = _error(['--init-from', str(mlm_run / 'pretrained'), '--train-file', train, '--val-file', dev,
                  '--model-kwargs', 'classifier_pooling=max'], tmp_path)
    assert "classifier_pooling must be one of ('cls', 'mean'), got 'max'" in msg and '\n' not in msg, msg
    assert not (tmp_path / 'bad').exists()


def test_init_from_official_bigs_folder(tmp_path, toy):
    from test_fill_mask import VOCAB, make_official_folder
    ours = make_official_folder(tmp_path / 'official')
    model, family, tok, report = init_classifier(str(tmp_path / 'official'), '', {}, 2)
    assert family == 'bigs' and tok.vocab_size == len(VOCAB)
    # the folder made by the test has no bigs.pooler.dense (real official ones do: then only the classifier is new)
    assert report.new == ['pooler.dense.weight', 'pooler.dense.bias', 'classifier.weight', 'classifier.bias']
    assert 'cls.predictions.bias' in report.unused
    sd, ref = model.state_dict(), ours.state_dict()
    for k in report.loaded:
        assert torch.equal(sd[k], ref[k]), k


def test_init_from_official_bigs_folder_cli(tmp_path, toy):
    from test_fill_mask import make_official_folder
    make_official_folder(tmp_path / 'official')
    train, dev = toy
    res = _run(['--init-from', str(tmp_path / 'official'), '--train-file', train, '--val-file', dev, '--steps', '1',
                '-b', '8', '--block-size', '32'], tmp_path, 'bigs')
    assert res['init']['kind'] == 'official BiGS' and res['family'] == 'bigs'


# ------------------------------------------------------------------------------------------------ errors
def test_bad_input_stops_with_one_line(toy, tmp_path):
    train, dev = toy
    base = TINY_BERT + ['--steps', '1', '-b', '4']
    (tmp_path / 'empty.tsv').write_text('')
    (tmp_path / 'header.tsv').write_text('sentence\tlabel\n')
    (tmp_path / 'ragged.tsv').write_text('sentence\tlabel\nfine film\t1\nno label here\n')
    (tmp_path / 'cols.tsv').write_text('text\ttarget\nfine film\t1\n')
    (tmp_path / 'dev3.tsv').write_text('sentence\tlabel\nfine film\t2\n')
    cases = {
        str(tmp_path / 'empty.tsv'): 'is empty',
        str(tmp_path / 'header.tsv'): 'has a header but no examples',
        str(tmp_path / 'ragged.tsv'): 'line 3 has 1 fields, the header has 2',
        str(tmp_path / 'cols.tsv'): '--text-columns',
        str(tmp_path / 'missing.tsv'): 'does not exist',
    }
    for path, expected in cases.items():
        msg = _error(base + ['--train-file', path, '--val-file', dev], tmp_path)
        assert expected in msg and '\n' not in msg, (path, msg)
    msg = _error(base + ['--train-file', train, '--val-file', str(tmp_path / 'dev3.tsv')], tmp_path)
    assert "labels ['2']" in msg and "training labels: ['0', '1']" in msg
    msg = _error(base + ['--train-file', train, '--val-file', dev, '--test-file', str(tmp_path / 'dev3.tsv')],
                 tmp_path)
    assert "--test-file has labels ['2']" in msg and "training labels: ['0', '1']" in msg
    msg = _error(base + ['--train-file', train, '--val-file', dev, '--label-column', 'gold'], tmp_path)
    assert "no column 'gold'" in msg
    msg = _error(base + ['--train-file', train], tmp_path)
    assert 'needs --val-file' in msg
    msg = _error(['--model', 'gpt_sdpa', '--train-file', train, '--val-file', dev], tmp_path)
    assert 'has no sequence classifier' in msg
    msg = _error(['--init-from', str(tmp_path / 'nothing'), '--train-file', train, '--val-file', dev], tmp_path)
    assert 'does not exist' in msg


def test_scratch_model_with_a_pretrained_runs_tokenizer(mlm_run, toy, tmp_path):
    """--tokenizer-from: a from-scratch classifier fed with another run's vocabulary (the study's control arm)."""
    train, dev = toy
    pretrained = str(mlm_run / 'pretrained')
    res = _run(TINY_BERT + ['--tokenizer-from', pretrained, '--train-file', train, '--val-file', dev, '--steps', '4',
                            '--eval-interval', '4', '-b', '8', '--block-size', '32'], tmp_path, 'scratch_tok')
    saved = json.loads((Path(res['experiment_dir']) / 'results.json').read_text())
    assert saved['init']['kind'] == 'none'  # no weights loaded: a model trained from scratch
    # the run's byte vocabulary, not the default --tokenizer char alphabet of the TSV
    assert saved['tokenizer'] == {'type': 'byte', 'vocab_size': mt_load_tokenizer(pretrained).vocab_size}
    msg = _error(['--tokenizer-from', pretrained, '--init-from', pretrained, '--train-file', train,
                  '--val-file', dev], tmp_path)
    assert '--tokenizer-from is for a model trained from scratch' in msg


def mt_load_tokenizer(path):
    from mlp_vision.text import load_tokenizer
    return load_tokenizer(path)


# ------------------------------------------------------------------------------------------------ --freeze-embeddings
def test_freeze_embeddings_keeps_the_pretrained_token_embedding(mlm_run, toy, tmp_path):
    """--freeze-embeddings: the fine-tuned model's token embedding is exactly the pretrained one while the encoder
    and classifier moved; resuming the run without the flag stops with one line (its optimizer state lacks them)."""
    train, dev = toy
    mlm = torch.load(mlm_run / 'last.pth', weights_only=True)['state_dict']
    args = ['--init-from', str(mlm_run / 'last.pth'), '--train-file', train, '--val-file', dev, '--steps', '6',
            '-b', '8', '--block-size', '32', '--lr', '1e-2', '--eval-interval', '3', '--freeze-embeddings']
    res = _run(args, tmp_path, 'frozen')
    exp = Path(res['experiment_dir'])
    tuned = torch.load(exp / 'last.pth', weights_only=True)['state_dict']
    assert torch.equal(tuned['gmlp.embed.weight'], mlm['gmlp.embed.weight'])
    moved = [k for k in mlm if k in tuned and k != 'gmlp.embed.weight' and not torch.equal(tuned[k], mlm[k])]
    assert len(moved) > 10, moved
    assert 'M of them fixed (--freeze-embeddings)' in (exp / 'train.log').read_text()
    # without the flag the same run trains the embedding
    res = _run(args[:-1], tmp_path, 'trained')
    tuned = torch.load(Path(res['experiment_dir']) / 'last.pth', weights_only=True)['state_dict']
    assert not torch.equal(tuned['gmlp.embed.weight'], mlm['gmlp.embed.weight'])
    with pytest.raises(SystemExit) as e:
        text_train.main(COMMON + ['--resume', str(exp / 'last.pth'), '--steps', '9', '--no-freeze-embeddings'])
    msg = e.value.message
    assert 'was trained with --freeze-embeddings; resume it the same way' in msg and '\n' not in msg, msg


# ------------------------------------------------------------------------------------------------ --model-ema
def test_model_ema_is_averaged_resumed_evaluated_and_exported(toy, tmp_path):
    """--model-ema: after each update EMA = d * EMA + (1 - d) * weights (checked across a stop / resume); the
    EMA's dev accuracy picks model_best.pth, the raw weights' goes to raw_val_acc, and pretrained/ and --test-file
    are the best checkpoint's EMA weights."""
    from safetensors.torch import load_file
    train, dev = toy
    d = 0.8
    args = TINY_GMLP + ['--train-file', train, '--val-file', dev, '--test-file', dev, '--steps', '6', '-b', '8',
                        '--block-size', '32', '--lr', '1e-2', '--eval-interval', '2', '--model-ema',
                        '--model-ema-decay', str(d)]
    first = _run(args + ['--stop-after-step', '4'], tmp_path, 'ema')
    last = Path(first['last'])
    at4 = torch.load(last, weights_only=True)
    text_train.main(COMMON + ['--resume', str(last), '--stop-after-step', '5'])
    at5 = torch.load(last, weights_only=True)
    assert at5['step'] == 5 and at4['step'] == 4
    for k, ema5 in at5['state_dict_ema'].items():
        if ema5.is_floating_point():
            expected = d * at4['state_dict_ema'][k] + (1 - d) * at5['state_dict'][k]
            assert torch.allclose(ema5, expected, atol=1e-6), k
    assert any(not torch.equal(at5['state_dict_ema'][k], at5['state_dict'][k]) for k in at5['state_dict'])
    res = text_train.main(COMMON + ['--resume', str(last)])
    exp = Path(res['experiment_dir'])
    best = torch.load(exp / 'model_best.pth', weights_only=True)
    header, *rows = [line.split(',') for line in (exp / 'summary.csv').read_text().splitlines()]
    accs = [float(r[header.index('val_acc')]) for r in rows]
    assert 'raw_val_acc' in header and len(accs) == 3 and best['metric'] == pytest.approx(max(accs))
    exported = load_file(exp / 'pretrained' / 'model.safetensors')
    assert all(torch.equal(exported[k], best['state_dict_ema'][k]) for k in exported)
    assert any(not torch.equal(exported[k], best['state_dict'][k]) for k in exported)
    # the test file is the dev file: the exported (EMA) weights repeat the best EMA dev numbers
    assert res['test']['acc'] == pytest.approx(res['val_best']['acc']) == pytest.approx(best['metric'])
    assert res['model_ema']['decay'] == d
    assert 'weight EMA decay 0.8' in (exp / 'train.log').read_text()


def test_model_ema_errors(toy, tmp_path):
    train, dev = toy
    for extra, expected in ((['--model-ema-decay', '1.0'], '--model-ema-decay must be in [0, 1), got 1.0'),
                            (['--task', 'mlm'], '--model-ema is implemented for --task classify, not --task mlm')):
        msg = _error(TINY_GMLP + ['--train-file', train, '--val-file', dev, '--model-ema'] + extra, tmp_path)
        assert expected in msg and '\n' not in msg, msg
    assert not (tmp_path / 'bad').exists()
