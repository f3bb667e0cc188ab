""" Fill-mask with transformers' ``pipeline('fill-mask')`` on an official-BiGS-layout folder and on the run folders of
the text trainer (every tokenizer kind), and from_official picking up the folder's tokenizer and config.json.

The official folder is made here: a tiny random BiGS written in the official key layout as ``pytorch_model.bin``
(torch pickle of tensors), an official-style ``config.json`` and a BERT ``vocab.txt``.
"""
import json
import random
import re

import pytest
import torch
from transformers import pipeline

import mlp_vision.text as mt
from mlp_vision.errors import UsageError
from mlp_vision.text.bigs import _EMBEDDING_KEYS, _LAYER_KEYS, _MLM_KEYS, from_official_folder

VOCAB = ['[PAD]', '[unused0]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'movie', 'was', 'good', 'bad', '.',
         'film', 'great', 'boring', 'a', 'un', '##able', 'is', 'and']


def official_state_dict(model: mt.BiGSForMaskedLM) -> dict:
    """Our BiGS masked LM in the official key layout (the inverse of convert_official_bigs_state_dict)."""
    ours = model.state_dict()
    sd = {theirs: ours[mine] for theirs, mine in {**_EMBEDDING_KEYS, **_MLM_KEYS}.items()}
    for i in range(model.config.num_hidden_layers):
        for theirs, mine in _LAYER_KEYS.items():
            sd[f'bigs.encoder.layer.{i}.{theirs}'] = ours[f'bigs.layers.{i}.{mine}']
    sd['cls.predictions.decoder.weight'] = sd['bigs.embeddings.word_embeddings.weight']
    sd['cls.predictions.decoder.bias'] = sd['cls.predictions.bias']
    sd['bigs.embeddings.position_ids'] = torch.arange(model.config.max_position_embeddings)[None]
    return sd


def make_official_folder(path, favourite='good', seed=0):
    """A tiny official-layout BiGS folder whose MLM strongly prefers ``favourite``; returns our equivalent model."""
    torch.manual_seed(seed)
    model = mt.create_model('bigs_small', vocab_size=len(VOCAB), pad_token_id=0, hidden_size=16,
                            intermediate_size=24, num_hidden_layers=2, num_ssm_states=4, max_position_embeddings=32)
    with torch.no_grad():
        model.output_bias[VOCAB.index(favourite)] = 8.0
    path.mkdir(parents=True, exist_ok=True)
    torch.save(official_state_dict(model), path / 'pytorch_model.bin')
    config = {'architectures': ['BiGSForMaskedLM'], 'model_type': 'BiGS', 'vocab_size': len(VOCAB),
              'hidden_size': 16, 'num_hidden_layers': 2, 'intermediate_size': 24, 'max_position_embeddings': 32,
              'type_vocab_size': 2, 'num_ssm': 4, 'hidden_dropout_prob': 0.0, 'layer_norm_eps': 1e-12,
              'pad_token_id': 0, 'initializer_range': 0.02, 'classifier_dropout': None, 'hidden_act': 'gelu',
              'pooler_type': 'non_padding_mean'}
    (path / 'config.json').write_text(json.dumps(config))
    (path / 'vocab.txt').write_text('\n'.join(VOCAB) + '\n')
    return model.eval()


def test_from_official_folder_brings_its_tokenizer(tmp_path):
    ref = make_official_folder(tmp_path / 'BiGS')
    model = mt.BiGSForMaskedLM.from_official(str(tmp_path / 'BiGS')).eval()
    tok = model.tokenizer
    assert mt.tokenizer_kind(tok) == 'subword' and tok.init_kwargs['do_lower_case'] and tok.mask_token_id == 5
    assert model.config.hidden_dropout_prob == 0.0 and model.config.pad_token_id == 0  # from config.json
    enc = tok('The movie was good .', return_tensors='pt')
    assert enc['input_ids'].tolist() == [[3, 6, 7, 8, 9, 11, 4]]
    with torch.no_grad():
        torch.testing.assert_close(model(**enc).logits, ref(**enc).logits, rtol=0, atol=1e-6)
    # a config.json of other weights is refused
    cfg = json.loads((tmp_path / 'BiGS' / 'config.json').read_text())
    (tmp_path / 'BiGS' / 'config.json').write_text(json.dumps({**cfg, 'hidden_size': 1024}))
    with pytest.raises(ValueError, match='hidden_size=1024 but the weights have 16'):
        mt.BiGSForMaskedLM.from_official(str(tmp_path / 'BiGS'))


def test_fill_mask_pipeline_on_official_folder(tmp_path):
    ref = make_official_folder(tmp_path / 'BiGS')
    model = mt.BiGSForMaskedLM.from_official(str(tmp_path / 'BiGS'))
    fill = pipeline('fill-mask', model=model, tokenizer=model.tokenizer, top_k=3)
    results = fill('The movie was [MASK] . A [MASK] film')
    # the same numbers computed directly: uncased ids, <cls> ... <sep>, softmax at the mask positions
    ids = torch.tensor([[3, 6, 7, 8, 5, 11, 15, 5, 12, 4]])
    with torch.no_grad():
        probs = ref(ids).logits[0, [4, 7]].softmax(-1)
    assert len(results) == 2
    for row, p in zip(results, probs):
        top = p.topk(3)
        assert [r['token'] for r in row] == top.indices.tolist()
        assert [r['token_str'] for r in row] == [VOCAB[i] for i in top.indices.tolist()]
        torch.testing.assert_close(torch.tensor([r['score'] for r in row]), top.values, rtol=1e-5, atol=1e-6)
    assert results[0][0]['token_str'] == 'good' and results[0][0]['score'] > 0.9  # make_official_folder's favourite


