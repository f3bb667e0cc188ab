""" --task classify of mlp_vision.train_text (transformers.Trainer; data: mlp_vision/text/labelled_data.py):
learning a toy sentiment task made here and keeping the best checkpoint, the output folder through
AutoModelForSequenceClassification and the text-classification pipeline, sentence pairs, GLUE's metrics against
scikit-learn, --init-from a tiny MLM run's folder / an official-BiGS-layout folder (the encoder equals the MLM
run's, the head is new), --tokenizer-from, --freeze-embeddings and the one-line errors for bad files; and
learning real sentiment: Rotten Tomatoes polarity from ``../shared/data`` (skipped with the path when absent).
"""
import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding, pipeline

import mlp_vision.train_text as text_train
from mlp_vision.text import load_tokenizer
from mlp_vision.text.labelled_data import (
    classification_examples, classification_metrics, label_ids, read_labelled_file)
from mlp_vision.text.tokenizer import byte_tokenizer

REPO = Path(__file__).resolve().parents[1]
RT_POLARITY = REPO.parent / 'shared' / 'data' / 'rt-polarity'
TINY_BERT = ['--model', 'bert_small', '--model-kwargs', 'num_hidden_layers=2', 'hidden_size=32',
             'intermediate_size=64', 'num_attention_heads=2', 'max_position_embeddings=64']
TINY_GMLP = ['--model', 'gmlp_base', '--model-kwargs', 'num_hidden_layers=2', 'hidden_size=32',
             'intermediate_size=64', 'max_position_embeddings=64']
COMMON = ['--threads', '1', '--log-interval', '1000', '--device', 'cpu']

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
    assert e.value.code == 2 and '\n' not in e.value.message, e.value.message
    return e.value.message


# ------------------------------------------------------------------------------------------------ learning
def test_learns_toy_sentiment_and_keeps_best(toy, tmp_path):
    train, dev = toy
    res = _run(TINY_BERT + ['--train-file', train, '--val-file', dev, '--steps', '100', '-b', '16', '--lr', '5e-3',
                            '--eval-interval', '25', '--test-file', dev], tmp_path, 'toy')
    exp = tmp_path / 'toy'
    labels = [int(line.rsplit('\t', 1)[1]) for line in Path(dev).read_text().splitlines()[1:]]
    majority = 100. * max(labels.count(0), labels.count(1)) / len(labels)
    assert 50. <= majority <= 65. and res['eval_acc'] >= 80. >= majority + 15.
    state = json.loads((exp / 'checkpoint-100' / 'trainer_state.json').read_text())
    accs = [row['eval_acc'] for row in state['log_history'] if 'eval_acc' in row]
    assert len(accs) == 4 and state['best_metric'] == max(accs) == res['eval_acc']  # the best checkpoint's weights
    best = Path(state['best_model_checkpoint'])
    final = load_file(str(exp / 'model.safetensors'))
    assert all(torch.equal(v, load_file(str(best / 'model.safetensors'))[k]) for k, v in final.items())
    # --test-file is scored by the best weights: on the dev file itself it repeats the best dev numbers
    assert json.loads((exp / 'test_results.json').read_text())['test_acc'] == res['test_acc'] == res['eval_acc']
    # the folder: the Auto class, label names in the config, the pipeline's accuracy is the run's
    model = AutoModelForSequenceClassification.from_pretrained(str(exp))
    assert model.config.id2label == {0: '0', 1: '1'}
    texts = [line.rsplit('\t', 1)[0] for line in Path(dev).read_text().splitlines()[1:]]
    preds = pipeline('text-classification', model=str(exp))(texts)
    assert 100. * sum(int(p['label'] == str(y)) for p, y in zip(preds, labels)) / len(labels) == res['eval_acc']


