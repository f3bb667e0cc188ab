""" Masked-LM pretraining with a subword vocabulary trained by the text trainer (issue 13.1). """
import random
from pathlib import Path

import pytest
import torch

import mlp_vision.text as mt
import mlp_vision.train_text as text_train
from mlp_vision.text.training_data import MaskedBlocks, build_tokenizer

TINY_BIGS = ['--model', 'bigs_small', '--model-kwargs', 'hidden_size=32', 'intermediate_size=64', 'num_hidden_layers=1',
             'num_ssm_states=8', 'max_position_embeddings=32']


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    """Generated English-like text (a fixed word list in a seeded order), made by the test itself."""
    words = ('the movie was good bad great awful and a story of love with actors who play their parts well '
             'but plot is thin slow funny boring moving').split()
    rng = random.Random(0)
    lines = [' '.join(rng.choice(words) for _ in range(rng.randint(5, 14))) + ' .' for _ in range(600)]
    path = tmp_path_factory.mktemp('corpus') / 'corpus.txt'
    path.write_text('\n'.join(lines) + '\n')
    return str(path)


def test_masker_never_draws_a_special_token_from_a_subword_vocabulary(corpus):
    """Subword vocabularies put their specials first ([PAD] 0 ... [MASK] 4): random replacements avoid them."""
    tok = build_tokenizer('wordpiece', 'mlm', Path(corpus).read_text(), vocab_size=120)
    specials = set(tok.all_special_ids)
    assert min(specials) == 0
    masker = MaskedBlocks([], tok, rate=0.5, seed=0, mask_prob=0., random_prob=1.)  # every selected one randomised
    ids = torch.tensor(tok.encode(Path(corpus).read_text()[:3000], add_special_tokens=False))[:600].view(20, 30)
    out, labels = masker.mask(ids, torch.Generator().manual_seed(0))
    replaced = labels != -100
    assert replaced.sum() > 100
    assert not any(int(t) in specials for t in out[replaced])
    assert set(masker.base_ids.tolist()) == set(range(tok.vocab_size)) - specials


@pytest.mark.parametrize('kind', ['wordpiece', 'bpe'])
def test_mlm_pretraining_with_a_trained_subword_vocabulary(corpus, tmp_path, kind):
    vocab_size = 300 if kind == 'bpe' else 120
    res = text_train.main(TINY_BIGS + [
        '--task', 'mlm', '--train-file', corpus, '--tokenizer', kind, '--vocab-size', str(vocab_size),
        '--block-size', '32', '--steps', '30', '-b', '8', '--lr', '3e-3', '--warmup-steps', '3',
        '--eval-interval', '15', '--threads', '1', '--device', 'cpu', '--output', str(tmp_path), '--experiment', kind])
    model = mt.from_pretrained(str(tmp_path / kind))
    tok = model.tokenizer  # the trained vocabulary was saved beside the weights and reloads with them
    assert tok.vocab_size == model.config.vocab_size <= vocab_size
    text = 'the movie was good .'
    assert tok.decode(tok.encode(text, add_special_tokens=False)).replace(' .', '.') == text.replace(' .', '.')
    # the loss went down from the uniform guess over the vocabulary
    assert res['eval_loss'] < torch.log(torch.tensor(float(tok.vocab_size))).item()


def test_mlm_pretraining_with_sparse_prediction_and_a_shared_vocabulary(corpus, tmp_path):
    """``--tokenizer-from``: a second pretraining run takes the first's vocabulary exactly (WordPiece training is not
    reproducible run to run); ``sparse_prediction=true`` trains to the same losses as the dense head (the head is
    per-token, so decoding only the scored positions changes nothing but the cost)."""
    common = ['--task', 'mlm', '--train-file', corpus, '--block-size', '32', '--steps', '12', '-b', '8', '--lr',
              '3e-3', '--warmup-steps', '3', '--eval-interval', '6', '--threads', '1', '--device', 'cpu',
              '--output', str(tmp_path), '--seed', '3']
    text_train.main(TINY_BIGS + common + ['--tokenizer', 'wordpiece', '--vocab-size', '120', '--experiment', 'first'])
    shared = str(tmp_path / 'first')
    dense = text_train.main(TINY_BIGS + common + ['--tokenizer-from', shared, '--experiment', 'dense'])
    sparse = text_train.main(TINY_BIGS + ['sparse_prediction=True'] + common
                             + ['--tokenizer-from', shared, '--experiment', 'sparse'])
    sparse_model = mt.from_pretrained(str(tmp_path / 'sparse'))
    assert sparse_model.config.sparse_prediction
    for run in ('dense', 'sparse'):
        assert mt.load_tokenizer(str(tmp_path / run)).backend_tokenizer.to_str() == \
            mt.load_tokenizer(shared).backend_tokenizer.to_str()
    assert sparse['eval_loss'] == pytest.approx(dense['eval_loss'], rel=1e-4)
    # a path without a tokenizer, or one without the mask token a masked LM needs: one clear line, no training
    for bad, expected in ((['--tokenizer-from', str(tmp_path / 'nowhere')], 'does not exist'),
                          (['--tokenizer-from', str(tmp_path / 'first' / 'config.json')], 'holds no tokenizer'),
                          (['--tokenizer-from', str(tmp_path / 'first' / 'checkpoint-12' / 'optimizer.pt')],
                           'holds no tokenizer'),
                          # an unparsed 'false' is a true string: it must stop the run, not switch the option on
                          (['--model-kwargs', *TINY_BIGS[3:], 'sparse_prediction=false'], 'must be a bool')):
        with pytest.raises(SystemExit) as e:
            text_train.main(TINY_BIGS + common + bad + ['--experiment', 'bad'])
        assert e.value.code != 0 and expected in str(e.value.message)
    assert not (tmp_path / 'bad').exists()