def test_official_folder_tokenizer_regex_needs_the_opt_in(tmp_path):
    """An official BiGS folder whose tokenizer.json holds a regex: refused (one line naming the file and the opt-in)
    by every loader, read with allow_regex=True (--allow-regex on the command line)."""
    folder = tmp_path / 'BiGS'
    make_official_folder(folder)
    payload = json.loads(mt.load_tokenizer(str(folder)).backend_tokenizer.to_str())
    payload['pre_tokenizer'] = {'type': 'Sequence', 'pretokenizers': [
        {'type': 'Split', 'pattern': {'Regex': '(a+)+$'}, 'behavior': 'Isolated', 'invert': False},
        payload['pre_tokenizer']]}
    (folder / 'tokenizer.json').write_text(json.dumps(payload))
    for cls in (mt.BiGSForMaskedLM, mt.BiGSForSequenceClassification):
        with pytest.raises(UsageError, match=re.escape(f"{folder / 'tokenizer.json'}: pre_tokenizer.pretokenizers[0]"
                                                       f".pattern is the regular expression")) as e:
            cls.from_official(str(folder))
        assert '--allow-regex' in str(e.value)
    model = mt.BiGSForMaskedLM.from_official(str(folder), allow_regex=True)
    assert pipeline('fill-mask', model=model, tokenizer=model.tokenizer)('The movie was [MASK] .')[0]['token_str'] \
        == 'good'
    model = mt.BiGSForSequenceClassification.from_official(str(folder), allow_regex=True)
    assert model.tokenizer is not None and len(model.tokenizer) == len(VOCAB)


@pytest.mark.parametrize('kind', ['char', 'byte', 'wordpiece', 'bpe'])
def test_fill_mask_pipeline_on_trained_folders(kind, tmp_path):
    """pipeline('fill-mask', model=FOLDER) on the run folder of the text trainer, for every tokenizer it trains:
    the pipeline's top token at each mask is our model's argmax there, and its scores our softmax."""
    import mlp_vision.train_text as text_train
    words = 'the of and to in is was king queen lord night day love death sword crown house'.split()
    rng = random.Random(0)
    (tmp_path / 'train.txt').write_text('\n'.join(' '.join(rng.choice(words) for _ in range(8)) for _ in range(300)))
    text_train.main([
        '--task', 'mlm', '--model', 'amlp_base', '--model-kwargs', 'num_hidden_layers=1', 'hidden_size=16',
        'intermediate_size=32', 'tiny_attention_size=8', 'max_position_embeddings=32', '--tokenizer', kind,
        '--vocab-size', '300', '--train-file', str(tmp_path / 'train.txt'), '--steps', '2', '-b', '4',
        '--eval-interval', '2', '--threads', '1', '--device', 'cpu', '--log-interval', '1000',
        '--output', str(tmp_path), '--experiment', kind])
    folder = str(tmp_path / kind)
    model = mt.from_pretrained(folder).eval()
    tok = model.tokenizer
    text = f'the king and {tok.mask_token} queen {tok.mask_token}'
    got = pipeline('fill-mask', model=folder)(text, top_k=2)
    ids = tok(text, split_special_tokens=False, return_tensors='pt')['input_ids']
    with torch.no_grad():
        probs = model(ids).logits[0, ids[0] == tok.mask_token_id].softmax(-1)
    assert len(got) == len(probs) == 2
    for row, p in zip(got, probs):
        top = p.topk(2)
        assert [r['token'] for r in row] == top.indices.tolist()
        torch.testing.assert_close(torch.tensor([r['score'] for r in row]), top.values, rtol=1e-5, atol=1e-6)


def test_a_folder_that_is_neither_layout_is_one_line_from_both_commands(tmp_path, capsys):
    """A folder without our config.json whose weights file is not an official checkpoint (random bytes; a pickle that
    would run code): the official loader and the text trainer's --init-from both stop with the one line naming the folder."""
    import os
    import pickle
    import mlp_vision.train_text as text_train
    from _helpers import exits_with_one_line
    marker = tmp_path / 'payload-ran'

    class Payload:
        def __reduce__(self):  # unpickling it would create the marker file
            return (open, (str(marker), 'w'))

    for name, content in (('random', os.urandom(64)), ('pickle', pickle.dumps(Payload()))):
        folder = tmp_path / name
        folder.mkdir()
        (folder / 'pytorch_model.bin').write_bytes(content)
        with pytest.raises(UsageError, match=f'^{folder} is neither a save_pretrained folder nor an official BiGS'):
            from_official_folder(mt.BiGSForMaskedLM, str(folder), str(folder))
        data = tmp_path / 'train.tsv'
        data.write_text('sentence\tlabel\n' + 'a good film\t1\na bad film\t0\n' * 4)
        msg = exits_with_one_line(text_train.main, [
            '--task', 'classify', '--train-file', str(data), '--val-file', str(data), '--init-from', str(folder),
            '--steps', '1', '--output', str(tmp_path / 'out'), '--experiment', name], capsys)
        assert f'--init-from {folder} is neither a save_pretrained folder nor an official BiGS folder' in msg
    assert not marker.exists()