@pytest.mark.slow
def test_learns_rt_polarity_from_scratch(tmp_path):
    """A one-layer gMLP (0.14 M parameters) from scratch on a WordPiece vocabulary of the training reviews, mean
    pooled, learns Rotten Tomatoes polarity: one epoch lifts dev accuracy about 14 points over the majority class
    (53.3 %; 67.9 % observed), and the training and dev losses go down."""
    train, dev = RT_POLARITY / 'train.tsv', RT_POLARITY / 'dev.tsv'
    if not (train.exists() and dev.exists()):
        pytest.skip(f'needs {RT_POLARITY} (the shared data folder ../shared/data beside the repository)')
    res = _run(['--model', 'gmlp_base', '--model-kwargs', 'num_hidden_layers=1', 'hidden_size=64',
                'intermediate_size=128', 'max_position_embeddings=64', 'classifier_pooling=mean',
                '--tokenizer', 'wordpiece', '--vocab-size', '2000', '--train-file', str(train), '--val-file', str(dev),
                '--block-size', '64', '--steps', '300', '-b', '32', '--lr', '3e-3', '--eval-interval', '100',
                '--log-interval', '50'], tmp_path, 'rt')
    labels = [line.rsplit('\t', 1)[1] for line in dev.read_text(encoding='utf-8').splitlines()[1:]]
    majority = 100. * max(labels.count('0'), labels.count('1')) / len(labels)
    assert res['eval_acc'] >= majority + 8., (res['eval_acc'], majority)
    log = json.loads((tmp_path / 'rt' / 'trainer_state.json').read_text())['log_history']
    losses = [row['loss'] for row in log if 'loss' in row]
    dev_losses = [row['eval_loss'] for row in log if 'eval_loss' in row and 'eval_acc' in row]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.05, losses
    assert dev_losses[-1] < dev_losses[0], dev_losses


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
    examples = classification_examples(tok, data, ['0', '1'], 24, with_token_types=True)  # 24 tokens, longest first
    ids, types = [e['input_ids'] for e in examples], [e['token_type_ids'] for e in examples]
    assert max(len(r) for r in ids) == 24
    for r, t, a, b in zip(ids, types, data.texts, data.pairs):
        n_first = min(len(a.encode()), 24) + 2
        assert r[0] == tok.cls_token_id and r.count(tok.sep_token_id) == 2 and r[-1] == tok.sep_token_id
        assert t == [0] * (r.index(tok.sep_token_id) + 1) + [1] * (len(r) - r.index(tok.sep_token_id) - 1)
        assert r.index(tok.sep_token_id) + 1 <= n_first
    batch = DataCollatorWithPadding(tok)(examples[:3])
    assert batch['attention_mask'].sum(1).tolist() == [len(r) for r in ids[:3]]
    assert (batch['input_ids'][batch['attention_mask'] == 0] == tok.pad_token_id).all()
    assert batch['token_type_ids'][0, :len(types[0])].tolist() == types[0]
    res = _run(TINY_BERT + ['--tokenizer', 'byte', '--train-file', str(train), '--val-file', str(dev), '--steps', '2',
                            '-b', '8', '--block-size', '48', '--eval-interval', '2'], tmp_path, 'pairs')
    assert 0 <= res['eval_acc'] <= 100 and (tmp_path / 'pairs' / 'model.safetensors').is_file()


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
    text_train.main(COMMON + TINY_GMLP + ['--task', 'mlm', '--tokenizer', 'byte', '--train-file', str(corpus),
                                          '--steps', '4', '-b', '4', '--block-size', '32', '--eval-interval', '4',
                                          '--output', str(out), '--experiment', 'mlm'])
    return out / 'mlm'


def test_init_from_mlm_run_loads_encoder(mlm_run, toy, tmp_path):
    train, dev = toy
    args = ['--init-from', str(mlm_run), '--train-file', train, '--val-file', dev, '--steps', '6', '-b', '8',
            '--block-size', '32', '--eval-interval', '3', '--lr', '1e-2']
    _run(args + ['--stop-after-step', '1'], tmp_path, 'first')  # checkpoint-1: one update from the MLM encoder
    mlm, first = load_file(str(mlm_run / 'model.safetensors')), load_file(str(tmp_path / 'first' / 'checkpoint-1' /
                                                                              'model.safetensors'))
    assert {k for k in first if k not in mlm} == {'classifier.weight', 'classifier.bias'}
    assert load_tokenizer(str(tmp_path / 'first' / 'checkpoint-1')).get_vocab() == byte_tokenizer().get_vocab()
    # --freeze-embeddings: the token embedding stays the pretrained one exactly while the rest moves
    _run(args + ['--freeze-embeddings'], tmp_path, 'frozen')
    tuned = load_file(str(tmp_path / 'frozen' / 'model.safetensors'))
    assert torch.equal(tuned['gmlp.embed.weight'], mlm['gmlp.embed.weight'])
    assert len([k for k in mlm if k in tuned and not torch.equal(tuned[k], mlm[k])]) > 10
    assert not torch.equal(first['gmlp.embed.weight'], mlm['gmlp.embed.weight'])  # without the flag it trains


def test_init_from_with_classifier_pooling(mlm_run, toy, tmp_path):
    """--model-kwargs classifier_pooling=mean changes how a pretrained encoder is read (no weight changes shape); an
    unknown pooling stops with one line and writes no run folder."""
    train, dev = toy
    _run(['--init-from', str(mlm_run), '--train-file', train, '--val-file', dev, '--model-kwargs',
          'classifier_pooling=mean', '--steps', '1', '-b', '8', '--block-size', '32'], tmp_path, 'mean')
    assert json.loads((tmp_path / 'mean' / 'config.json').read_text())['classifier_pooling'] == 'mean'
    msg = _error(['--init-from', str(mlm_run), '--train-file', train, '--val-file', dev,
                  '--model-kwargs', 'classifier_pooling=max'], tmp_path)
    assert "classifier_pooling must be one of ('cls', 'mean'), got 'max'" in msg
    assert not (tmp_path / 'bad').exists() or not any((tmp_path / 'bad').iterdir())


def test_init_from_official_bigs_folder(tmp_path, toy):
    from test_fill_mask import make_official_folder
    ours = make_official_folder(tmp_path / 'official')
    train, dev = toy
    _run(['--init-from', str(tmp_path / 'official'), '--train-file', train, '--val-file', dev, '--steps', '1',
          '-b', '8', '--block-size', '32', '--stop-after-step', '1', '--lr', '1e-12'], tmp_path, 'bigs')
    tuned, ref = load_file(str(tmp_path / 'bigs' / 'checkpoint-1' / 'model.safetensors')), ours.state_dict()
    encoder = [k for k in tuned if k in ref and k.startswith('bigs.layers')]
    assert encoder and all(torch.allclose(tuned[k], ref[k], atol=1e-6) for k in encoder)
    assert 'classifier.weight' in tuned


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
        assert expected in _error(base + ['--train-file', path, '--val-file', dev], tmp_path), path
    msg = _error(base + ['--train-file', train, '--val-file', str(tmp_path / 'dev3.tsv')], tmp_path)
    assert "labels ['2']" in msg and "training labels: ['0', '1']" in msg
    msg = _error(base + ['--train-file', train, '--val-file', dev, '--test-file', str(tmp_path / 'dev3.tsv')],
                 tmp_path)
    assert "--test-file has labels ['2']" in msg and "training labels: ['0', '1']" in msg
    assert "no column 'gold'" in _error(base + ['--train-file', train, '--val-file', dev, '--label-column', 'gold'],
                                        tmp_path)
    assert 'needs --val-file' in _error(base + ['--train-file', train], tmp_path)
    assert _error(base + ['--val-file', dev], tmp_path).endswith('no --train-file given')
    msg = _error(['--model', 'gpt_sdpa', '--train-file', train, '--val-file', dev], tmp_path)
    assert 'has no sequence classifier' in msg
    msg = _error(['--init-from', str(tmp_path / 'nothing'), '--train-file', train, '--val-file', dev], tmp_path)
    assert 'is not a folder' in msg
    msg = _error(base + ['--train-file', train, '--val-file', dev, '--block-size', '2'], tmp_path)
    assert 'leaves no room for text after the special tokens' in msg


def test_scratch_model_with_a_pretrained_runs_tokenizer(mlm_run, toy, tmp_path):
    """--tokenizer-from: a from-scratch classifier fed with another run's vocabulary (the study's control arm)."""
    train, dev = toy
    _run(TINY_BERT + ['--tokenizer-from', str(mlm_run), '--train-file', train, '--val-file', dev, '--steps', '2',
                      '--eval-interval', '2', '-b', '8', '--block-size', '32'], tmp_path, 'scratch_tok')
    # the run's byte vocabulary, not the default --tokenizer char alphabet of the TSV
    assert load_tokenizer(str(tmp_path / 'scratch_tok')).get_vocab() == load_tokenizer(str(mlm_run)).get_vocab()
    msg = _error(['--tokenizer-from', str(mlm_run), '--init-from', str(mlm_run), '--train-file', train,
                  '--val-file', dev], tmp_path)
    assert '--tokenizer-from is for a model trained from scratch' in msg
